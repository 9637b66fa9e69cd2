"""The one `topowatch` command. Subcommands arrive with the issues that build them."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from exporter.cli.quota import add_quota_parser
from exporter.cli.topology import add_topology_parser
from exporter.node.agent import NodeAgent
from exporter.node.health_api import Evaluation
from exporter.node.poller import COMPAT_MODES, NodeSources, Poller
from exporter.node.serving import HealthApi, TokenFile, serve
from exporter.topology.files import (
    TopologyFileError,
    load_placements,
    placement_labels,
    under_node_labels,
)
from healthcheck.detection.config import ConfigError, HealthConfig, load_config
from healthcheck.detection.monitor import HealthMonitor

if TYPE_CHECKING:
    from exporter.sim.hardware.node import SimulatedNode
    from exporter.sources.custom_checks import CustomCheckRunner
    from exporter.sources.interfaces import KernelLogSource, NodeLabelsSource
    from healthcheck.detection.reporter import NodeReporter

log = logging.getLogger("topowatch")

DEFAULT_NODE_PORT = 9402
DEFAULT_CLUSTER_PORT = 9403
ONCE_SETTLE_SECONDS = 1.0
# Named here rather than read from exporter.sim, so that a node agent on real hardware never
# loads the simulation; tests/cli/test_cli.py checks the list against the simulation's profiles.
SIMULATED_PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_compat(value: str) -> frozenset[str]:
    modes = frozenset(m.strip() for m in value.split(",") if m.strip())
    unknown = modes - COMPAT_MODES
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown compat mode(s) {', '.join(sorted(unknown))};"
            f" choose from {', '.join(sorted(COMPAT_MODES))}"
        )
    return modes


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def add_node_arguments(node: argparse.ArgumentParser) -> None:
    """The node agent's options; also what reads a --config file (`apply_node_config`)."""
    node.add_argument(
        "--simulate", metavar="PROFILE", help=f"simulated hardware: {', '.join(SIMULATED_PROFILES)}"
    )
    node.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault into the simulation (repeatable), e.g. xid=79@gpu3",
    )
    node.add_argument(
        "--once",
        action="store_true",
        help="poll (twice, 1 s apart, so rates and events settle), print the exposition, exit",
    )
    node.add_argument(
        "--listen", type=parse_listen, default=("0.0.0.0", DEFAULT_NODE_PORT), metavar="HOST:PORT"
    )
    node.add_argument(
        "--interval", type=float, default=5.0, metavar="S", help="poll interval in seconds"
    )
    node.add_argument(
        "--compat",
        type=parse_compat,
        default=frozenset(),
        metavar="dcgm,efa",
        help="also emit dcgm-exporter and/or AWS EFA exporter names",
    )
    node.add_argument("--node-name", default=None, help="default: $NODE_NAME, else the hostname")
    node.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    node.add_argument("--proc-root", type=Path, default=Path("/proc"))
    node.add_argument(
        "--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    node.add_argument(
        "--pod-resource",
        action="append",
        default=None,
        metavar="NAME",
        help="device-plugin resource holding GPUs (repeatable; default nvidia.com/gpu)",
    )
    node.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="do not read the Node object or the kubelet (bare-metal or Slurm nodes)",
    )
    node.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    node.add_argument(
        "--sim-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the simulation writes its sysfs/proc tree (default: a temp dir)",
    )
    node.add_argument(
        "--health-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="health-check thresholds (YAML or JSON); default: built-in thresholds",
    )
    node.add_argument(
        "--no-health", action="store_true", help="do not run the health checks at all"
    )
    node.add_argument(
        "--kernel-log",
        choices=("auto", "kmsg", "journal", "off"),
        default="auto",
        help="watch the kernel log for faults NVML cannot see: /dev/kmsg (needs CAP_SYSLOG "
        "where kernel.dmesg_restrict=1, and the device), the systemd journal (read-only "
        "mounts), auto: kmsg if it can be read, else the journal, else off (default: auto)",
    )
    node.add_argument(
        "--kernel-log-state",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to remember the last kernel log record read, so a restarted agent neither "
        "replays old lines nor loses new ones (default: none; every start begins at the end)",
    )
    node.add_argument(
        "--journal-dir",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="systemd journal directory (repeatable; default /var/log/journal, /run/log/journal)",
    )
    node.add_argument(
        "--report-node-status",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the TopowatchHealthy condition, the topowatch.io/findings annotation and "
        "Events to the Node (default: on with Kubernetes; off with --no-kubernetes; with "
        "--simulate only when --kube-api is given)",
    )
    node.add_argument(
        "--kube-api",
        default=None,
        metavar="URL",
        help="API server to report to instead of the in-cluster/kubeconfig one (tests, demo)",
    )
    node.add_argument(
        "--topology-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="this node's network placement when no Node labels give it (Slurm hosts): the JSON "
        "of `topowatch topology from-ec2 --format json` or a Slurm topology.conf, looked up by "
        "--node-name, else the short hostname; Node labels win where they exist",
    )
    node.add_argument(
        "--health-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="serve the health findings on /api/v1/health to requests bearing this file's token "
        "(Authorization: Bearer); re-read when the file changes (default: the endpoint is off)",
    )
    node.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML mapping of these options' long names to values, e.g. /etc/topowatch/"
        "node.yaml (`no-kubernetes: true`, `listen: 0.0.0.0:9402`); an option given on the "
        "command line with a value other than its default wins",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topowatch", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    node = sub.add_parser(
        "node",
        help="the node agent: GPU, NVLink, EFA, NUMA and topology metrics",
        description="Poll NVML, sysfs, the kubelet and the node's labels; serve /metrics.",
    )
    add_node_arguments(node)
    node.set_defaults(func=run_node)
    add_cluster_parsers(sub)
    slurm = sub.add_parser(
        "slurm-controller",
        help="on a Slurm head node: poll node agents, remediate through scontrol, file_sd",
        description="Reads nodes from slurmctld, polls each node agent's /api/v1/health, applies "
        "the remediation policy (observe by default) and acts with scontrol; writes Prometheus "
        "file_sd targets and Slurm job placement metrics.",
    )
    slurm.add_argument(
        "--config",
        type=Path,
        default=Path("/etc/topowatch/slurm-controller.yaml"),
        metavar="FILE",
        help="settings (YAML; default /etc/topowatch/slurm-controller.yaml)",
    )
    slurm.add_argument("--once", action="store_true", help="one cycle, then exit")
    slurm.set_defaults(func=run_slurm_controller)
    add_topology_parser(sub)
    add_quota_parser(sub)
    return parser


def add_cluster_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    cluster.add_argument(
        "--remediation-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML: mode observe|act, providers, budget, breaker, cooldown (off without it)",
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

    demo = sub.add_parser(
        "demo",
        help="the whole system on the simulation, one command",
        description="Simulated cluster + API server, a node agent per node, the cluster service.",
    )
    demo.add_argument(
        "--listen",
        type=parse_listen,
        default=("127.0.0.1", DEFAULT_CLUSTER_PORT),
        metavar="HOST:PORT",
    )
    demo.add_argument(
        "--node-port-base",
        type=int,
        default=9410,
        metavar="PORT",
        help="first node agent port (one per node); 0 picks free ports",
    )
    demo.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a node fault (repeatable), e.g. node=NAME:xid=79@gpu3",
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S s")
    demo.add_argument("--no-node-agents", action="store_true", help="only the cluster side")
    demo.add_argument(
        "--remediate",
        action="store_true",
        help="let the controller act on the simulated nodes (HyperPod labels); default observe",
    )
    demo.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="run Prometheus on 127.0.0.1:PORT scraping the demo (if installed); 0 disables",
    )
    demo.set_defaults(func=run_demo)


def run_cluster(args: argparse.Namespace) -> int:
    from exporter.cluster.run import kube_api_client, serve_cluster

    host, port = args.listen
    env = None
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
            print(f"topowatch cluster: {exc}", file=sys.stderr)
            if env is not None:
                env.stop()
            return 2
    ec2_events = None
    if args.ec2_events:
        from exporter.sources.ec2_events import Ec2EventsSource, ec2_events_client

        try:
            ec2_events = Ec2EventsSource(ec2_events_client(args.ec2_region))
        except Exception as exc:  # no region, no credentials configuration
            print(f"topowatch cluster: --ec2-events: {exc}", file=sys.stderr)
            if env is not None:
                env.stop()
            return 2
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
            print(f"topowatch cluster: history store: {exc}", file=sys.stderr)
            if env is not None:
                env.stop()
            return 2
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
        )
    finally:
        if env is not None:
            env.stop()
    return 0


def run_explain(args: argparse.Namespace) -> int:
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


def run_demo(args: argparse.Namespace) -> int:
    from exporter.sim.demo import run_demo as demo
    from exporter.sim.faults import FaultSpecError, parse_faults

    host, port = args.listen
    try:
        faults = parse_faults(args.fault)
        return demo(
            host,
            port,
            args.node_port_base,
            faults,
            args.seed,
            args.duration,
            with_agents=not args.no_node_agents,
            remediate=args.remediate,
            prometheus_port=args.prometheus_port,
        )
    except (ValueError, FaultSpecError) as e:
        print(f"topowatch demo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def real_sources(args: argparse.Namespace, node_name: str) -> NodeSources:
    from exporter.sources.kube import StaticNodeLabels, node_labels_source
    from exporter.sources.nvml import NvmlGpuSource
    from exporter.sources.podresources import KubeletPodResources

    gpu = NvmlGpuSource()
    gpu.start()
    if args.no_kubernetes:
        return NodeSources(
            gpu=gpu,
            labels=StaticNodeLabels({}),
            sysfs_root=args.sysfs_root,
            proc_root=args.proc_root,
        )
    labels = node_labels_source(node_name)
    pods = KubeletPodResources(
        args.pod_resources_socket, tuple(args.pod_resource or ("nvidia.com/gpu",))
    )
    return NodeSources(
        gpu=gpu, labels=labels, pods=pods, sysfs_root=args.sysfs_root, proc_root=args.proc_root
    )


def health_monitor(args: argparse.Namespace) -> HealthMonitor | None:
    """The health monitor the flags ask for; `ConfigError` for a bad --health-config."""
    if args.no_health:
        return None
    config = load_config(args.health_config) if args.health_config else HealthConfig()
    return HealthMonitor(config)


def custom_check_runner(monitor: HealthMonitor | None) -> CustomCheckRunner | None:
    """The runner of the health config's `custom_checks`, or None when there are none."""
    if monitor is None or not monitor.config.custom_checks:
        return None
    from exporter.sources.custom_checks import CheckSpec, CustomCheckRunner

    specs = [
        CheckSpec(
            name=c.name,
            path=c.path,
            args=c.args,
            interval_seconds=c.interval_seconds,
            timeout_seconds=c.timeout_seconds,
            max_output_length=c.max_output_length,
        )
        for c in monitor.config.custom_checks
    ]
    history = max(c.damping.n for c in monitor.config.custom_checks)
    return CustomCheckRunner(specs, history=history)


DEFAULT_JOURNAL_DIRS = (Path("/var/log/journal"), Path("/run/log/journal"))


def kernel_log_source(
    args: argparse.Namespace, sim: SimulatedNode | None
) -> KernelLogSource | None:
    """The kernel log the flags ask for; None (logged once) when it is off or none can be read:
    the monitor is optional, the rest of the agent runs without it."""
    if args.kernel_log == "off":
        return None
    if sim is not None:
        return sim.kernel_log_source(args.kernel_log_state)
    from exporter.node.kernel.patterns import record_may_match
    from exporter.sources.kmsg import UnreadableKernelLog, open_kernel_log

    source, why = open_kernel_log(
        args.kernel_log,
        kmsg_path=Path("/dev/kmsg"),
        journal_dirs=args.journal_dir or DEFAULT_JOURNAL_DIRS,
        state_dir=args.kernel_log_state,
        keep=record_may_match,
    )
    if source is None and args.kernel_log != "auto":
        log.warning("kernel log monitor asked for cannot read: %s", why)
        return UnreadableKernelLog(args.kernel_log, why)
    if source is None:
        log.warning("kernel log monitor off: %s", why)
    else:
        log.info("kernel log monitor reading %s", source.name)
    return source


def wants_node_status(args: argparse.Namespace) -> bool:
    if args.report_node_status is not None:
        return bool(args.report_node_status)
    if args.simulate:
        return args.kube_api is not None
    return not args.no_kubernetes


def node_reporter(
    args: argparse.Namespace, node_name: str, monitor: HealthMonitor
) -> NodeReporter | None:
    """A reporter to the API server, or None (logged) when no API server is configured:
    the metrics must not go down for want of somewhere to report."""
    from exporter.sources.kubeapi import KubeApi, KubeConfigError
    from healthcheck.detection.reporter import NodeReporter

    try:
        api = KubeApi(args.kube_api) if args.kube_api else KubeApi.default()
    except (KubeConfigError, ValueError) as e:
        log.warning("not reporting node health to Kubernetes: %s", e)
        return None
    return NodeReporter(api, node_name, monitor)


class NodeConfigError(ValueError):
    """A --config file that cannot be used; the message names the file and the setting."""


class _ConfigParser(argparse.ArgumentParser):
    """The node options as a parser that raises instead of exiting: reads --config settings."""

    def error(self, message: str) -> NoReturn:
        raise NodeConfigError(message)


def config_arguments(parser: argparse.ArgumentParser, settings: Mapping[str, object]) -> list[str]:
    """A --config file's settings as the command-line arguments they stand for, so argparse
    itself checks and converts them: `true` is the flag, `false` its `--no-` form where one
    exists (else nothing: the flag is off by default), a list repeats the option. YAML 1.1
    reads a bare `off`/`on` as a boolean: for an option taking a value it is that word again
    (`kernel-log: off`)."""
    known = parser._option_string_actions
    arguments: list[str] = []
    for key, value in settings.items():
        option = "--" + str(key).replace("_", "-")
        if option == "--config":
            raise NodeConfigError("a config file cannot name another (--config)")
        if option not in known:
            raise NodeConfigError(f"unknown setting {key!r} (not a `topowatch node` option)")
        if isinstance(value, bool) and known[option].nargs != 0:
            arguments.append(f"{option}={'on' if value else 'off'}")
        elif value is True:
            arguments.append(option)
        elif value is False:
            negative = "--no-" + option[2:]
            arguments.extend([negative] if negative in known else [])
        elif isinstance(value, list):
            arguments.extend(f"{option}={item}" for item in value)
        elif value is not None:
            arguments.append(f"{option}={value}")
    return arguments


def apply_node_config(args: argparse.Namespace) -> None:
    """Fill the options the command line left at their defaults from `args.config`."""
    import yaml

    path: Path = args.config
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise NodeConfigError(f"cannot read --config {path}: {e}") from None
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise NodeConfigError(f"--config {path}: expected a mapping of option names to values")
    parser = _ConfigParser(prog=str(path), add_help=False)
    add_node_arguments(parser)
    try:
        defaults = vars(parser.parse_args([]))
        given = vars(parser.parse_args(config_arguments(parser, settings)))
    except NodeConfigError as e:
        raise NodeConfigError(f"--config {path}: {e}") from None
    for dest, value in given.items():
        if value != defaults[dest] and getattr(args, dest) == defaults[dest]:
            setattr(args, dest, value)


def topology_file_labels(path: Path | None, node_name: str) -> dict[str, str]:
    """This node's placement labels from --topology-file, by its name or short hostname; {} and
    a warning when the file does not list it (the agent runs, with empty topology labels).
    `TopologyFileError` for a file that cannot be used."""
    if path is None:
        return {}
    placements = load_placements(path)
    placement = placements.get(node_name) or placements.get(node_name.split(".", 1)[0])
    if placement is None:
        log.warning(
            "--topology-file %s does not list node %s; its topology labels stay empty",
            path,
            node_name,
        )
        return {}
    return placement_labels(placement)


class FileTopologyLabels:
    """Node labels with a topology file's placement beneath them (`under_node_labels`): the
    Node's own labels win where there are any, a Slurm host without a Node reads the file's."""

    def __init__(self, node: NodeLabelsSource, from_file: Mapping[str, str]) -> None:
        self._node = node
        self._from_file = dict(from_file)

    def labels(self) -> Mapping[str, str]:
        return under_node_labels(self._node.labels(), self._from_file)

    def drain_errors(self) -> list[str]:
        return self._node.drain_errors()

    def close(self) -> None:
        self._node.close()


def health_endpoint(args: argparse.Namespace, node_name: str) -> HealthApi:
    """The /api/v1/health endpoint the flags ask for, off without --health-token-file; `OSError`
    or `ValueError` for a token file that cannot be read or is empty."""
    path = args.health_token_file
    return HealthApi(node_name, TokenFile(path) if path is not None else None)


def health_publisher(health: HealthApi, monitor: HealthMonitor | None) -> Callable[[], None]:
    """After each poll, hand the health API what the Node annotation would carry
    (`healthcheck.detection.reporter.published`): one list of findings for both readers. Imported
    here, with the token: an agent that serves no health API never loads the reporter's client."""
    from healthcheck.detection.reporter import published

    def publish() -> None:
        report = monitor.last if monitor is not None else None
        if report is not None:
            health.record(Evaluation(published(report), report.taken_at))

    return publish


def run_slurm_controller(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from exporter.slurm.service import build_service, serve
    from exporter.slurm.settings import SettingsError, load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        service = build_service(load_settings(args.config))
    except (SettingsError, ValueError) as exc:
        print(f"topowatch slurm-controller: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(service, stop, once=args.once)

    asyncio.run(run())
    return 0


def run_node(args: argparse.Namespace) -> int:
    try:
        if args.config is not None:
            apply_node_config(args)
    except NodeConfigError as e:
        print(f"topowatch node: {e}", file=sys.stderr)
        return 2
    node_name = args.node_name or default_node_name()
    if args.no_health and args.report_node_status:
        print("topowatch node: --report-node-status needs the health checks", file=sys.stderr)
        return 2
    if args.no_health and args.health_token_file is not None:
        print("topowatch node: --health-token-file needs the health checks", file=sys.stderr)
        return 2
    try:
        monitor = health_monitor(args)
        file_labels = topology_file_labels(args.topology_file, node_name)
        health = health_endpoint(args, node_name)
    except (ConfigError, TopologyFileError) as e:
        print(f"topowatch node: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError, ValueError) as e:  # the token file; never its content
        print(f"topowatch node: --health-token-file: {e}", file=sys.stderr)
        return 2
    sim = None
    if args.simulate:
        from exporter.sim.faults import FaultSpecError, parse_faults
        from exporter.sim.hardware.node import SimulatedNode
        from exporter.sim.hardware.profiles import get_profile

        try:
            sim = SimulatedNode(
                get_profile(args.simulate),
                parse_faults(args.fault),
                root=args.sim_root,
                seed=args.seed,
            )
        except (ValueError, FaultSpecError) as e:
            print(f"topowatch node: {e}", file=sys.stderr)
            return 2
        sources = sim.sources()
        log.info("simulating %s in %s", sim.profile.instance_type, sim.root)
    elif args.fault:
        print("topowatch node: --fault needs --simulate", file=sys.stderr)
        return 2
    else:
        sources = real_sources(args, node_name)
    checks = custom_check_runner(monitor)
    sources.custom_checks = checks
    sources.kernel_log = kernel_log_source(args, sim)
    if file_labels:
        sources.labels = FileTopologyLabels(sources.labels, file_labels)
    poller = Poller(node_name, sources, compat=args.compat, health=monitor)
    reporter = None
    if monitor is not None and wants_node_status(args):
        reporter = node_reporter(args, node_name, monitor)
    publish = health_publisher(health, monitor) if args.health_token_file is not None else None

    def report(_: object) -> None:
        if publish is not None:
            publish()
        if reporter is not None and monitor is not None:
            reporter.submit(monitor.last)

    agent = NodeAgent(poller, interval=args.interval, on_snapshot=report, extra=health.families)
    try:
        if args.once:
            # Two polls: GPM ratios and rates need two samples, and XIDs need the event
            # waiter registered, which happens once the first poll has enumerated the GPUs.
            agent.on_snapshot = None
            agent.extra = None
            if checks is not None:
                checks.run_all_once()
            agent.poll_once()
            time.sleep(ONCE_SETTLE_SECONDS)
            agent.poll_once()
            if reporter is not None and monitor is not None and monitor.last is not None:
                reporter.report(monitor.last)
            sys.stdout.buffer.write(agent.current.text)
            return 0
        if reporter is not None:
            reporter.start()
        if checks is not None:
            checks.start()
        snapshot = agent.poll_once()
        if not snapshot.gpu.available:
            log.warning(
                "no GPU metrics: %s. Serving the other collectors; use --simulate PROFILE to try "
                "topowatch without a GPU.",
                snapshot.gpu.error,
            )
        host, port = args.listen
        serve(agent, host, port, health)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if reporter is not None:
            reporter.stop()
        sources.close()
        if sim is not None:
            sim.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
