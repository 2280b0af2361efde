"""A whole mqgw topology as local processes, behind `mqgw cluster up|status|stop|start|down`.

- ``layout``: what runs (names, roles, ports, directories) and ``D/cluster.json``.
- ``probes``: one-shot checks of a port, a log, an HTTP endpoint.
- ``launch``: start a process detached from us, tell whether it still runs, stop it.
- ``health``: what `mqgw cluster status` reports.
- ``control``: the commands themselves (up, start, stop, down), usable from Python too.

Unlike bench/servers.py (children that die with the test that started them), these processes
run in their own session and outlive the command that started them; ``cluster.json`` is how
later commands find them again. docs/cluster.md describes the files and the commands.
"""
