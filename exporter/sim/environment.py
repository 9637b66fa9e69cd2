"""The simulated cluster behind a faithful API server, stepping in real time.

`topowatch cluster --simulate` and `topowatch demo` run the production informers against this;
nothing downstream can tell it from a real kube-apiserver except by its address.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from exporter.core.snapshot import NodeSnapshot, PodRef
from exporter.node.agent import NodeAgent
from exporter.node.poller import NodeSources, Poller
from exporter.node.serving import MetricsServer
from exporter.sim.cluster import ClusterShape, SimulatedCluster, default_shape
from exporter.sim.faults import Fault
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sim.node_faults import FaultRates
from exporter.sources.kubeapi import KubeApi
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


class SimulatedEnvironment:
    def __init__(
        self,
        seed: int = 0,
        tick: float = 1.0,
        shape: ClusterShape | None = None,
        clock: Callable[[], float] = time.time,
        faults: FaultRates | None = None,
    ) -> None:
        """`faults`: nodes fail at these rates (Meta's mix, scaled), HyperPod repairs them and
        auto-resumes the jobs (exporter/sim/node_faults.py); `cluster.truth` records it."""
        self.store = ObjectStore()
        self.clock = clock
        self.cluster = SimulatedCluster(
            self.store, shape or default_shape(), seed=seed, start=clock(), faults=faults
        )
        self.server = FakeApiServer(self.store)
        self.tick = tick
        self.after_step: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> SimulatedEnvironment:
        self.cluster.bootstrap()
        self.server.start()
        self._thread = threading.Thread(target=self._run, name="topowatch-sim", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop stepping (waiting up to `timeout` s for a step under way), then the API server."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, timeout))
        self.server.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            try:
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/metrics"


class NodeAgentFleet:
    """One node agent per simulated node, in this process, each on its own port.

    Labels and pods follow the cluster simulation, so a GPU's `pod` label names the pod the
    cluster bound to that node.
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
        self.agents: list[SimulatedNodeAgent] = []
        for i, sim_node in enumerate(env.cluster.nodes()):
            mine = [f for f in faults if f.node == sim_node.name]
            node = SimulatedNode(get_profile(sim_node.instance_type), mine, seed=seed + i)
            node.labels.set(dict(sim_node.labels))
            sources = node.sources()
            monitor = HealthMonitor(health)
            reporter = None
            if report_url is not None:
                reporter = NodeReporter(KubeApi(report_url), sim_node.name, monitor)
            agent = NodeAgent(
                Poller(sim_node.name, sources, health=monitor),
                interval=interval,
                on_snapshot=_submitter(monitor, reporter),
            )
            server = MetricsServer(agent, host, port_base + i if port_base else 0)
            self.agents.append(
                SimulatedNodeAgent(
                    sim_node.name, node, sources, agent, server, monitor=monitor, reporter=reporter
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

    def start(self) -> None:
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
        with contextlib.suppress(ValueError):  # no pod syncs into nodes being closed
            self.env.after_step.remove(self.sync_pods)
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
