"""The nemesis run (issue 30): faults on real hosts, from a seed, checked afterwards.

``plan``: the schedule of faults a seed gives (pure). The hosts it runs on are network
namespaces (tests/harness/hosts.py for now)."""
