"""`topowatch demo`: the whole system on the simulation, in one process.

A simulated HyperPod cluster behind a list/watch API server, a node agent per simulated node
whose labels and pods follow the cluster, and the cluster service reading it all through the
production informers; a Prometheus scraping everything and evaluating the project's alert
rules, when one is installed.

So every part has something to show at once: the cluster has run for `HISTORY_S` when the demo
starts serving (preemptions, finished and pending workloads are there in the first minute); the
simulated HyperPod carries out the reboots and replacements its health label asks for (with
`--remediate` the controller sets it), so the remediation lifecycle reaches its end; the demo
prints the node names and two ready-made commands that restart it with a fault, and a line for
each alert that starts firing.

The ClusterQueues list the `topowatch-node-health` AdmissionCheck and the cluster service runs
its controller in enforce mode (the demo's choice; the product's default is observe): a
workload whose quota Kueue reserves on a node with a published finding gets Retry, Kueue
evicts and requeues it, and the demo prints `admission steered NS/NAME away from node ...`
(and where it lands). `admission_check=False` (`--no-admission-check`) turns it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.run import controller_from_mapping, kube_api_client, serve_cluster
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import status_of
from exporter.sim.demo_prometheus import (
    DEFAULT_PORT,
    AlertSummary,
    DemoPrometheus,
    start_prometheus,
)
from exporter.sim.environment import HyperPodRepair, NodeAgentFleet, SimulatedEnvironment
from exporter.sim.faults import Fault
from exporter.sim.hyperpod_layout import SimNode
from exporter.sim.kueue import checks as kc
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.kueue.decisions import DecisionLog

log = logging.getLogger(__name__)

# Ctrl-C or SIGTERM to exit: the node agents, the simulation and Prometheus get this long, all
# together, once the cluster service has stopped (normally well under a second).
STOP_TIMEOUT_S = 1.5
# The simulated cluster has run this long when the demo starts serving (2 s steps, about a
# second of CPU): the first preemptions happen ~1 minute into a run.
HISTORY_S = 600.0
# Options a printed restart command replaces rather than repeats (with their values).
_REPLACED = {"--fault": True, "--remediate": False, "--duration": True}


def cli_command(argv0: str | None = None) -> list[str]:
    """The `topowatch` command by its full path, as a person can paste it anywhere: the
    script this process runs, else the one on PATH, else the one beside this Python (a
    virtual environment's bin/), else `python -m exporter.cli` by the interpreter's path."""
    started = Path(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    if started.name == "topowatch" and started.is_file():
        return [str(started.absolute())]
    found = shutil.which("topowatch")
    if found:
        return [str(Path(found).absolute())]
    beside = Path(sys.executable).parent / "topowatch"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [sys.executable, "-m", "exporter.cli"]


def restart_args(argv: Sequence[str], seed: int) -> list[str]:
    """This run's `demo` arguments less --fault, --remediate and --duration, so a printed
    restart line keeps its ports and seed (the node names follow the seed); just `demo` (and
    its seed) when the process was not started as `topowatch ... demo ...`."""
    args = list(argv)
    if "demo" not in args:
        return ["demo", *(["--seed", str(seed)] if seed else [])]
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _REPLACED:
            skip = _REPLACED[name] and "=" not in arg
            continue
        kept.append(arg)
    return kept


def fault_commands(
    cli: Sequence[str], args: Sequence[str], nodes: Sequence[SimNode], busy: Sequence[str] = ()
) -> list[str]:
    """Two commands that restart the demo with a fault and the controller acting: XID 79 on
    GPU 3 (a node reboot) and a failed row remap on GPU 1 (out of spare rows: a replacement),
    each firing its alert at once, on two nodes running work where there are (`busy`, by
    preference). Both GPUs exist on every profile (p5: 8 GPUs, p6e-gb200: 4)."""
    names = [n.name for n in nodes]
    picked = [n for n in busy if n in names] + [n for n in names if n not in busy]
    if not picked:
        return []
    first, second = picked[0], picked[1 if len(picked) > 1 else 0]
    commands = []
    for node, spec in ((first, "xid=79@gpu3"), (second, "remap-failure@gpu1")):
        line = [*cli, *args, "--remediate", "--fault", f"node={node}:{spec}"]
        commands.append(" ".join(shlex.quote(part) for part in line))
    return commands


def steer_command(
    cli: Sequence[str], args: Sequence[str], nodes: Sequence[SimNode], busy: Sequence[str] = ()
) -> str | None:
    """A command that restarts the demo with XID 79 on GPU 3 of an idle node (one without
    running work, where Kueue places the next workloads) and remediation observing: the node
    keeps its finding and stays schedulable, so the admission check answers Retry for each
    workload Kueue places there, and it lands elsewhere."""
    idle = [n.name for n in nodes if n.name not in busy]
    if not idle:
        return None
    line = [*cli, *args, "--fault", f"node={idle[0]}:xid=79@gpu3"]
    return " ".join(shlex.quote(part) for part in line)


def node_summary(nodes: Sequence[SimNode], per_type: int = 3) -> list[str]:
    """The node names by instance type: the first few of each, and how many there are."""
    by_type: dict[str, list[str]] = {}
    for node in nodes:
        by_type.setdefault(node.instance_type, []).append(node.name)
    lines = []
    for instance_type, names in sorted(by_type.items()):
        more = f" ... ({len(names)} in all)" if len(names) > per_type else ""
        lines.append(f"{instance_type}: {', '.join(names[:per_type])}{more}")
    return lines


def busy_nodes(service: ClusterService) -> list[str]:
    """Nodes where pods of an admitted workload hold GPUs, the busiest first."""
    with service.lock:
        held: dict[str, int] = {}
        for pod in service.model.pods.values():
            if pod.node and pod.holds_gpus:
                held[pod.node] = held.get(pod.node, 0) + pod.gpus
    return sorted(held, key=lambda n: (-held[n], n))


def example_workload(service: ClusterService) -> str | None:
    """A workload worth explaining: one that was preempted, else pending, else any."""
    with service.lock:
        model = service.model
        for record in reversed(list(model.ledger)):
            if (record.victim_namespace, record.victim_name) in model.workloads:
                return record.victim
        for state in model.workloads.values():
            if status_of(state.workload) == "pending":
                return f"{state.workload.namespace}/{state.workload.name}"
        for key in model.workloads:
            return f"{key[0]}/{key[1]}"
    return None


class SteeringLog:
    """A line for each workload the admission check steers: Kueue evicted it on the check's
    Retry (`admission steered NS/NAME away from node X: XID 79 on GPU 3 since ...`), and one
    when it is admitted again (`NS/NAME admitted after the check's Retry: ...`). Runs as a hook
    after each simulation step (`SimulatedEnvironment.after_step`), reading the decision log."""

    _HELD = re.compile(r'"[^"]*" \((.*)\)$')

    def __init__(
        self, log: DecisionLog, out: TextIO, nodes_of: Callable[[str], list[str]] | None = None
    ) -> None:
        self.log = log
        self.out = out
        self.nodes_of = nodes_of  # workload key -> the nodes it was placed on
        self.seen = len(log.decisions)
        self.steered: set[str] = set()

    def __call__(self) -> None:
        new = self.log.decisions[self.seen :]
        self.seen += len(new)
        for d in new:
            if d.kind == "evicted" and d.cause == kc.CAUSE:
                found = self._HELD.search(d.message)
                why = found.group(1) if found else d.message
                print(f"admission steered {d.workload} away from {why}", file=self.out)
                self.steered.add(d.workload)
            elif d.kind == "admitted" and d.workload in self.steered:
                self.steered.discard(d.workload)
                nodes = self.nodes_of(d.workload) if self.nodes_of is not None else []
                where = ", ".join(nodes or d.domains or (d.flavor,))
                print(f"  {d.workload} admitted after the check's Retry, on {where}", file=self.out)
            else:
                continue
            self.out.flush()


def run_demo(
    host: str,
    port: int,
    node_port_base: int,
    faults: Sequence[Fault],
    seed: int,
    duration: float | None,
    with_agents: bool = True,
    remediate: bool = False,
    out: TextIO = sys.stdout,
    prometheus_port: int = DEFAULT_PORT,
    history_s: float = HISTORY_S,
    repair: HyperPodRepair | None = None,
    argv: Sequence[str] | None = None,
    until: threading.Event | None = None,
    admission_check: bool = True,
) -> int:
    """`remediate` lets the controller act (HyperPod labels on the simulated nodes); without
    it the controller only decides and audits, as `topowatch cluster` does by default.
    `prometheus_port` (0: none) runs a Prometheus scraping everything and evaluating the alert
    rules, for the dashboards. `history_s`: how long the cluster has run when serving starts;
    `repair`: how the simulated HyperPod carries out its label (default `HyperPodRepair()`).
    `argv`: this process's arguments, which the printed restart commands keep; `until`: set,
    it stops the demo as --duration would (tests). `admission_check`: the ClusterQueues list
    the node-health AdmissionCheck and the service's controller enforces it."""
    env = SimulatedEnvironment(
        seed=seed,
        repair=repair or HyperPodRepair(),
        history_s=history_s,
        admission_checks=AdmissionChecks() if admission_check else None,
    ).start()
    if admission_check:
        env.after_step.append(SteeringLog(env.cluster.decisions, out, env.cluster.placement))
    fleet = None
    try:
        if with_agents:
            fleet = NodeAgentFleet(
                env,
                host=host,
                port_base=node_port_base,
                interval=5.0,
                faults=faults,
                report_url=env.url,
            )
            fleet.start()
        elif faults:
            raise ValueError("--fault needs the node agents")
    except Exception:
        env.stop()
        raise
    stop = asyncio.Event()
    prometheus: list[DemoPrometheus] = []
    alerts: list[AlertSummary] = []
    cli = cli_command()
    args = restart_args(sys.argv[1:] if argv is None else argv, seed)

    def started(bound: int, service: ClusterService) -> None:
        base = f"http://{host}:{bound}"
        nodes = env.cluster.nodes()
        history = f", {history_s / 60:g} minutes of history" if history_s else ""
        print(
            f"topowatch demo: simulated HyperPod cluster, {len(nodes)} nodes{history}",
            file=out,
        )
        print(f"  Kubernetes API (simulated): {env.url}", file=out)
        print(f"  cluster metrics:  {base}/metrics", file=out)
        print(f"  API:              {base}/api/v1/topology  {base}/api/v1/preemptions", file=out)
        print(f"  topology view:    {base}/ui/topology  {base}/ui/preemptions", file=out)
        print(
            f"  goodput:          {base}/ui/goodput  {base}/api/v1/goodput"
            f"  {base}/api/v1/interruptions",
            file=out,
        )
        mode = "act (HyperPod labels)" if remediate else "observe (--remediate to act)"
        print(f"  remediation:      {mode}, {base}/api/v1/remediation", file=out)
        if admission_check:
            print(
                f"  admission check:  {kc.NODE_HEALTH_CHECK}, enforce"
                f" (--no-admission-check: off), {base}/api/v1/admission",
                file=out,
            )
        for i, line in enumerate(node_summary(nodes)):
            print(f"  {'nodes:' if i == 0 else '':18}{line}", file=out)
        if fleet is not None and fleet.agents:
            first, last = fleet.agents[0], fleet.agents[-1]
            print(f"  node agents:      {len(fleet.agents)}, {first.url} .. {last.url}", file=out)
        if faults:
            print(f"  faults injected:  {', '.join(str(f) for f in faults)}", file=out)
        if prometheus_port:
            scrape_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
            agents = fleet.agents if fleet is not None else []
            node_targets = [f"{scrape_host}:{a.server.port}" for a in agents]
            running = start_prometheus(prometheus_port, f"{scrape_host}:{bound}", node_targets, out)
            if running is not None:
                prometheus.append(running)
                if running.rules:
                    alerts.append(AlertSummary(running, out).start())
        threading.Thread(target=announce_example, args=(service, base), daemon=True).start()
        loop = asyncio.get_running_loop()
        if duration is not None:
            loop.call_later(duration, stop.set)
        if until is not None:

            def relay(done: threading.Event) -> None:
                done.wait()
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(stop.set)

            threading.Thread(target=relay, args=(until,), daemon=True).start()
        out.flush()

    def announce_example(service: ClusterService, base: str) -> None:
        if service.informers is not None:
            service.informers.wait_synced(30)
        target = example_workload(service)
        command = " ".join(shlex.quote(part) for part in cli)
        if target:
            print(f"  try:              {command} explain --server {base} {target}", file=out)
        if fleet is not None:
            lines = fault_commands(cli, args, env.cluster.nodes(), busy_nodes(service))
            if lines:
                print(
                    "  inject a fault:   restart with one (the controller acts on it, HyperPod"
                    " reboots or replaces the node, the alert fires):",
                    file=out,
                )
                for line in lines:
                    print(f"    {line}", file=out)
            steer = steer_command(cli, args, env.cluster.nodes(), busy_nodes(service))
            if steer and admission_check:
                print(
                    "  or on an idle node, remediation observing (the admission check steers"
                    " new work away from it):",
                    file=out,
                )
                print(f"    {steer}", file=out)
        print("Ctrl-C stops everything.", file=out)
        out.flush()

    client = kube_api_client(env.url)
    controller = controller_from_mapping(
        {"mode": "act" if remediate else "observe", "providers": ["hyperpod"]}, client
    )
    try:
        admission = AdmissionSettings(enabled=True, mode="enforce") if admission_check else None
        serve_cluster(
            client,
            host,
            port,
            on_started=started,
            stop=stop,
            controller=controller,
            admission=admission,
        )
    finally:
        for summary in alerts:
            summary.stop(timeout=0.2)
        stop_everything(prometheus, fleet, env)
    return 0


def stop_everything(
    prometheus: Sequence[DemoPrometheus],
    fleet: NodeAgentFleet | None,
    env: SimulatedEnvironment,
    timeout: float = STOP_TIMEOUT_S,
) -> None:
    """Stop what the cluster service does not own, within one deadline: Prometheus is sent
    SIGTERM first and shuts down while the node agents stop (all of them at once), then the
    simulation; Prometheus is killed if it has not exited by the deadline."""
    deadline = time.monotonic() + timeout
    for running in prometheus:
        running.terminate()
    try:
        if fleet is not None:
            fleet.close(timeout=deadline - time.monotonic())
        env.stop(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for running in prometheus:
            running.stop(timeout=deadline - time.monotonic())
