"""Compiled twins of mqgw's hot paths; ``storage.twins`` picks them or the pure modules."""
