"""Compiled twins of mqgw's hot paths; ``gateway.amqp.twins`` picks them or the pure modules."""
