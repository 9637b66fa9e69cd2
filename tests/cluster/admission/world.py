"""A small cluster for the admission check's tests: raw objects in Kueue's and Kubernetes'
shapes (validated against Kueue's CRDs), fed to the cluster service as its informers would."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from exporter.cluster.admission.audit import AdmissionAudit
from exporter.cluster.admission.controller import AdmissionController
from exporter.cluster.admission.parse import AdmissionCheckInfo, WorkloadChecks
from exporter.cluster.admission.settings import CONTROLLER_NAME, AdmissionSettings
from exporter.cluster.service import ClusterService
from exporter.core.findings import Finding, findings_to_json
from exporter.sim import synthetic as s
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0  # 2026-11-18T11:06:40Z
NS = "hyperpod-ns-alpha"
CQ = "hyperpod-ns-alpha-clusterqueue"
CHECK = "topowatch-node-health"
OTHER = "provisioning"  # another controller's check (Kueue's ProvisioningRequest)
FLAVOR = "ml.p5.48xlarge"
LAYERS = ("nn-top", "nn-mid", "nn-a")
Obj = dict[str, Any]


def admission_check(
    name: str = CHECK,
    controller: str = CONTROLLER_NAME,
    version: str = "v1beta2",
    parameters: Obj | None = None,
    active: bool = False,
) -> Obj:
    spec: Obj = {"controllerName": controller}
    if parameters is not None:
        spec["parameters"] = parameters
    obj: Obj = {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "AdmissionCheck",
        "metadata": {"name": name, "resourceVersion": "1", "generation": 1},
        "spec": spec,
    }
    if active:
        obj["status"] = {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Active",
                    "message": "The admission check is active",
                    "lastTransitionTime": s.rfc3339(T0),
                    "observedGeneration": 1,
                }
            ]
        }
    assert_valid_kueue(obj)
    return obj


def entry(name: str, state: str, at: float = T0 + 10, message: str = "") -> Obj:
    """A status.admissionChecks[] entry as Kueue writes it (message required, may be "")."""
    return {
        "name": name,
        "state": state,
        "message": message,
        "lastTransitionTime": s.rfc3339(at),
    }


def quota_reserved(at: float, admitted: bool = False) -> list[Obj]:
    conds = [s.condition("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in {CQ}", at)]
    if admitted:
        conds.append(s.condition("Admitted", "True", "Admitted", "The workload is admitted", at))
    else:
        conds.append(
            s.condition(
                "Admitted",
                "False",
                "UnsatisfiedChecks",
                "The workload has not all checks ready",
                at,
            )
        )
    return conds


def workload(
    name: str = "train",
    entries: Sequence[Obj] = (),
    nodes: Sequence[str] | None = ("n1", "n2"),
    v1beta1: bool = False,
    admitted: bool = False,
    reserved: bool = True,
    pods: int | None = None,
    gpus: int = 8,
    flavor: str = FLAVOR,
    rv: str = "5",
) -> Obj:
    """A Workload of `pods` pods (one per node of `nodes` by default) with quota reserved on
    `flavor`; `nodes` None: no TAS assignment."""
    count = pods if pods is not None else len(nodes or ()) or 2
    assignment = [((n,), 1) for n in nodes] if nodes else []
    obj = s.workload(
        NS,
        name,
        count,
        gpus,
        T0,
        topology=("required", "kubernetes.io/hostname") if nodes else None,
        conditions=quota_reserved(T0 + 5, admitted) if reserved else (),
        cluster_queue=CQ if reserved else "",
        assignment=assignment,
        flavor=flavor,
        v1beta1=v1beta1,
        rv=rv,
    )
    if entries:
        obj.setdefault("status", {})["admissionChecks"] = [dict(e) for e in entries]
    assert_valid_kueue(obj)
    return obj


def cluster_queue(checks: Sequence[tuple[str, Sequence[str]]] = ((CHECK, ()),)) -> Obj:
    obj = s.cluster_queue(CQ, 64)
    if not checks:
        assert_valid_kueue(obj)
        return obj
    obj["spec"]["admissionChecksStrategy"] = {
        "admissionChecks": [{"name": n, **({"onFlavors": list(f)} if f else {})} for n, f in checks]
    }
    assert_valid_kueue(obj)
    return obj


def xid(gpu: int = 3, at: float = T0 - 600, code: int = 79, actionable: bool = True) -> Finding:
    return Finding(
        check="xid",
        component=f"gpu{gpu}",
        severity="fatal",
        action="reboot",
        evidence=f"XID {code} ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
        first_seen=at,
        last_seen=at + 60,
        actionable=actionable,
    )


def node(
    name: str,
    findings: Sequence[Finding] = (),
    health: str = "Schedulable",
    cordoned: bool = False,
    deep: str = "",
    condition_false: str = "",
) -> Obj:
    raw = s.node(
        name,
        LAYERS,
        health=health,
        unschedulable=cordoned,
        findings=findings_to_json(findings) if findings else None,
    )
    if deep:
        raw["metadata"]["labels"]["sagemaker.amazonaws.com/deep-health-check-status"] = deep
    if condition_false:
        raw["status"]["conditions"].append(
            {
                "type": "TopowatchHealthy",
                "status": "False",
                "reason": "Xid",
                "message": condition_false,
            }
        )
    return raw


def pod(name: str, node_name: str, phase: str = "Running", gated: bool = False) -> Obj:
    job_uid = s.uid_for("job", NS, "train")
    raw = s.pod(NS, name, node_name, 8, job_uid, "train", workload="train", phase=phase)
    if gated:
        raw["spec"].pop("nodeName", None)
        raw["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    return raw


class FakeWriter:
    """Records the patches; answers `results` in turn (then "written")."""

    def __init__(self, checks: list[Obj] | None = None, results: Sequence[str] = ()) -> None:
        self.checks = checks if checks is not None else [admission_check(active=True)]
        self.results = list(results)
        self.patches: list[tuple[str, Obj]] = []
        self.activated: list[tuple[str, Obj]] = []

    def write(self, checks: WorkloadChecks, patch: Obj) -> str:
        self.patches.append((f"{checks.namespace}/{checks.name}", copy.deepcopy(patch)))
        return self.results.pop(0) if self.results else "written"

    def activate(self, check: AdmissionCheckInfo, patch: Obj) -> str:
        self.activated.append((check.name, copy.deepcopy(patch)))
        return "written"

    def list_checks(self) -> list[Obj] | None:
        return self.checks


class World:
    """The cluster service with the admission check on, its clock in the test's hands."""

    def __init__(self, settings: AdmissionSettings | None = None, writer: Any = None) -> None:
        self.now = T0 + 20
        self.writer = writer if writer is not None else FakeWriter()
        self.settings = settings or AdmissionSettings(enabled=True, mode="enforce")
        self.controller = AdmissionController(self.settings, self.writer, AdmissionAudit())
        self.service = ClusterService(clock=lambda: self.now, admission=self.controller)

    def add(self, kind: str, obj: Obj, event: str = "ADDED") -> World:
        self.service.apply(kind, event, obj)
        return self

    def cycle(self) -> list[Obj]:
        """One admission cycle; the decisions it recorded, newest first."""
        before = len(self.controller.audit.recent(limit=10_000))
        self.service.admission_cycle()
        rows = self.controller.audit.recent(limit=10_000)
        return rows[: len(rows) - before]
