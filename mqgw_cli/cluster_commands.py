"""`mqgw cluster up|status|stop|start|down --dir D`: a whole cluster as local processes.

    mqgw cluster up --dir D [--gateways N] [--groups G] [--replicas R] [--controllers C]
    mqgw cluster up --dir D --backend rocketmq [--gateways N] [--replicas R]
    mqgw cluster add-group --dir D [--replicas R]
    mqgw cluster status --dir D [--json]
    mqgw cluster stop --dir D NAME [--kill]
    mqgw cluster start --dir D NAME
    mqgw cluster down --dir D
    mqgw cluster rebalance [--dry-run] | drain-group GROUP | remove-group GROUP  (--dir D)

`up` starts redis-server (from the PATH), C `mqgw controller`s, R `mqgw broker`s per group
(replicated when R ≥ 2) and N `mqgw serve` gateways, on free loopback ports, waits until each
is ready (and each replicated group has a master) and describes them all in D/cluster.json;
they keep running after it returns, and a watcher keeps the roles in cluster.json current.
With `--backend rocketmq` the messages are in a local RocketMQ instead (`mqgw rocketmq up`'s
processes, in D/rocketmq, R brokers), which the gateways use with --store rocketmq://.
`add-group` starts one more broker group while the cluster runs; the gateways use it for new
queues within about a second.
docs/cluster.md has the details. Exit codes: 0 done (status: all healthy), 1 failed
(status: something is unhealthy), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from localcluster.layout import Cluster, Member
    from localcluster.roles import Observed


def _console() -> Console:
    from rich.console import Console

    # Not a terminal (a script, a test, a file): rich would wrap tables at 80 columns.
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=160)


def _progress(console: Console) -> Any:
    def on_ready(member: Member, seconds: float) -> None:
        console.print(
            f"[green]✓[/] {member.name:<14} {member.role:<10} pid {member.pid:<8} "
            f"{member.endpoint}  ready in {seconds:.1f} s",
            markup=True,
        )

    return on_ready


def _shape(args: argparse.Namespace) -> Any:
    """The Shape asked for, or why it cannot be (a str)."""
    from localcluster.layout import Shape

    if args.backend == "rocketmq":
        if args.groups != 1:
            return "--backend rocketmq has one broker group, RocketMQ's: --groups must be 1"
        if args.controllers is not None:
            return "--backend rocketmq has RocketMQ's own controller: no --controllers"
    controllers = args.controllers
    if controllers is None:
        controllers = 2 if args.replicas > 1 and args.backend == "mqgw" else 0
    if args.groups < 1 or args.gateways < 0 or args.replicas < 1 or controllers < 0:
        return "--groups and --replicas must be ≥ 1, --gateways and --controllers ≥ 0"
    if args.replicas > 1 and controllers == 0 and args.backend == "mqgw":
        return f"--replicas {args.replicas} needs a controller to elect masters: --controllers ≥ 1"
    return Shape(args.gateways, args.groups, args.replicas, controllers, args.backend)


def _up(args: argparse.Namespace) -> int:
    from localcluster import control
    from localcluster.layout import ClusterError

    shape = _shape(args)
    if isinstance(shape, str):
        print(f"mqgw cluster up: {shape}", file=sys.stderr)
        return 2
    console = _console()

    def on_note(text: str) -> None:
        console.print(f"[green]✓[/] {text}", markup=True)

    try:
        cluster = control.up(args.dir, shape, args.timeout, _progress(console), on_note)
    except ClusterError as error:
        print(f"mqgw cluster up: {error}", file=sys.stderr)
        if isinstance(error, control.UpFailed) and error.stopped:
            # control.up stopped what it had started: say what, or people go looking.
            names = ", ".join(error.stopped)
            print(f"mqgw cluster up: stopped again what it had started: {names}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mqgw cluster up: interrupted; what had started is stopped", file=sys.stderr)
        return 130
    console.print(_members_table(cluster))
    console.print(f"described in {cluster.state_path}; logs in {cluster.dir / 'logs'}")
    if cluster.store_url:
        console.print(
            f"messages in RocketMQ at {cluster.store_url} (the gateways' --store); its files "
            f"and logs in {cluster.rocketmq_dir}"
        )
    return 0


def _add_group(args: argparse.Namespace) -> int:
    from localcluster import control
    from localcluster.layout import ClusterError

    if args.replicas < 1:
        print("mqgw cluster add-group: --replicas must be ≥ 1", file=sys.stderr)
        return 2
    console = _console()

    def on_note(text: str) -> None:
        console.print(f"[green]✓[/] {text}", markup=True)

    try:
        added = control.add_group(
            args.dir, args.replicas, args.timeout, _progress(console), on_note
        )
    except ClusterError as error:
        print(f"mqgw cluster add-group: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mqgw cluster add-group: interrupted; its brokers are stopped", file=sys.stderr)
        return 130
    names = ", ".join(b.name for b in added)
    console.print(
        f"group {added[0].group} added ({names}); the gateways place new queues on it within "
        f"about a second; existing queues stay where they are"
    )
    return 0


def _members_table(cluster: Cluster) -> Any:
    from rich.table import Table

    from localcluster import control

    table = Table(title=f"mqgw cluster in {cluster.dir}")
    for column in ("name", "role", "epoch", "pid", "endpoint", "data"):
        table.add_column(column)
    members: list[Member] = cluster.members()
    members[1:1] = control.rocketmq_members(cluster)  # start order: after Redis
    for member in members:
        table.add_row(
            member.name,
            member.role,
            _epoch(member),
            str(member.pid or "-"),
            member.endpoint,
            member.data_dir or "-",
        )
    return table


def _epoch(member: Member) -> str:
    from localcluster.layout import BrokerMember

    return str(member.epoch) if isinstance(member, BrokerMember) and member.replicated else "-"


def _groups(cluster: Cluster, observed: Observed | None) -> list[dict[str, Any]]:
    """Each replicated group as the controller's record has it, brokers by their names."""
    from localcluster.broker_names import broker_name

    if observed is None:
        return []
    found = []
    for group in cluster.replicated_groups():
        record = observed.record(group)
        found.append(
            {
                "group": group,
                "epoch": record.epoch,
                "master": broker_name(group, record.master) if record.master else None,
                "in_sync": [broker_name(group, i) for i in sorted(record.in_sync)],
                "fence": broker_name(group, record.fence) if record.fence else None,
            }
        )
    return found


def _refreshed(cluster: Cluster) -> Observed | None:
    """Roles as Redis has them now; written to cluster.json too when that is free at once
    (status never waits behind another command, which refreshes before it writes anyway)."""
    from localcluster import control, roles
    from localcluster.layout import ClusterError, load

    observed = roles.refresh(cluster)
    if observed is None:
        return None
    with control.try_locked(cluster.dir) as held:
        if held:
            try:
                current = load(cluster.dir)
            except ClusterError:
                return observed
            if roles.apply(current, observed):
                current.save()
    return observed


def _status(args: argparse.Namespace) -> int:
    from rich.table import Table

    from localcluster import control, health
    from localcluster.layout import ClusterError, load

    try:
        cluster = load(args.dir.resolve())
        observed = _refreshed(cluster)
        checks = health.check(cluster, observed)
        if cluster.backend == "rocketmq":
            checks[1:1] = control.rocketmq_health(cluster)  # start order: after Redis
    except ClusterError as error:
        print(f"mqgw cluster status: {error}", file=sys.stderr)
        return 1
    healthy = all(c.healthy for c in checks)
    groups = _groups(cluster, observed)
    leader = next((c.name for c in cluster.controllers if c.leader), None)
    if args.json:
        body = {
            "dir": str(cluster.dir),
            "backend": cluster.backend,
            "store_url": cluster.store_url,
            "healthy": healthy,
            "processes": [c.to_json() for c in checks],
            "groups": groups,
            "leader": leader,
        }
        print(json.dumps(body, indent=2))
        return 0 if healthy else 1
    table = Table(title=f"mqgw cluster in {cluster.dir}")
    for column in ("name", "role", "epoch", "pid", "alive", "endpoint", "health"):
        table.add_column(column)
    for c in checks:
        mark = "[green]ok[/]" if c.healthy else "[red]FAIL[/]"
        table.add_row(
            c.member.name,
            c.member.role,
            _epoch(c.member),
            str(c.member.pid) if c.alive else "-",
            "yes" if c.alive else "[red]no[/]",
            c.member.endpoint,
            f"{mark} {c.detail}",
        )
    console = _console()
    console.print(table)
    for group in groups:
        fence = f"; switchover to {group['fence']} under way" if group["fence"] else ""
        console.print(
            f"group {group['group']}: master {group['master'] or '(none yet)'} at epoch "
            f"{group['epoch']}; in sync: {', '.join(group['in_sync']) or '-'}{fence}"
        )
    if cluster.controllers:
        console.print(f"controller leader: {leader or '(none: the lease is free)'}")
    console.print("healthy" if healthy else "[red]not healthy[/]")
    return 0 if healthy else 1


def _stop(args: argparse.Namespace) -> int:
    from localcluster import control
    from localcluster.layout import ClusterError

    try:
        result = control.stop(args.dir, args.name, args.kill, args.timeout)
    except ClusterError as error:
        print(f"mqgw cluster stop: {error}", file=sys.stderr)
        return 1
    print(f"{args.name}: {result.outcome}")
    return 0 if result.gone else 1


def _start(args: argparse.Namespace) -> int:
    from localcluster import control
    from localcluster.layout import ClusterError

    console = _console()
    try:
        member = control.start(args.dir, args.name, args.timeout, _progress(console))
    except ClusterError as error:
        print(f"mqgw cluster start: {error}", file=sys.stderr)
        return 1
    if member is None:
        console.print(f"{args.name} is already running")
    return 0


def _down(args: argparse.Namespace) -> int:
    from rich.table import Table

    from localcluster import control
    from localcluster.layout import STATE_FILE, ClusterError

    if not (args.dir / STATE_FILE).exists():
        print(f"no cluster in {args.dir} ({STATE_FILE} is missing): nothing to stop")
        return 0  # teardown scripts call down unconditionally
    try:
        results = control.down(args.dir, args.timeout)
    except ClusterError as error:
        print(f"mqgw cluster down: {error}", file=sys.stderr)
        return 1
    table = Table(title=f"mqgw cluster down in {args.dir.resolve()}")
    table.add_column("name")
    table.add_column("role")
    table.add_column("result")
    for result in results:
        table.add_row(result.member.name, result.member.role, result.outcome)
    console = _console()
    console.print(table)
    return 0 if all(r.gone for r in results) else 1


def add_cluster_commands(commands: Any) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="a local cluster: redis, brokers and gateways as processes (D/cluster.json)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    cmds = cluster.add_subparsers(dest="command", required=True)
    _add_up(cmds)
    _add_add_group(cmds)
    _add_member_commands(cmds)

    from mqgw_cli.group_commands import add_group_commands

    add_group_commands(cmds)


def _sub(cmds: Any, name: str, text: str) -> argparse.ArgumentParser:
    """A `mqgw cluster NAME` parser with the --dir every cluster subcommand takes."""
    parser: argparse.ArgumentParser = cmds.add_parser(name, help=text, description=text)
    parser.add_argument(
        "--dir", type=Path, required=True, metavar="D", help="the cluster's directory"
    )
    return parser


def _timeout(parser: argparse.ArgumentParser, text: str) -> None:
    from localcluster.layout import DEFAULT_TIMEOUT_S  # light: keeps `mqgw serve` fast

    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help=text)


def _add_up(cmds: Any) -> None:
    up = _sub(
        cmds, "up", "start redis, controllers, brokers and gateways; wait until all are ready"
    )
    up.add_argument("--gateways", type=int, default=1, metavar="N", help="gateways (default 1)")
    up.add_argument("--groups", type=int, default=1, metavar="G", help="broker groups (default 1)")
    up.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="R",
        help="brokers per group (default 1); 2 or more: master/slave replication (sync)",
    )
    up.add_argument(
        "--controllers",
        type=int,
        default=None,
        metavar="C",
        help="`mqgw controller`s c1..cC (default 2 with --replicas ≥ 2, else 0)",
    )
    up.add_argument(
        "--backend",
        choices=("mqgw", "rocketmq"),
        default="mqgw",
        help="where messages are kept: mqgw brokers (default), or a local RocketMQ in D/rocketmq "
        "(`mqgw rocketmq up`'s processes, --replicas R brokers) the gateways use as --store",
    )
    _timeout(up, "seconds each process has to become ready (default 30)")
    up.set_defaults(func=_up)


def _add_add_group(cmds: Any) -> None:
    add_group = _sub(
        cmds,
        "add-group",
        "start one more broker group g<N+1> in the running cluster; wait until ready",
    )
    add_group.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="R",
        help="brokers in the group (default 1); 2 or more: replicated, needs a controller",
    )
    _timeout(add_group, "seconds each broker has to become ready (default 30)")
    add_group.set_defaults(func=_add_group)


def _add_member_commands(cmds: Any) -> None:
    """status, stop, start and down: the running cluster's processes."""
    status = _sub(cmds, "status", "each process: running? healthy? (exit 1 if any is not)")
    status.add_argument("--json", action="store_true", help="JSON for machines")
    status.set_defaults(func=_status)

    stop = _sub(cmds, "stop", "stop one process (SIGTERM, then SIGKILL after --timeout)")
    stop.add_argument(
        "name", metavar="NAME", help="as in cluster.json: redis, c1, broker-g1-0, gw1"
    )
    stop.add_argument("--kill", action="store_true", help="SIGKILL at once (a crash)")
    _timeout(stop, "seconds to wait after SIGTERM before SIGKILL (default 30)")
    stop.set_defaults(func=_stop)

    start = _sub(cmds, "start", "start one stopped process again: same data, same ports")
    start.add_argument(
        "name", metavar="NAME", help="as in cluster.json: redis, c1, broker-g1-0, gw1"
    )
    _timeout(start, "seconds it has to become ready (default 30)")
    start.set_defaults(func=_start)

    down = _sub(
        cmds, "down", "stop everything: watcher, gateways, brokers, controllers, RocketMQ, redis"
    )
    _timeout(down, "seconds each tier has after SIGTERM before SIGKILL (default 30)")
    down.set_defaults(func=_down)
