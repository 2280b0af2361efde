"""Configuration: the settings model (flags > MQGW_* variables > TOML file > defaults,
settings.py), the sources that name where each value came from (sources.py), logging
(logging_setup.py) and the settings table of docs/configuration.md (reference.py)."""
