"""`topowatch node`: the node agent's options, its --config file, and the wiring of its
sources, health checks and reporters into the poller it serves.

This module is what runs on every GPU node, and every `topowatch` invocation imports it to build
the parser. So it loads only the agent's own small import set at module level; the simulation,
the Kubernetes reporter, the custom-check runner and the kernel-log reader are imported inside
the functions that need them, when the flags ask for them (tests/test_architecture.py checks
the deployed agent's import set at run time).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from exporter.cli.common import DEFAULT_NODE_PORT, log, parse_listen
from exporter.node.agent import NodeAgent
from exporter.node.health_api import Evaluation
from exporter.node.poller import COMPAT_MODES, NodeSources, Poller
from exporter.node.serving import HealthApi, TokenFile, serve
from exporter.sources.topology_file import FileTopologyLabels, topology_file_labels
from exporter.topology.files import TopologyFileError
from healthcheck.detection.config import ConfigError, HealthConfig, load_config
from healthcheck.detection.monitor import HealthMonitor

if TYPE_CHECKING:
    from exporter.sim.hardware.node import SimulatedNode
    from exporter.sources.custom_checks import CustomCheckRunner
    from exporter.sources.interfaces import KernelLogSource
    from healthcheck.detection.reporter import NodeReporter
    from healthcheck.detection.xid_state import XidStateFile

__all__ = [
    "SIMULATED_PROFILES",
    "NodeConfigError",
    "add_node_arguments",
    "add_node_parser",
    "apply_node_config",
    "config_arguments",
    "custom_check_runner",
    "default_node_name",
    "health_endpoint",
    "health_monitor",
    "health_publisher",
    "kernel_log_source",
    "node_reporter",
    "parse_compat",
    "real_sources",
    "run_node",
    "wants_node_status",
]

ONCE_SETTLE_SECONDS = 1.0
# Named here rather than read from exporter.sim, so that a node agent on real hardware never
# loads the simulation; tests/test_architecture.py checks the list against the simulation's
# profiles.
SIMULATED_PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")
DEFAULT_JOURNAL_DIRS = (Path("/var/log/journal"), Path("/run/log/journal"))


def parse_compat(value: str) -> frozenset[str]:
    """`--compat dcgm,efa` as a set of modes; an unknown one is a usage error naming the
    choices, at parse time rather than after the first poll."""
    modes = frozenset(m.strip() for m in value.split(",") if m.strip())
    unknown = modes - COMPAT_MODES
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown compat mode(s) {', '.join(sorted(unknown))};"
            f" choose from {', '.join(sorted(COMPAT_MODES))}"
        )
    return modes


def _seconds(positive: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds, > 0 or >= 0."""

    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
        if seconds < 0 or (positive and seconds == 0) or seconds != seconds:
            raise argparse.ArgumentTypeError(
                f"must be {'more than' if positive else 'at least'} 0 seconds, got {value}"
            )
        return seconds

    return parse


def default_node_name() -> str:
    """The node's name without --node-name: $NODE_NAME (the chart sets it from the pod's
    spec.nodeName), else the hostname (a Slurm or bare-metal host)."""
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
    node.add_argument(
        "--nvml-deadline",
        type=_seconds(positive=True),
        default=3.0,
        metavar="S",
        help="how long a poll waits for NVML: a call not returned by then is served as hung "
        "(the GPU it hangs on down, the others' last values stale) and the poll goes on "
        "(default: 3)",
    )
    node.add_argument(
        "--nvml-energy-interval",
        type=_seconds(positive=False),
        default=120.0,
        metavar="S",
        help="read total energy every S seconds, the last value served in between (~4 ms a "
        "GPU on an H100; 0: every poll; default: 120)",
    )
    node.add_argument(
        "--nvml-gpm-interval",
        type=_seconds(positive=False),
        default=60.0,
        metavar="S",
        help="GPM profiling ratios over windows of S seconds, the last served in between "
        "(~2 ms a GPU on an H100; 0: every poll; default: 60)",
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
        "replays old lines nor loses new ones, and the XIDs the health checks hold, so it still "
        "reports them (default: none; every start begins at the end, holding nothing)",
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


def add_node_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `node` sub-command, run by `run_node`."""
    node = sub.add_parser(
        "node",
        help="the node agent: GPU, NVLink, EFA, NUMA and topology metrics",
        description="Poll NVML, sysfs, the kubelet and the node's labels; serve /metrics.",
    )
    add_node_arguments(node)
    node.set_defaults(func=run_node)


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


def real_sources(args: argparse.Namespace, node_name: str) -> NodeSources:
    """The hardware and Kubernetes sources of a real node; with --no-kubernetes, no Node labels
    and no kubelet, since a Slurm or bare-metal host has neither (and the kubelet client, whose
    gRPC stubs refuse to load under grpcio < 1.85.1, is not even imported)."""
    from exporter.sources.kube import StaticNodeLabels, node_labels_source
    from exporter.sources.nvml import NvmlGpuSource

    gpu = NvmlGpuSource(
        deadline=args.nvml_deadline,
        energy_interval=args.nvml_energy_interval,
        gpm_interval=args.nvml_gpm_interval,
    )
    gpu.start()
    if args.no_kubernetes:
        return NodeSources(
            gpu=gpu,
            labels=StaticNodeLabels({}),
            sysfs_root=args.sysfs_root,
            proc_root=args.proc_root,
        )
    from exporter.sources.podresources import KubeletPodResources

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


def xid_state(directory: Path, sim: SimulatedNode | None) -> XidStateFile:
    """The file the XIDs the health checks hold live in, beside the kernel log's cursor: a
    restarted agent keeps them in the same boot (healthcheck/detection/xid_state.py)."""
    from exporter.sources.kmsg import real_boot_id
    from healthcheck.detection.xid_state import XID_STATE_FILE, XidStateFile

    try:
        boot_id = sim.kernel_log.boot_id if sim is not None else real_boot_id()
    except OSError as e:
        log.warning("cannot read the boot id (%s): held XIDs are not carried over a restart", e)
        boot_id = ""
    return XidStateFile(directory / XID_STATE_FILE, boot_id)


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
    """Whether to report health to the Node: as --report-node-status says, else wherever there
    is a Node to report to (a simulation has one only when --kube-api names a server)."""
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


def run_node(args: argparse.Namespace) -> int:
    """Run the node agent: serve until interrupted, or print one exposition with --once.
    Exit 2, with the reason on stderr, for flags or files it cannot use."""
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
    if monitor is not None and args.kernel_log_state is not None:
        monitor.keep_xids(xid_state(args.kernel_log_state, sim))
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
