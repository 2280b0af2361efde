"""Cluster mode: the link to Redis metadata and the broker groups, metadata sync, placement."""
