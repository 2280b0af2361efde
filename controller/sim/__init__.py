"""The deterministic failover simulation (`mqgw sim failover`): the decision step and a
simulated apply against simulated brokers, Redis, clients, clocks and a faulty network.
run.py runs a seed; checks.py holds the invariants; faults.py the nemesis."""

DEFAULT_STEPS = 6000  # events per seed: about two storms and two calm windows
