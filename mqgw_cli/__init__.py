"""The ``mqgw`` command line."""
