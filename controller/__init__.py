"""The controller of broker groups (`mqgw controller`): who is master, at which epoch, with
which in-sync replicas, and the deterministic simulation that checks it.

- ``model``: the two records exchanged through Redis (the group record the controller writes,
  the heartbeat record a broker writes) and their Redis hash encoding.
- ``config``: timeouts and intervals, shared by the controller, brokers and the simulation.
- ``events``, ``actions``, ``decide``: the pure decision step (state + event -> actions).
- ``contract``: the broker side of the contract as pure helpers (standing, in-sync
  bookkeeping, the epoch-file common point) for the replication work to reuse.
- ``keys``, ``scripts``, ``apply``, ``service``, ``redis_link``: the I/O side on Redis.
- ``sim``: the deterministic failover simulation (`mqgw sim failover`).

docs/controller.md describes all of it.
"""
