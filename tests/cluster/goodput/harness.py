"""A cluster model with a goodput book, fed hand-built objects on a hand-held clock."""

from __future__ import annotations

import json
from typing import Any

from exporter.cluster.goodput import GoodputBook, GoodputConfig
from exporter.cluster.model import ClusterModel
from exporter.core.findings import Finding, findings_to_json
from exporter.sim import synthetic as syn

T0 = 1_795_000_000.0
NS = "hyperpod-ns-llm"
CQ = "hyperpod-ns-llm-clusterqueue"


def xid79(at: float, gpu: int = 3, severity: str = "fatal", action: str = "replace") -> Finding:
    return Finding(
        "xid",
        f"gpu{gpu}",
        severity,
        action,
        "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
        at,
        at,
        actionable=True,
    )


def finding(check: str, component: str, at: float, severity: str, action: str) -> Finding:
    return Finding(check, component, severity, action, f"{check} evidence", at, at, True)


class World:
    def __init__(self, config: GoodputConfig | None = None) -> None:
        self.model = ClusterModel()
        self.book = GoodputBook(config)
        self.book.attach(self.model)
        self.now = T0
        self.rv = 0
        self.nodes: dict[str, dict[str, Any]] = {}

    def _rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def at(self, t: float) -> World:
        self.now = t
        return self

    def apply(self, kind: str, obj: dict[str, Any], event: str = "MODIFIED") -> None:
        self.model.apply(kind, event, obj, self.now)

    def node(
        self,
        name: str,
        findings: list[Finding] | None = None,
        health: str = "Schedulable",
        ready: bool = True,
        raw_findings: str | None = None,
        layer3: str = "nn-3a",
    ) -> None:
        text = raw_findings
        if findings is not None:
            text = findings_to_json(findings)
        obj = syn.node(
            name,
            ["nn-1", "nn-2", layer3],
            health=health,
            unschedulable=health != "Schedulable",
            rv=self._rv(),
            findings=text,
            ready=ready,
        )
        self.nodes[name] = obj
        self.apply("Node", obj)

    def workload(
        self,
        name: str,
        pods: int,
        gpus: int = 8,
        admitted: bool = True,
        conditions: list[dict[str, Any]] | None = None,
        owner: str | None = None,
        annotations: dict[str, str] | None = None,
        active: bool = True,
        created: float | None = None,
    ) -> dict[str, Any]:
        conds = list(conditions or [])
        if admitted:
            conds = syn.admitted_conditions(CQ, self.now) + conds
        obj = syn.workload(
            NS,
            name,
            pods,
            gpus,
            created if created is not None else self.now,
            cluster_queue=CQ if admitted else "",
            conditions=conds,
            rv=self._rv(),
        )
        if owner is not None:
            obj["metadata"]["ownerReferences"][0]["name"] = owner
            obj["metadata"]["ownerReferences"][0]["uid"] = syn.uid_for("job", NS, owner)
            obj["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] = syn.uid_for("job", NS, owner)
        if annotations:
            obj["metadata"]["annotations"] = dict(annotations)
        obj["spec"]["active"] = active
        self.apply("Workload", obj)
        return obj

    def delete_workload(self, name: str) -> None:
        self.apply("Workload", {"metadata": {"namespace": NS, "name": name}}, "DELETED")

    def pod(
        self,
        name: str,
        node: str,
        job: str,
        workload: str,
        ready: bool = True,
        gpus: int = 8,
        phase: str = "Running",
    ) -> None:
        obj = syn.pod(
            NS,
            name,
            node,
            gpus,
            syn.uid_for("job", NS, job),
            job,
            workload=workload,
            phase=phase,
            rv=self._rv(),
            ready_at=self.now if ready else None,
        )
        self.apply("Pod", obj)

    def delete_pod(self, name: str) -> None:
        self.apply("Pod", {"metadata": {"namespace": NS, "name": name}}, "DELETED")

    def run_job(self, name: str, nodes: list[str], ready: bool = True) -> None:
        """Admit job `name` (its Workload named alike) with one 8-GPU pod per node."""
        self.workload(name, len(nodes))
        for i, node in enumerate(nodes):
            self.pod(f"{name}-{i}", node, name, name, ready=ready)

    def entries(self, job: str) -> list[Any]:
        return self.book.interruptions_of(NS, job)


def dumps(value: object) -> str:
    return json.dumps(value)
