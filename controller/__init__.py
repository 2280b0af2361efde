"""The controller of broker groups (`mqgw controller`): who is master, at which epoch, with
which in-sync replicas, and the deterministic simulation that checks it.

- ``events``, ``actions``, ``decide``: the pure decision step (state + event -> actions).
- ``snapshot``, ``scripts``, ``apply``, ``service``: the I/O side on Redis.
- ``sim``: the deterministic failover simulation (`mqgw sim failover`).

What the controller shares with the brokers (the records, the broker side of the contract,
the failover timing, the keys and the broker's Redis calls) is ``meta.groups``: storage
depends on it without depending on the controller. docs/controller.md describes all of it.
"""
