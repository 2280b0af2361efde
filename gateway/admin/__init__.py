"""Admin HTTP API (FastAPI on the gateway's event loop)."""
