"""The admission check wired into `topowatch cluster`: informers feed it, its loop answers a
Workload through the simulated API server, /api/v1/admission and /metrics show the decision."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from exporter.cluster.admission.settings import AdmissionSettings
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.cluster.admission.world import (
    CHECK,
    NS,
    OTHER,
    admission_check,
    cluster_queue,
    entry,
    node,
    workload,
    xid,
)
from tests.conftest import serving


def until(check: Any, seconds: float = 15.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_service_answers_kueue_and_reports() -> None:
    with FakeApiServer(ObjectStore(), bookmark_interval=0.2) as server:
        store = server.store
        store.upsert("admissionchecks", admission_check())
        store.upsert("clusterqueues", cluster_queue([(CHECK, ()), (OTHER, ())]))
        store.upsert("nodes", node("n1", findings=[xid()]))
        store.upsert("nodes", node("n2"))
        store.upsert(
            "workloads", workload(entries=[entry(CHECK, "Pending"), entry(OTHER, "Ready")])
        )
        admission = AdmissionSettings(enabled=True, mode="enforce", interval_seconds=0.2)
        with serving(server.url, admission=admission) as (port, _):

            def answered() -> dict[str, Any] | None:
                wl = store.get("workloads", NS, "train") or {}
                found = {e["name"]: e for e in wl["status"]["admissionChecks"]}
                return found if found[CHECK]["state"] != "Pending" else None

            found = until(answered)
            assert found[CHECK]["state"] == "Retry"
            assert found[CHECK]["message"].startswith("node n1: XID 79 on GPU 3")
            assert found[OTHER]["state"] == "Ready"
            check = store.get("admissionchecks", "", CHECK) or {}
            assert check["status"]["conditions"][0]["type"] == "Active"
            base = f"http://127.0.0.1:{port}"
            with urllib.request.urlopen(f"{base}/api/v1/admission?workload={NS}/train") as r:
                view = json.load(r)
            assert view["mode"] == "enforce" and view["checks"] == [CHECK]
            assert [d["state"] for d in view["decisions"]][:1] == ["Retry"]
            with urllib.request.urlopen(f"{base}/metrics") as r:
                body = r.read().decode()
            assert (
                'topowatch_admission_decisions_total{check="topowatch-node-health",'
                'state="Retry",reason="unhealthy_node"} 1' in body
            )
