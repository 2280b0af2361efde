"""A local RocketMQ (the pinned release, as JVMs), behind `mqgw rocketmq up|status|down`.

- ``pom.xml``: the pinned release; ``dist``: fetches it from Maven Central into the cache.
- ``layout``: what runs (names, ports, directories) and ``D/rocketmq.json``.
- ``conf``: the configuration files and JVM command lines (heaps, flags), mqadmin's too.
- ``procs``: start a JVM detached, tell whether it runs, stop it.
- ``remoting``: just enough of RocketMQ's protocol to ask who is registered, who is in sync.
- ``local``: the commands themselves (up, status, down), usable from Python too.

tests/harness/rocketmq.py starts the same processes for tests. docs/rocketmq.md describes
the files and the commands.
"""
