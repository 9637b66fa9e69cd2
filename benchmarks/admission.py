"""Admission check figures: the decision after a Workload's quota reservation, p99 latency and
decisions per second, on a synthetic cluster of 2,000 p5 nodes and 10,000 workloads.

Every workload of the synthetic cluster is turned into "quota reserved, checks Pending"
(Admitted False, a Pending `topowatch-node-health` entry beside another controller's; its pods
are not fed: they have not started); 2 % of the nodes carry a confirmed XID finding. The ones
the synthetic cluster placed keep their TAS assignment (the TAS path: the assigned nodes); the
others get a flavor without one (the flavor path: enough healthy nodes for the pods). The
cluster service judges them as one cycle does, and the writer is an in-memory stand-in, so the
figures are the controller's own work, not the API's. Then the steady state: every check
answered, one new quota reservation at a time arrives as a watch event and one cycle answers
it (what the service does on the event): that wall time is the decision latency a workload
sees. Prints figures; never passes or fails. The issue's targets: p99 at most
50 ms, at least 1,000 decisions/s.

    .venv/bin/python benchmarks/admission.py [--nodes 2000] [--workloads 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.cluster.admission.controller import AdmissionController, Judged
from exporter.cluster.admission.parse import AdmissionCheckInfo, WorkloadChecks
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.service import ClusterService
from exporter.core.findings import Finding, findings_to_json
from exporter.sim.synthetic import SyntheticShape, condition, rfc3339, synthetic_cluster

NOW = 1_795_100_000.0
CHECK = "topowatch-node-health"
ORDER = ("ClusterQueue", "LocalQueue", "Node", "Workload")


class MemoryWriter:
    """Answers like an API server that accepts every patch."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, checks: WorkloadChecks, patch: dict[str, Any]) -> str:
        self.writes += 1
        return "written"

    def activate(self, check: AdmissionCheckInfo, patch: dict[str, Any]) -> str:
        return "written"

    def list_checks(self) -> list[dict[str, Any]] | None:
        active = {"type": "Active", "status": "True", "reason": "Active", "message": ""}
        return [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "AdmissionCheck",
                "metadata": {"name": CHECK},
                "spec": {"controllerName": "topowatch.io/node-health"},
                "status": {"conditions": [active]},
            }
        ]


GPU_FLAVOR = {"nvidia.com/gpu": "ml.p5.48xlarge"}


def cq_of(workload: dict[str, Any]) -> str:
    return workload["metadata"]["namespace"] + "-clusterqueue"


def xid_finding(at: float) -> str:
    finding = Finding(
        "xid", "gpu3", "fatal", "reboot", "XID 79 GPU_HAS_FALLEN_OFF_THE_BUS", at, at, True
    )
    return findings_to_json([finding])


def build(nodes: int, workloads: int) -> tuple[dict[str, list[dict[str, Any]]], int, int]:
    """The cluster's objects by kind; (TAS workloads, flavor-only workloads) under check."""
    shape = SyntheticShape(nodes=nodes, workloads=workloads)
    by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in ORDER}
    tas = flavor_only = 0
    for i, (kind, obj) in enumerate(synthetic_cluster(shape)):
        if kind == "ClusterQueue":
            checks = [{"name": CHECK}, {"name": "provisioning"}]
            obj["spec"]["admissionChecksStrategy"] = {"admissionChecks": checks}
        if kind == "Node" and i % 50 == 0:
            obj["metadata"]["annotations"] = {"topowatch.io/findings": xid_finding(NOW - 900)}
        if kind == "Workload":
            status = obj.get("status") or {}
            conds = {c["type"] for c in status.get("conditions", [])}
            if True:
                reserved_at = NOW - 1
                status["conditions"] = [
                    condition("QuotaReserved", "True", "QuotaReserved", "reserved", reserved_at),
                    condition("Admitted", "False", "UnsatisfiedChecks", "checks", reserved_at),
                ]
                status["admissionChecks"] = [
                    {
                        "name": CHECK,
                        "state": "Pending",
                        "message": "",
                        "lastTransitionTime": rfc3339(reserved_at),
                    },
                    {
                        "name": "provisioning",
                        "state": "Ready",
                        "message": "",
                        "lastTransitionTime": rfc3339(reserved_at),
                    },
                ]
                admission = status.setdefault("admission", {"clusterQueue": cq_of(obj)})
                psas = admission.setdefault("podSetAssignments", [])
                if not psas:
                    pod_set = obj["spec"]["podSets"][0]
                    psas.append(
                        {"name": pod_set["name"], "count": pod_set["count"], "flavors": GPU_FLAVOR}
                    )
                if any("topologyAssignment" in psa for psa in psas) and "Finished" not in conds:
                    tas += 1
                else:
                    for psa in psas:
                        psa.pop("topologyAssignment", None)
                    flavor_only += 1
                obj["status"] = status
        if kind in by_kind:
            by_kind[kind].append(obj)
    return by_kind, tas, flavor_only


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--workloads", type=int, default=10_000)
    args = parser.parse_args()

    t = time.perf_counter()
    objects, tas, flavor_only = build(args.nodes, args.workloads)
    writer = MemoryWriter()
    controller = AdmissionController(AdmissionSettings(enabled=True, mode="enforce"), writer)
    service = ClusterService(clock=lambda: NOW, admission=controller)
    for kind in ORDER:
        service.replace(kind, objects[kind])
    controller.sync_checks(NOW)
    print(
        f"cluster: {args.nodes} nodes, {args.workloads} workloads; {tas + flavor_only} with the"
        f" check Pending ({tas} TAS, {flavor_only} flavor only); built in"
        f" {time.perf_counter() - t:.1f} s"
    )

    # judge: what one cycle does under the service's lock, each decision timed on its own
    judged: list[Judged] = []
    rounds = 3
    wall = []
    for _ in range(rounds):
        t = time.perf_counter()
        with service.lock:
            judged = controller.judge(service.model, NOW, {}, True)
        wall.append(time.perf_counter() - t)
    t = time.perf_counter()
    controller.settle(judged, NOW)
    settle_s = time.perf_counter() - t

    by_path: dict[str, list[float]] = {"TAS": [], "flavor": []}
    states: dict[str, int] = {}
    for item in judged:
        path = "TAS" if item.decision.nodes or "assigned" in item.decision.message else "flavor"
        by_path[path].append(item.seconds)
        states[item.decision.state] = states.get(item.decision.state, 0) + 1
    every = [item.seconds for item in judged]
    best = min(wall)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
    print(f"decisions per cycle: {len(judged)} ({counts})")
    for name, values in (("all", every), *by_path.items()):
        if not values:
            continue
        print(
            f"  decision latency {name:>6}: p50 {statistics.median(values) * 1e3:.3f} ms,"
            f" p99 {percentile(values, 0.99) * 1e3:.3f} ms,"
            f" max {max(values) * 1e3:.3f} ms (n={len(values)})"
        )
    print(
        f"judge, a whole cycle: {best * 1e3:.0f} ms (best of {rounds}) ="
        f" {len(judged) / best:,.0f} decisions/s"
    )
    print(
        f"settle (audit + {writer.writes} in-memory writes): {settle_s * 1e3:.0f} ms;"
        f" judge + settle: {len(judged) / (best + settle_s):,.0f} decisions/s"
    )
    steady = steady_state(service, controller, objects["Workload"])
    print(
        f"steady state, one new reservation per cycle among {args.workloads} workloads:"
        f" event + cycle p50 {statistics.median(steady) * 1e3:.2f} ms,"
        f" p99 {percentile(steady, 0.99) * 1e3:.2f} ms (n={len(steady)})"
    )
    print("targets (issue 30): p99 <= 50 ms, >= 1,000 decisions/s")


def steady_state(
    service: ClusterService, controller: AdmissionController, workloads: list[dict[str, Any]]
) -> list[float]:
    """Every entry answered (the first cycle's verdicts, as the API would echo them), then a
    workload at a time requeued to Pending: the watch event and the cycle it triggers."""
    for obj in workloads:
        obj["status"]["admissionChecks"][0]["state"] = "Ready"
        obj["metadata"]["resourceVersion"] = "2"
        service.apply("Workload", "MODIFIED", obj)
    times = []
    for i, obj in enumerate(workloads[:: max(1, len(workloads) // 300)]):
        obj["status"]["admissionChecks"][0]["state"] = "Pending"
        obj["metadata"]["resourceVersion"] = str(10 + i)
        t = time.perf_counter()
        service.apply("Workload", "MODIFIED", obj)
        made = service.admission_cycle()
        times.append(time.perf_counter() - t)
        assert made == 1, made
        obj["status"]["admissionChecks"][0]["state"] = "Ready"
        obj["metadata"]["resourceVersion"] = str(100_000 + i)
        service.apply("Workload", "MODIFIED", obj)
    return times


if __name__ == "__main__":
    main()
