"""The network edge: listening sockets (IPv4/IPv6, SO_REUSEPORT) and TLS with live reload."""
