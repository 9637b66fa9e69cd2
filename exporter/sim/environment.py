"""The simulated cluster behind a faithful API server, stepping in real time.

`topowatch cluster --simulate` and `topowatch demo` run the production informers against this;
nothing downstream can tell it from a real kube-apiserver except by its address.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.node.agent import NodeAgent
from exporter.node.poller import NodeSources, Poller
from exporter.node.serving import MetricsServer
from exporter.node.snapshot import NodeSnapshot, PodRef
from exporter.sim.cluster import ClusterShape, SimulatedCluster, default_shape
from exporter.sim.faults import Fault
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sources.kubeapi import KubeApi
from healthcheck.config import HealthConfig
from healthcheck.monitor import HealthMonitor
from healthcheck.reporter import NodeReporter

log = logging.getLogger(__name__)


def _submitter(
    monitor: HealthMonitor, reporter: NodeReporter | None
) -> Callable[[NodeSnapshot], None] | None:
    """Hand each poll's health verdict to the reporter's thread (the poll never waits)."""
    if reporter is None:
        return None
    return lambda _: reporter.submit(monitor.last)


class SimulatedEnvironment:
    def __init__(
        self,
        seed: int = 0,
        tick: float = 1.0,
        shape: ClusterShape | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = ObjectStore()
        self.clock = clock
        self.cluster = SimulatedCluster(
            self.store, shape or default_shape(), seed=seed, start=clock()
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

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
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
        unknown = {f.node for f in faults} - {a.name for a in self.agents}
        if unknown:
            self.close()
            raise ValueError(
                f"--fault names unknown node(s): {', '.join(sorted(map(str, unknown)))}"
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

    def close(self) -> None:
        for member in self.agents:
            member.agent.stop()
            if member.reporter is not None:
                member.reporter.stop()
                member.reporter.api.close()
            if member.thread is not None:  # shutdown() waits for a serve_forever that never ran
                member.server.shutdown()
            member.server.server_close()
            member.sources.close()
            member.node.close()
