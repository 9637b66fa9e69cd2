"""The simulated cluster behind a faithful API server, stepping in real time.

`topowatch cluster --simulate` and `topowatch demo` run the production informers against this;
nothing downstream can tell it from a real kube-apiserver except by its address.

The simulation is one writer of Nodes among several, as HyperPod is: node agents write their
findings annotation and TopowatchHealthy condition, topowatch's remediation controller its state
annotation and HyperPod's health label. Its own writes are merged three ways (what it wrote
last, what it writes now, what the store holds), so it changes only what it changed and never
wipes what others wrote. With `repair` on, the simulated HyperPod acts on the health label
whoever wrote it: it reboots or replaces the node a little later, the node comes back
Schedulable with a new boot ID, and the node agent there starts afresh (its faults gone).
With `history_s`, the simulation has already run that long when it starts serving, so the
preemptions, workloads and pages have something to show in the first minute.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from exporter.core.snapshot import NodeSnapshot, PodRef
from exporter.node.agent import NodeAgent
from exporter.node.poller import NodeSources, Poller
from exporter.node.serving import MetricsServer
from exporter.sim.cluster import ClusterShape, SimulatedCluster, default_shape
from exporter.sim.faults import Fault
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sim.kubeapi.store import StoredEntry
from exporter.sim.kueue import checks as kueue_checks
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.node_faults import FaultKind, FaultRates
from exporter.sources.kubeapi import KubeApi
from exporter.topology.labels import HEALTH_STATUS_KEY
from healthcheck.detection.config import HealthConfig
from healthcheck.detection.monitor import HealthMonitor
from healthcheck.detection.reporter import NodeReporter

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0  # NodeAgentFleet.close: how long to wait for every agent to stop


def _submitter(
    monitor: HealthMonitor, reporter: NodeReporter | None
) -> Callable[[NodeSnapshot], None] | None:
    """Hand each poll's health verdict to the reporter's thread (the poll never waits)."""
    if reporter is None:
        return None
    return lambda _: reporter.submit(monitor.last)


def run_concurrently(tasks: Mapping[str, Callable[[], None]], deadline: float) -> list[str]:
    """Run each task on its own daemon thread and wait for all of them together, until
    `deadline` (a time.monotonic() value) at the latest. Returns the names of the tasks still
    running then (left to finish, or not, on their own); a task that raises is logged."""

    def guarded(name: str, task: Callable[[], None]) -> None:
        try:
            task()
        except Exception:
            log.exception("stopping %s failed", name)

    threads = {
        name: threading.Thread(target=guarded, args=(name, task), name=f"stop {name}", daemon=True)
        for name, task in tasks.items()
    }
    for thread in threads.values():
        thread.start()
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    return [name for name, thread in threads.items() if thread.is_alive()]


Obj = dict[str, Any]


def merge3(base: Obj | None, ours: Obj, theirs: Obj | None) -> Obj:
    """`ours` (a Node the simulation writes) merged into `theirs` (the Node as stored): each
    label, annotation, spec and status field, and each status condition by type, is ours where
    ours differs from `base` (what the simulation wrote last), else theirs. So a label,
    annotation or condition another writer set survives until the simulation changes that
    very field. Without a base or a stored object, ours as it is. Never changes its inputs."""
    if base is None or theirs is None:
        return ours
    merged = copy.deepcopy(theirs)
    merged["apiVersion"], merged["kind"] = ours.get("apiVersion"), ours.get("kind")
    meta = merged.setdefault("metadata", {})
    for part in ("labels", "annotations"):
        meta[part] = _merge_map(
            base.get("metadata", {}).get(part), ours["metadata"].get(part), meta.get(part)
        )
        if not meta[part]:
            del meta[part]
    merged["spec"] = _merge_map(base.get("spec"), ours.get("spec"), merged.get("spec"))
    base_status, our_status = base.get("status") or {}, ours.get("status") or {}
    their_status = merged.get("status") or {}
    status = _merge_map(base_status, our_status, their_status, skip="conditions")
    status["conditions"] = _merge_conditions(
        base_status.get("conditions"),
        our_status.get("conditions"),
        their_status.get("conditions"),
    )
    merged["status"] = status
    return merged


def _merge_map(base: object, ours: object, theirs: object, skip: str = "") -> Obj:
    b = base if isinstance(base, dict) else {}
    o = ours if isinstance(ours, dict) else {}
    out = copy.deepcopy(theirs) if isinstance(theirs, dict) else {}
    for key in set(b) | set(o):
        if key == skip or o.get(key) == b.get(key):
            continue
        if key in o:
            out[key] = copy.deepcopy(o[key])
        else:
            out.pop(key, None)
    return out


def _merge_conditions(base: object, ours: object, theirs: object) -> list[Obj]:
    def by_type(conditions: object) -> dict[str, Obj]:
        found = conditions if isinstance(conditions, list) else []
        return {str(c.get("type")): c for c in found if isinstance(c, dict)}

    b, o, merged = by_type(base), by_type(ours), by_type(theirs)
    for kind in set(b) | set(o):
        if o.get(kind) == b.get(kind):
            continue
        if kind in o:
            merged[kind] = copy.deepcopy(o[kind])
        else:
            merged.pop(kind, None)
    return list(merged.values())


class SharedNodes:
    """The ObjectStore as the simulated cluster's writer, Nodes merged three ways (`merge3`)
    with what the other writers put there; every other kind written as it is."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._written: dict[str, Obj] = {}  # node -> what the simulation wrote last
        self._checks: dict[tuple[str, str], list[Obj]] = {}  # workload -> admissionChecks

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """What the store holds (the simulation reads check controllers' verdicts back)."""
        return self.store.get(plural, namespace, name)

    def upsert(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        if plural == "workloads":
            return self._upsert_workload(obj)
        if plural != "nodes":
            return self.store.upsert(plural, obj)
        resource = self.store.resource(plural)
        ours = self.store.prepare(resource, obj)
        name = ours["metadata"]["name"]
        base = self._written.get(name)

        def build(current: StoredEntry | None) -> Obj:
            return merge3(base, ours, current.copy() if current is not None else None)

        entry, _ = self.store.write(resource, ("", name), build)
        self._written[name] = copy.deepcopy(ours)
        return entry.copy()

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        if plural == "nodes":
            self._written.pop(name, None)
        self._checks.pop((namespace, name), None)
        return self.store.delete(plural, namespace, name)

    def _upsert_workload(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A Workload, its status.admissionChecks merged three ways in one atomic write: a
        check controller's verdict patched since the simulation's last write survives it."""
        checks = (obj.get("status") or {}).get("admissionChecks")
        if not checks:
            meta = obj.get("metadata") or {}
            self._checks.pop((meta.get("namespace", ""), meta.get("name", "")), None)
            return self.store.upsert("workloads", obj)
        resource = self.store.resource("workloads")
        ours = self.store.prepare(resource, obj)
        key = ObjectStore.key_of(resource, ours)
        base = self._checks.get(key)

        def build(current: StoredEntry | None) -> Obj:
            if current is None or base is None:
                return ours
            theirs = (current.obj.get("status") or {}).get("admissionChecks") or []
            merged = kueue_checks.merge_entries(base, checks, theirs)
            return {**ours, "status": {**ours["status"], "admissionChecks": merged}}

        entry, _ = self.store.write(resource, key, build)
        self._checks[key] = copy.deepcopy(checks)
        return entry.copy()


REBOOT_LABEL = "UnschedulablePendingReboot"
REPLACE_LABEL = "UnschedulablePendingReplacement"


@dataclass(frozen=True, slots=True)
class HyperPodRepair:
    """How the simulated HyperPod carries out the reboot or replacement its health label asks
    for (seconds, drawn uniformly): it starts `start_s` after the label, and the node is back
    (Schedulable, a new boot ID, its agent fresh) `reboot_s` or `replace_s` after that. The
    demo's: long enough to look at the node pending its reboot, short enough to see the
    lifecycle end within minutes; HyperPod's own take longer (exporter/sim/node_faults.py)."""

    start_s: tuple[float, float] = (30.0, 60.0)
    reboot_s: tuple[float, float] = (60.0, 120.0)
    replace_s: tuple[float, float] = (120.0, 240.0)

    def kinds(self) -> dict[str, FaultKind]:
        """The health label's value -> the repair it asks for, as the node_faults mix
        spells a repair (true cause: remediation, component unknown to HyperPod)."""
        kind = partial(FaultKind, share=0.0, component="", check="", where="node", severity="")
        return {
            REBOOT_LABEL: kind(
                name="requested_reboot", action="reboot", evidence="", repair="reboot",
                repair_s=self.reboot_s,
            ),
            REPLACE_LABEL: kind(
                name="requested_replacement", action="replace", evidence="", repair="replace",
                repair_s=self.replace_s,
            ),
        }  # fmt: skip


class SimulatedEnvironment:
    def __init__(
        self,
        seed: int = 0,
        tick: float = 1.0,
        shape: ClusterShape | None = None,
        clock: Callable[[], float] = time.time,
        faults: FaultRates | None = None,
        repair: HyperPodRepair | None = None,
        history_s: float = 0.0,
        history_step_s: float = 2.0,
        admission_checks: AdmissionChecks | None = None,
    ) -> None:
        """`faults`: nodes fail at these rates (Meta's mix, scaled), HyperPod repairs them and
        auto-resumes the jobs (exporter/sim/node_faults.py); `cluster.truth` records it.
        `repair`: HyperPod carries out the reboots and replacements its health label asks for,
        whoever set it (faults on at rate 0 when `faults` is None: the repair path is theirs).
        `history_s`: the cluster has run that long, in `history_step_s` steps, when `start`
        returns. `admission_checks`: the ClusterQueues list these AdmissionChecks and the
        simulated Kueue waits for their controllers' verdicts in the store
        (exporter/sim/kueue/checks.py)."""
        if repair is not None and faults is None:
            faults = FaultRates(scale=0.0, remediation_per_1000_node_days=0.0)
        self.store = ObjectStore()
        self.clock = clock
        self.history_s = max(0.0, history_s)
        self.history_step_s = max(0.1, history_step_s)
        self.cluster = SimulatedCluster(
            SharedNodes(self.store),
            shape or default_shape(),
            seed=seed,
            start=clock() - self.history_s,
            faults=faults,
            admission_checks=admission_checks,
        )
        self.server = FakeApiServer(self.store)
        self.tick = tick
        self.repair = repair
        self._repairs = repair.kinds() if repair is not None else {}
        self.after_step: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> SimulatedEnvironment:
        self.cluster.bootstrap()
        self._run_history()
        self.server.start()
        self._thread = threading.Thread(target=self._run, name="topowatch-sim", daemon=True)
        self._thread.start()
        return self

    def _run_history(self) -> None:
        """Step from the cluster's start up to now, before anyone watches: what happened then
        is in the store (Workloads' conditions, Events) as any cluster's past is."""
        if not self.history_s:
            return
        end = self.clock()  # then the stepping thread carries on in real time
        t = end - self.history_s
        while t < end:
            t = min(end, t + self.history_step_s)
            self.cluster.step(t)
            # No check controller watches the past: the simulation answers its checks as one
            # would (`SimulatedCluster.stand_in_checks`), or nothing would have run.
            self.cluster.stand_in_checks()

    def follow_health_labels(self) -> None:
        """HyperPod reads its health label on every Node: one another writer set to ask for a
        reboot or replacement is carried out (`SimulatedCluster.hyperpod_label`)."""
        if self.repair is None:
            return
        for node in self.cluster.nodes():
            entry = self.store.entry("nodes", ("", node.name))
            health = entry.labels.get(HEALTH_STATUS_KEY, "") if entry is not None else ""
            kind = self._repairs.get(health)
            if kind is not None and self.cluster.hyperpod_label(
                node.name, health, kind, self.repair.start_s
            ):
                log.info("simulated HyperPod: %s on %s", kind.name.replace("_", " "), node.name)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop stepping (waiting up to `timeout` s for a step under way), then the API server."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, timeout))
        self.server.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                self.follow_health_labels()
                self.cluster.step(self.clock())
            except Exception:  # a simulation bug must not take the demo down
                log.exception("simulation step failed")
            for hook in self.after_step:
                try:
                    hook()
                except Exception:
                    log.exception("simulation hook failed")


@dataclass
class SimulatedNodeAgent:
    name: str
    node: SimulatedNode
    sources: NodeSources
    agent: NodeAgent
    server: MetricsServer
    thread: threading.Thread | None = None
    monitor: HealthMonitor | None = None
    reporter: NodeReporter | None = None
    boot: str = ""  # the Node's boot ID this agent started under
    seed: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/metrics"


class NodeAgentFleet:
    """One node agent per simulated node, in this process, each on its own port.

    Labels and pods follow the cluster simulation, so a GPU's `pod` label names the pod the
    cluster bound to that node. When the simulated HyperPod reboots or replaces a node (a new
    boot ID), its agent starts afresh on the same port: a new simulated node without the
    faults it was given, a new poller, health monitor and reporter, as after a real reboot.
    """

    def __init__(
        self,
        env: SimulatedEnvironment,
        host: str = "127.0.0.1",
        port_base: int = 0,
        interval: float = 15.0,
        faults: Sequence[Fault] = (),
        seed: int = 0,
        health: HealthConfig | None = None,
        report_url: str | None = None,
    ) -> None:
        """Each agent runs the health checks (`health` thresholds, default built-in); with
        `report_url` (the simulated API server) each also reports its Node's health there."""
        self.env = env
        self.interval = interval
        self.health = health
        self.report_url = report_url
        self.agents: list[SimulatedNodeAgent] = []
        self.reboots = 0  # agents started afresh after a reboot or replacement
        self._lock = threading.Lock()  # a reboot swaps an agent's parts; close reads them
        self._started = False  # restarts wait for `start`: it starts every agent once
        self._closed = False
        self._retiring: list[threading.Thread] = []
        for i, sim_node in enumerate(env.cluster.nodes()):
            mine = [f for f in faults if f.node == sim_node.name]
            node, sources, monitor, reporter, agent = self._parts(sim_node.name, mine, seed + i)
            server = MetricsServer(agent, host, port_base + i if port_base else 0)
            self.agents.append(
                SimulatedNodeAgent(
                    sim_node.name,
                    node,
                    sources,
                    agent,
                    server,
                    monitor=monitor,
                    reporter=reporter,
                    boot=env.cluster.boot_id(sim_node.name),
                    seed=seed + i,
                )
            )
        names = [a.name for a in self.agents]
        unnamed = [f for f in faults if f.node is None]
        unknown = sorted({f.node for f in faults if f.node is not None} - set(names))
        if unnamed or unknown:
            self.close()
            example = f"node={names[0]}:xid=79@gpu3" if names else "node=NAME:xid=79@gpu3"
            what = (
                "a --fault without node=NAME (the demo runs several nodes)"
                if unnamed
                else f"--fault names unknown node(s): {', '.join(unknown)}"
            )
            raise ValueError(
                f"{what}; write it as {example}. The nodes: {', '.join(names[:4])}"
                + (f" ... ({len(names)} in all)" if len(names) > 4 else "")
            )
        env.after_step.append(self.sync_pods)
        env.after_step.append(self.follow_boots)

    def _parts(
        self, name: str, faults: Sequence[Fault], seed: int
    ) -> tuple[SimulatedNode, NodeSources, HealthMonitor, NodeReporter | None, NodeAgent]:
        """A simulated node named `name` with `faults` and the agent watching it."""
        sim_node = next(n for n in self.env.cluster.nodes() if n.name == name)
        node = SimulatedNode(get_profile(sim_node.instance_type), faults, seed=seed)
        node.labels.set(dict(sim_node.labels))
        sources = node.sources()
        monitor = HealthMonitor(self.health)
        reporter = None
        if self.report_url is not None:
            reporter = NodeReporter(KubeApi(self.report_url), name, monitor)
        agent = NodeAgent(
            Poller(name, sources, health=monitor),
            interval=self.interval,
            on_snapshot=_submitter(monitor, reporter),
        )
        return node, sources, monitor, reporter, agent

    def follow_boots(self) -> None:
        """Start afresh the agent of each node that has booted since it started (the
        simulation's `after_step` hook; once the fleet has started)."""
        if not self._started:  # read without the lock: `start` sets it last
            return
        for member in self.agents:
            boot = self.env.cluster.boot_id(member.name)
            if boot != member.boot:
                self.restart(member, boot)

    def restart(self, member: SimulatedNodeAgent, boot: str) -> None:
        """`member`'s node rebooted: a new simulated node (no faults), poller, monitor and
        reporter, served on the same port; the old ones stop in the background."""
        with self._lock:
            if self._closed:
                return
            old_agent, old_reporter = member.agent, member.reporter
            old_agent.request_stop()
            if old_reporter is not None:  # no stale verdict written after the new agent's
                old_reporter.stop()
            node, sources, monitor, reporter, agent = self._parts(member.name, (), member.seed)
            old_sources, old_node = member.sources, member.node
            member.node, member.sources, member.agent = node, sources, agent
            member.monitor, member.reporter, member.boot = monitor, reporter, boot
            self.sync_pods()
            if reporter is not None:
                reporter.start()
            agent.poll_once()
            agent.start()
            member.server.agent = agent
            self.reboots += 1
            retire = threading.Thread(
                target=_retire,
                args=(old_agent, old_sources, old_node, old_reporter),
                name=f"retire {member.name}",
                daemon=True,
            )
            self._retiring.append(retire)
            retire.start()
        log.info("node agent on %s started afresh after its node booted", member.name)

    def start(self) -> None:
        with self._lock:  # no restart meanwhile: one starts from here on
            self.sync_pods()
            for member in self.agents:
                if member.reporter is not None:
                    member.reporter.start()
                member.agent.poll_once()
                member.agent.start()
                member.thread = threading.Thread(
                    target=member.server.serve_forever, name=f"agent-{member.name}", daemon=True
                )
                member.thread.start()
            self._started = True

    def sync_pods(self) -> None:
        for member in self.agents:
            by_index = self.env.cluster.gpu_pods(member.name)
            uuids = member.node.nvml
            member.node.pods.set(
                {
                    uuids.uuid_of(index): PodRef(ns, pod, container)
                    for index, (ns, pod, container) in by_index.items()
                    if index < len(member.node.profile.gpus)
                }
            )

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop every agent: poll thread, reporter, HTTP server, sources, simulated node.

        All at once, not one after another: a server's shutdown waits out its serve_forever
        poll (up to 0.5 s) and a GPU source's close an NVML event wait (up to 0.5 s), which one
        node after another made 15-20 s for the demo's 34 nodes. Every poll thread is told to
        stop first, then each part is stopped on its own thread and all are waited for
        together, `timeout` s at most; a part still stuck then is logged and left behind (its
        threads are daemons). Sources and the simulated nodes' files are closed once the poll
        thread reading them has ended (or the deadline has passed). The files, ~2,000 per node,
        are removed by one thread, node after node: that is CPU work, which 34 threads
        contending for the GIL did several times slower than one. It is bounded work and is
        always waited for, past the deadline if need be: left behind, the files (in /dev/shm)
        would hold memory until reboot.
        """
        deadline = time.monotonic() + timeout
        for hook in (self.sync_pods, self.follow_boots):
            with contextlib.suppress(ValueError):  # no pod syncs into nodes being closed
                self.env.after_step.remove(hook)
        with self._lock:  # a restart under way finishes first; none starts after
            self._closed = True
        for retire in self._retiring:
            retire.join(max(0.0, deadline - time.monotonic()))
        for member in self.agents:
            member.agent.request_stop()
        tasks: dict[str, Callable[[], None]] = {}
        for member in self.agents:
            tasks[f"{member.name} server"] = partial(_close_server, member)
            tasks[f"{member.name} sources"] = partial(
                _after_poll_thread, member.agent, deadline, member.sources.close
            )
            if member.reporter is not None:
                tasks[f"{member.name} reporter"] = partial(_close_reporter, member.reporter)
        files = threading.Thread(
            target=self._remove_nodes, args=(deadline,), name="stop node files", daemon=True
        )
        files.start()
        stuck = run_concurrently(tasks, deadline)
        files.join()
        if stuck:
            log.warning("not stopped within %.1f s: %s", timeout, ", ".join(stuck))

    def _remove_nodes(self, deadline: float) -> None:
        for member in self.agents:
            _after_poll_thread(member.agent, deadline, member.node.close)


def _retire(
    agent: NodeAgent, sources: NodeSources, node: SimulatedNode, reporter: NodeReporter | None
) -> None:
    """Stop the parts of an agent a reboot replaced."""
    try:
        agent.stop(timeout=CLOSE_TIMEOUT_S)
        sources.close()
        if reporter is not None:
            reporter.api.close()
    finally:
        node.close()


def _close_server(member: SimulatedNodeAgent) -> None:
    if member.thread is not None:  # shutdown() waits for a serve_forever that never ran
        member.server.shutdown()
    member.server.server_close()


def _after_poll_thread(agent: NodeAgent, deadline: float, close: Callable[[], None]) -> None:
    agent.stop(timeout=deadline - time.monotonic())
    close()


def _close_reporter(reporter: NodeReporter) -> None:
    reporter.stop()
    reporter.api.close()
