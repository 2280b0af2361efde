"""Broker groups on Redis: the records the controller writes and the brokers and gateways
follow, the contract both sides keep (pure helpers), the failover timing they share, their
keys, and the calls a broker and a gateway make (``GroupLink``). The controller (which
decides) and storage (whose brokers follow) both depend on this; neither on the other."""
