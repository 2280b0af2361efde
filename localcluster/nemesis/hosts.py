"""Real hosts for fault tests: one network namespace per process, each with its own address,
joined by a bridge, built and removed by the test itself (root, ``ip netns``, veth).

    with hosts(["redis", "broker", "gw1"]) as net:
        net.start("redis", [...])          # a process inside the host's namespace
        net.cut("redis", "broker")         # no packet between the two, both ways
        net.partition({"redis"}, {"broker", "gw1"})
        net.degrade("gw1", 0.2, 1000)      # 20 % of packets lost, 1 Mbit/s each way
        net.heal()

Addresses are ``10.231.N.H`` (private range), ``N`` chosen per topology among those no
interface of the machine has, so that concurrent runs do not meet (two runs that drew the same
``N`` at random talked to each other's gateways: nemesis seeds 145 and 146); nothing is
routed outside the bridge. A cut is a blackhole route on each side: the kernel drops the
packets silently, as a real partition does (connects time out, they are not refused).
Namespaces, veths and the bridge carry a per-run tag in their names and are removed on the
way out, on failure too; ``sweep()`` removes those of runs that died.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import re
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

SUBNET_PREFIX = "10.231"
TAG_PREFIX = "mqh"  # every name this module creates starts with it (sweep)
QUEUE_MS = 400  # a degraded link queues up to this long, then drops


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def _run(argv: Sequence[str], check: bool = True) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=10)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def free_subnet() -> int:
    """An ``N`` of ``10.231.N.0/24`` that no interface here has (another run's bridge)."""
    listed = _ip("-o", "-4", "addr", "show").stdout
    used = {int(n) for n in re.findall(rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.", listed)}
    free = [n for n in range(1, 255) if n not in used]
    if not free:
        raise RuntimeError(f"every {SUBNET_PREFIX}.N.0/24 subnet is in use on this machine")
    return random.SystemRandom().choice(free)  # not the run's seeded draws


class Hosts:
    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not names or len(names) > 200:
            raise ValueError(f"host names must be 1 to 200 distinct names: {names!r}")
        self.names = list(names)
        self.tag = f"{TAG_PREFIX}{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self.subnet = free_subnet()
        self.addresses = {
            name: f"{SUBNET_PREFIX}.{self.subnet}.{index + 10}" for index, name in enumerate(names)
        }
        self.cuts: set[frozenset[str]] = set()
        self.degraded: dict[str, float] = {}  # hosts with a lossy, slow link: their loss
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def namespace(self, name: str) -> str:
        return f"{self.tag}n{self.names.index(name)}"

    def _veth(self, name: str) -> str:
        return f"{self.tag}v{self.names.index(name)}"

    @property
    def bridge_address(self) -> str:
        """The machine's own address on the bridge: the test process reaches hosts by it."""
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    def create(self) -> Hosts:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name in self.names:
            ns, veth = self.namespace(name), self._veth(name)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        return self

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside host ``name``."""
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def start(self, name: str, argv: Sequence[str], **popen: object) -> subprocess.Popen[bytes]:
        """A process on host ``name`` that dies with the test (and with the topology)."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            self.command(name, argv),
            preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl: safe)
            **popen,
        )
        self.procs.append(proc)
        return proc

    def run(self, name: str, argv: Sequence[str], timeout_s: float = 30) -> str:
        """Run ``argv`` on host ``name`` to its end; its standard output."""
        done = subprocess.run(
            self.command(name, argv),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv!r} on {name} failed: {done.stderr.strip()}")
        return done.stdout

    # -- faults ------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b``, either way."""
        pair = frozenset((a, b))
        if a == b or pair in self.cuts:
            return
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.namespace(here), "route", "add", "blackhole",
                f"{self.addresses[there]}/32")  # fmt: skip
        self.cuts.add(pair)

    def join(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if pair not in self.cuts:
            return
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.namespace(here), "route", "del", "blackhole",
                f"{self.addresses[there]}/32", check=False)  # fmt: skip
        self.cuts.discard(pair)

    def partition(self, *sides: Iterable[str]) -> None:
        """Hosts see only the hosts on their side (a host on no side sees everyone)."""
        groups = [set(side) for side in sides]
        for left, right in itertools.combinations(groups, 2):
            for a in left:
                for b in right:
                    self.cut(a, b)

    def isolate(self, name: str) -> None:
        self.partition([name], [n for n in self.names if n != name])

    def degrade(self, name: str, loss: float, rate_kbit: int) -> None:
        """Host ``name``'s link drops ``loss`` of its packets each way, at random, and carries
        ``rate_kbit`` each way, queueing the rest up to ``QUEUE_MS`` (delay under load). This
        kernel has no ``tc netem``: loss is iptables' statistic match on the receiving side
        (what arrives at the host, and what arrives from it at every other host: a drop on the
        way out would be an error to the sender, which a real network never gives; the
        machine's own side of the bridge is left alone), delay a tbf queue."""
        if name in self.degraded:
            return
        for ns, rule in self._loss_rules(name, loss):
            _run(["ip", "netns", "exec", ns, "iptables", "-A", *rule])
        shape = ["root", "tbf", "rate", f"{rate_kbit}kbit", "burst", "16kb",
                 "latency", f"{QUEUE_MS}ms"]  # fmt: skip
        _run(["ip", "netns", "exec", self.namespace(name), "tc", "qdisc", "add", "dev", "eth0",
              *shape])  # fmt: skip
        _run(["tc", "qdisc", "add", "dev", self._veth(name), *shape])  # towards the host
        self.degraded[name] = loss

    def _loss_rules(self, name: str, loss: float) -> list[tuple[str, list[str]]]:
        drop = ["-m", "statistic", "--mode", "random", "--probability", f"{loss:.3f}", "-j",
                "DROP"]  # fmt: skip
        rules = [(self.namespace(name), ["INPUT", "-i", "eth0", *drop])]
        source = ["-s", f"{self.addresses[name]}/32"]
        rules += [
            (self.namespace(other), ["INPUT", "-i", "eth0", *source, *drop])
            for other in self.names
            if other != name
        ]
        return rules

    def restore(self, name: str) -> None:
        loss = self.degraded.pop(name, None)
        if loss is None:
            return
        for ns, rule in self._loss_rules(name, loss):
            _run(["ip", "netns", "exec", ns, "iptables", "-D", *rule], check=False)
        ns = self.namespace(name)
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        _run(["tc", "qdisc", "del", "dev", self._veth(name), "root"], check=False)

    def heal(self) -> None:
        for pair in list(self.cuts):
            self.join(*sorted(pair))
        for name in list(self.degraded):
            self.restore(name)

    def teardown(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.procs.clear()
        for name in self.names:
            _ip("netns", "del", self.namespace(name), check=False)  # takes its veth end along
            _ip("link", "del", self._veth(name), check=False)
        _ip("link", "del", self.bridge, check=False)


def leftovers() -> list[str]:
    """Namespaces and links of this module still on the machine."""
    spaces = _ip("netns", "list").stdout.split()
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show").stdout.splitlines()
        if line.count(":") >= 2
    ]
    return [n for n in spaces + links if n.startswith(TAG_PREFIX)]


def sweep() -> None:
    """Remove what runs that died left behind (their namespaces first, then links)."""
    for name in leftovers():
        _ip("netns", "del", name, check=False)
    for name in leftovers():
        _ip("link", "del", name, check=False)


@contextmanager
def hosts(names: Sequence[str]) -> Iterator[Hosts]:
    net = Hosts(names)
    try:
        yield net.create()
    finally:
        net.teardown()
