"""Connections and channels: the AMQP session over the sans-IO protocol (gateway.amqp),
method handlers, publishing, channel state and permissions."""
