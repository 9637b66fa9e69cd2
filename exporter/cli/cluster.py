"""`topowatch cluster` and `topowatch explain`: the Kueue-side cluster service, and the question
put to it (or to a kubectl dump, or to Slurm) of why a workload waits or was preempted.

Every `topowatch` invocation, the node agent's on each GPU node included, builds these parsers.
So this module imports, at parse time, only the cluster service's argument modules (`leader.args`,
`history.args`: tests/test_architecture.py lists them as the parser-only modules a node agent may
load); the service, the simulation, the Kubernetes and AWS clients are imported inside the run
functions.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from exporter.cli.common import DEFAULT_CLUSTER_PORT, log, parse_listen

__all__ = ["add_cluster_parsers", "run_cluster", "run_explain"]


def add_cluster_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `cluster` and `explain` sub-commands, run by `run_cluster` and `run_explain`. The
    service's leader-election and history options come from its own argument modules, so that
    the service and this parser cannot drift apart."""
    from exporter.cluster.history.args import add_arguments as add_history_arguments
    from exporter.cluster.leader.args import add_arguments as add_leader_arguments

    cluster = sub.add_parser(
        "cluster",
        help="the cluster service: Kueue admission, preemption and placement vs topology",
        description="Watch Nodes, Pods, Events and Kueue objects; serve /metrics and /api/v1.",
    )
    add_leader_arguments(cluster)
    add_history_arguments(cluster)
    cluster.add_argument(
        "--simulate",
        action="store_true",
        help="run against a simulated HyperPod cluster served on loopback",
    )
    cluster.add_argument(
        "--listen",
        type=parse_listen,
        default=("0.0.0.0", DEFAULT_CLUSTER_PORT),
        metavar="HOST:PORT",
    )
    cluster.add_argument(
        "--workload-series-cap",
        type=int,
        default=2000,
        metavar="N",
        help="live workloads with per-workload series (largest first)",
    )
    cluster.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    goodput = cluster.add_argument_group("goodput (interruptions, ETTR, fleet reliability)")
    goodput.add_argument(
        "--goodput-checkpoint-key",
        default=None,
        metavar="KEY",
        help="annotation or label on a job (Workload, HyperPodPyTorchJob) holding its last "
        "checkpoint time, RFC 3339 or Unix seconds: work lost since it is reported "
        "(default topowatch.io/last-checkpoint)",
    )
    goodput.add_argument(
        "--repeat-offender",
        type=repeat_offender,
        default=(2, 7 * 86_400.0),
        metavar="N/D",
        help="a node with N hardware incidents within duration D is a repeat offender, to be "
        "replaced rather than rebooted (default 2/7d)",
    )
    goodput.add_argument(
        "--goodput-job-series-cap",
        type=positive_int,
        default=500,
        metavar="N",
        help="live and recent jobs with per-job goodput series, largest first (default 500)",
    )
    cluster.add_argument(
        "--remediation-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML: mode observe|act, providers, budget, breaker, cooldown (off without it)",
    )
    cluster.add_argument(
        "--config",
        dest="cluster_config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML: the cluster service's settings; its admission: section runs the "
        "topowatch.io/node-health admission check (enabled, mode observe|enforce, checks, "
        "fail_open_seconds, reject; docs/admission.md)",
    )
    cluster.add_argument(
        "--alerts-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="bearer token for POST /api/v1/alerts and /api/v1/remediation/reset",
    )
    cluster.add_argument(
        "--ec2-events",
        action="store_true",
        help="poll EC2 DescribeInstanceStatus for scheduled events (reboot, maintenance, "
        "retirement): those nodes' GPUs count as unavailable (needs ec2:DescribeInstanceStatus)",
    )
    cluster.add_argument(
        "--ec2-region", default=None, metavar="REGION", help="default: the AWS SDK's own"
    )
    cluster.add_argument(
        "--ec2-events-interval",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds between scheduled-event polls (default 300)",
    )
    cluster.add_argument(
        "--ec2-events-horizon",
        type=float,
        default=48.0,
        metavar="HOURS",
        help="an event starting within this many hours makes its node unavailable (default 48)",
    )
    cluster.set_defaults(func=run_cluster)

    explain = sub.add_parser(
        "explain",
        help="why a workload was preempted or is pending, and where it runs",
        description="Ask a running cluster service (--server) or read a kubectl dump (--from).",
    )
    explain.add_argument("target", nargs="?", metavar="NAMESPACE/NAME")
    source = explain.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="dump",
        type=Path,
        metavar="DUMP.yaml",
        help="kubectl get nodes,pods,workloads,clusterqueues,localqueues,events -A -o yaml",
    )
    source.add_argument("--server", metavar="URL", help="a running `topowatch cluster`")
    source.add_argument(
        "--slurm",
        metavar="JOBID",
        help="a Slurm job: its placement or pending reason, from squeue and sinfo",
    )
    explain.add_argument(
        "--topology-file",
        type=Path,
        metavar="FILE",
        help="with --slurm: topology from-ec2 JSON or topology.conf (default: beside slurm.conf)",
    )
    explain.add_argument(
        "--all-preemptions", action="store_true", help="list the preemption ledger"
    )
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.set_defaults(func=run_explain)


def repeat_offender(value: str) -> tuple[int, float]:
    """`N/D`: N incidents within duration D (`2/7d`, `3/36h`), for --repeat-offender."""
    from exporter.cluster.history.args import seconds

    count, slash, window = value.partition("/")
    span = seconds(window) if slash else None
    try:
        number = int(count)
    except ValueError:
        number = 0
    if number < 1 or span is None or span <= 0:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected N/DURATION, N incidents within a duration, like 2/7d or 3/36h"
        )
    return number, span


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive whole number")
    return number


def run_cluster(args: argparse.Namespace) -> int:
    """Serve the cluster service (against a simulated API server with --simulate) until it
    stops; exit 2, with the reason on stderr, when an API, a config or the history store
    cannot be used."""
    from exporter.cluster.run import kube_api_client, serve_cluster

    host, port = args.listen
    env = None

    def refuse(message: str) -> int:
        """Exit 2 with `message` on stderr, the simulated API server (if any) stopped."""
        print(f"topowatch cluster: {message}", file=sys.stderr)
        if env is not None:
            env.stop()
        return 2

    if args.simulate:
        from exporter.sim.environment import SimulatedEnvironment

        env = SimulatedEnvironment(seed=args.seed).start()
        log.info("simulated Kubernetes API on %s", env.url)
    try:
        client = kube_api_client(env.url if env is not None else None)
    except Exception as exc:  # no in-cluster config and no kubeconfig
        print(f"topowatch cluster: no Kubernetes API configuration: {exc}", file=sys.stderr)
        return 2
    from exporter.cluster.leader.election import Leadership

    woken: list[Callable[[], None]] = []  # the controller's wake, once it is built

    def started_leading() -> None:
        for wake in woken:
            wake()

    leadership = Leadership.from_args(args, client, on_started_leading=started_leading)
    controller, token = None, None
    if args.remediation_config is not None:
        from exporter.cluster.run import RemediationConfigError, build_controller, read_token

        try:
            controller, token = build_controller(args.remediation_config, client)
            controller.leading = lambda: leadership.is_leader
            woken.append(controller.wake)
            if args.alerts_token_file is not None:
                token = read_token(args.alerts_token_file)
        except RemediationConfigError as exc:
            return refuse(f"{exc}")
    admission = None
    if args.cluster_config is not None:
        from exporter.cluster.run import RemediationConfigError, read_cluster_config

        try:
            admission = read_cluster_config(args.cluster_config)
        except RemediationConfigError as exc:
            return refuse(f"--config: {exc}")
    ec2_events = None
    if args.ec2_events:
        from exporter.sources.ec2_events import Ec2EventsSource, ec2_events_client

        try:
            ec2_events = Ec2EventsSource(ec2_events_client(args.ec2_region))
        except Exception as exc:  # no region, no credentials configuration
            return refuse(f"--ec2-events: {exc}")
    from exporter.cluster.history.args import DATABASE_URL_ENV

    history = None
    url = args.database_url or os.environ.get(DATABASE_URL_ENV)
    if url:
        from exporter.cluster.history.feed import HistoryStartError, open_history

        if args.leader_elect and url.startswith("sqlite"):
            log.warning(
                "--leader-elect with an SQLite history: each replica writes its own file;"
                " share one history between replicas with PostgreSQL"
            )
        try:
            history = open_history(
                url,
                leadership.identity,
                retention_s=args.history_retention,
                max_rows=args.history_max_rows,
                queue_rows=args.history_queue_rows,
                ephemeral=args.history_ephemeral,
            )
        except HistoryStartError as exc:
            return refuse(f"history store: {exc}")
    from exporter.cluster.goodput import GoodputConfig

    findings, window = args.repeat_offender
    goodput = GoodputConfig(repeat_findings=findings, repeat_window_s=window)
    if args.goodput_checkpoint_key:
        goodput = GoodputConfig(args.goodput_checkpoint_key, findings, window)
    try:
        serve_cluster(
            client,
            host,
            port,
            workload_cap=args.workload_series_cap,
            controller=controller,
            alerts_token=token,
            ec2_events=ec2_events,
            ec2_events_interval_s=max(10.0, args.ec2_events_interval),
            ec2_events_horizon_s=max(0.0, args.ec2_events_horizon) * 3600.0,
            leadership=leadership,
            history=history,
            goodput=goodput,
            goodput_job_cap=args.goodput_job_series_cap,
            admission=admission,
        )
    finally:
        if env is not None:
            env.stop()
    return 0


def run_explain(args: argparse.Namespace) -> int:
    """Print the explanation from the source asked for: Slurm (--slurm), a kubectl dump
    (--from) or a running cluster service (--server)."""
    if args.slurm is not None:
        from exporter.cli.slurm_explain import run as explain_slurm

        return explain_slurm(args.slurm, args.topology_file, args.json)
    from exporter.cluster.run import explain_live, explain_offline, print_or_fail

    if not args.all_preemptions and not args.target:
        print("topowatch explain: give NAMESPACE/NAME or --all-preemptions", file=sys.stderr)
        return 2
    if args.dump is not None:
        return print_or_fail(
            lambda: explain_offline(args.dump, args.target, args.all_preemptions, args.json),
            "topowatch explain",
        )
    return print_or_fail(
        lambda: explain_live(args.server, args.target, args.all_preemptions, args.json),
        "topowatch explain",
    )
