"""`topowatch demo`: the whole system on the simulation, in one process.

A simulated HyperPod cluster behind a list/watch API server, a node agent per simulated node
whose labels and pods follow the cluster, and the cluster service reading it all through the
production informers.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from exporter.cluster.run import controller_from_mapping, kube_api_client, serve_cluster
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import status_of
from exporter.sim.demo_prometheus import DEFAULT_PORT, DemoPrometheus, start_prometheus
from exporter.sim.environment import NodeAgentFleet, SimulatedEnvironment
from exporter.sim.faults import Fault

log = logging.getLogger(__name__)

# Ctrl-C or SIGTERM to exit: the node agents, the simulation and Prometheus get this long, all
# together, once the cluster service has stopped (normally well under a second).
STOP_TIMEOUT_S = 1.5


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
) -> int:
    """`remediate` lets the controller act (HyperPod labels on the simulated nodes); without
    it the controller only decides and audits, as `topowatch cluster` does by default.
    `prometheus_port` (0: none) runs a Prometheus scraping everything, for the dashboards."""
    env = SimulatedEnvironment(seed=seed).start()
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

    def started(bound: int, service: ClusterService) -> None:
        base = f"http://{host}:{bound}"
        print(
            f"topowatch demo: simulated HyperPod cluster, {len(env.cluster.nodes())} nodes",
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
        if fleet is not None and fleet.agents:
            first, last = fleet.agents[0], fleet.agents[-1]
            print(f"  node agents:      {len(fleet.agents)}, {first.url} .. {last.url}", file=out)
        if prometheus_port:
            scrape_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
            agents = fleet.agents if fleet is not None else []
            node_targets = [f"{scrape_host}:{a.server.port}" for a in agents]
            running = start_prometheus(prometheus_port, f"{scrape_host}:{bound}", node_targets, out)
            if running is not None:
                prometheus.append(running)
        threading.Thread(target=announce_example, args=(service, base), daemon=True).start()
        if duration is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(duration, stop.set)
        out.flush()

    def announce_example(service: ClusterService, base: str) -> None:
        if service.informers is not None:
            service.informers.wait_synced(30)
        target = example_workload(service)
        if target:
            print(f"  try:              topowatch explain --server {base} {target}", file=out)
        print("Ctrl-C stops everything.", file=out)
        out.flush()

    client = kube_api_client(env.url)
    controller = controller_from_mapping(
        {"mode": "act" if remediate else "observe", "providers": ["hyperpod"]}, client
    )
    try:
        serve_cluster(client, host, port, on_started=started, stop=stop, controller=controller)
    finally:
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
