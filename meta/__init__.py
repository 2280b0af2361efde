"""Metadata model (vhosts, users, exchanges, queues, bindings) and its stores."""
