"""`mqgw bench store|gc|roundtrip|hot-queue|run|compare`: the benchmark commands.

Each subcommand's parser and the handler that runs it; the benchmarks themselves live in
`bench/` and are imported only when a handler runs, so building the parser (every `mqgw`
invocation) stays light. `add_bench_commands` registers them all under `mqgw bench`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _bench_store(args: argparse.Namespace) -> int:
    from bench.store_bench import run

    run(args.data_dir, args.seconds, args.backlog, args.quick, args.json)
    return 0


def _bench_gc(args: argparse.Namespace) -> int:
    from bench.gc_bench import Workload, run

    work = Workload(args.messages, args.body, args.segment_mb, args.stuck_every, args.backlog)
    run(work, args.data_dir, args.json)
    return 0


def _bench_roundtrip(args: argparse.Namespace) -> int:
    from bench.roundtrip import run

    run(args.url, args.count, args.size, args.rounds)
    return 0


def _bench_hot_queue(args: argparse.Namespace) -> int:
    from bench.hot_queue import run

    counts = [int(p) for p in args.partitions.split(",") if p.strip()]
    return run(args.dir, counts, args.messages, args.publishers)


def _bench_run(args: argparse.Namespace) -> int:
    from bench.load.compare import run

    run(args.scenarios, args.url, args.scale, args.procs)
    return 0


def _bench_profile(args: argparse.Namespace) -> int:
    from bench.profile import run

    return run(args.scenarios, args.scale, args.procs, args.out, args.html)


def _bench_compare(args: argparse.Namespace) -> int:
    from bench.load.compare import compare, pick

    if args.with_cluster or args.with_rocketmq:
        from bench.load.versus import compare_cluster

        if args.compare:
            raise SystemExit("mqgw bench compare: --with-cluster and --with-rocketmq start "
                             "their own sides, not URLs")  # fmt: skip
        if any(n < 1 for n in args.cluster_gateways):
            raise SystemExit("mqgw bench compare: --cluster-gateways must be ≥ 1")
        from bench.cpu_cap import CpuCapError

        try:
            report = compare_cluster(
                pick(args.scenarios),
                args.cluster_gateways if args.with_cluster else [],
                args.with_rabbitmq,
                args.scale,
                args.rounds,
                args.procs,
                args.gateway_cpu,
                args.with_rocketmq,
            )
        except CpuCapError as error:
            raise SystemExit(f"mqgw bench compare: --gateway-cpu: {error}") from None
        return 1 if report["left_running"] or report["cgroups_left"] else 0
    if args.cluster_gateways != [2]:
        raise SystemExit("mqgw bench compare: --cluster-gateways goes with --with-cluster")
    if args.gateway_cpu is not None:
        raise SystemExit("mqgw bench compare: --gateway-cpu goes with --with-cluster")
    if not args.with_rabbitmq and not args.compare:
        raise SystemExit(
            "mqgw bench compare: give --compare URL_A URL_B, --with-rabbitmq or --with-cluster"
        )
    compare(args.scenarios, args.compare, args.scale, args.rounds, args.procs)
    return 0


def _add_load_options(sub: argparse.ArgumentParser) -> None:
    from bench.load.runner import default_procs
    from bench.load.scenarios import SCENARIOS

    sub.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"default: all ({', '.join(SCENARIOS)})"
    )
    sub.add_argument("--scale", type=float, default=1.0, help="shrink message counts (0.1)")
    sub.add_argument("--procs", type=int, default=default_procs(), help="worker processes per role")


def add_bench_commands(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks")
    bench_cmds = bench.add_subparsers(dest="command", required=True)
    _add_store_bench(bench_cmds)
    _add_gc_bench(bench_cmds)
    _add_roundtrip_bench(bench_cmds)
    _add_hot_queue_bench(bench_cmds)
    _add_load_run(bench_cmds)
    _add_load_compare(bench_cmds)
    _add_load_profile(bench_cmds)


def _add_store_bench(bench_cmds: Any) -> None:
    store = bench_cmds.add_parser("store", help="log store appends, reads and catch-up")
    store.add_argument("--seconds", type=float, default=3.0, help="per append run")
    store.add_argument("--backlog", type=int, default=10_000_000, help="catch-up records (0: skip)")
    store.add_argument("--quick", action="store_true", help="100 B records only")
    store.add_argument("--data-dir", type=Path, default=None, help="scratch dir (default: tmp)")
    store.add_argument("--json", type=Path, default=None, help="also write the JSON lines here")
    store.set_defaults(func=_bench_store)


def _add_gc_bench(bench_cmds: Any) -> None:
    gc_bench = bench_cmds.add_parser("gc", help="disk use with a stuck queue, collector off/on")
    gc_bench.add_argument("--messages", type=int, default=400_000)
    gc_bench.add_argument("--body", type=int, default=1024, help="body bytes")
    gc_bench.add_argument("--segment-mb", type=int, default=16)
    gc_bench.add_argument("--stuck-every", type=int, default=100, help="1 in N to the stuck queue")
    gc_bench.add_argument("--backlog", type=int, default=20_000, help="the busy queue's backlog")
    gc_bench.add_argument("--data-dir", type=Path, default=None, help="scratch dir (default: tmp)")
    gc_bench.add_argument("--json", type=Path, default=None, help="also write the JSON lines here")
    gc_bench.set_defaults(func=_bench_gc)


def _add_roundtrip_bench(bench_cmds: Any) -> None:
    trip = bench_cmds.add_parser("roundtrip", help="aio-pika confirms + consumer, side by side")
    trip.add_argument("--url", action="append", required=True, help="AMQP URL (give two)")
    trip.add_argument("--count", type=int, default=20_000)
    trip.add_argument("--size", type=int, default=1024)
    trip.add_argument("--rounds", type=int, default=3)
    trip.set_defaults(func=_bench_roundtrip)


def _add_hot_queue_bench(bench_cmds: Any) -> None:
    hot = bench_cmds.add_parser(
        "hot-queue", help="one hot queue at 1, 2, 4 partitions on a running local cluster"
    )
    hot.add_argument("--dir", type=Path, required=True, metavar="D", help="the cluster's directory")
    hot.add_argument("--partitions", default="1,2,4", help="partition counts (default 1,2,4)")
    hot.add_argument("--messages", type=int, default=200_000, help="per run (default 200,000)")
    hot.add_argument("--publishers", type=int, default=4, help="processes (default 4)")
    hot.set_defaults(func=_bench_hot_queue)


def _add_load_run(bench_cmds: Any) -> None:
    load = bench_cmds.add_parser("run", help="raw-socket load scenarios against one server")
    _add_load_options(load)
    load.add_argument(
        "--url",
        default=None,
        help="AMQP URL, or several separated by commas (one system's entry points: "
        "publishers and consumers are spread over them); default: start a gateway",
    )
    load.set_defaults(func=_bench_run)


def _add_load_profile(bench_cmds: Any) -> None:
    profile = bench_cmds.add_parser(
        "profile", help="a gateway under pyinstrument while scenarios run: where its time goes"
    )
    _add_load_options(profile)
    profile.add_argument(
        "--out", type=Path, default=Path("mqgw-profile.txt"), help="the report (%(default)s)"
    )
    profile.add_argument("--html", action="store_true", help="an HTML report instead of text")
    profile.set_defaults(func=_bench_profile)


def _add_load_compare(bench_cmds: Any) -> None:
    side = bench_cmds.add_parser("compare", help="scenarios against A and B alternately")
    _add_load_options(side)
    which = side.add_mutually_exclusive_group()
    which.add_argument("--compare", nargs=2, metavar=("URL_A", "URL_B"), default=None)
    which.add_argument(
        "--with-rabbitmq",
        action="store_true",
        help="start the gateway (sync flush) as A and a private RabbitMQ as B",
    )
    side.add_argument(
        "--with-cluster",
        action="store_true",
        help="start a private cluster (redis, 1 broker, N gateways) and the embedded node "
        "(both sync flush) and compare them; with --with-rabbitmq, RabbitMQ too",
    )
    side.add_argument(
        "--with-rocketmq",
        action="store_true",
        help="start a local RocketMQ (`mqgw rocketmq up`'s processes) with a gateway over it "
        "(--store rocketmq://) and the embedded node, and compare them; with --with-rabbitmq, "
        "RabbitMQ too; CPU per process (gateway and each JVM)",
    )
    side.add_argument(
        "--cluster-gateways",
        type=int,
        nargs="+",
        default=[2],
        metavar="N",
        help="gateways of the cluster (default 2); several (2 1): one cluster each",
    )
    side.add_argument(
        "--gateway-cpu",
        type=float,
        default=None,
        metavar="CORES",
        help="with --with-cluster: cap each gateway process (the cluster's and the embedded "
        "node) at CORES cores with a cgroup (0.5), so the gateway is the bottleneck; "
        "needs root and a cpu cgroup controller",
    )
    side.add_argument("--rounds", type=int, default=3)
    side.set_defaults(func=_bench_compare)
