"""The nemesis run (issue 30): faults on real hosts, from a seed, checked afterwards.

``plan``: the schedule of faults a seed gives (pure). ``hosts``: network namespaces on a
bridge, one per process."""
