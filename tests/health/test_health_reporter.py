"""The node's health report as the cluster sees it: condition, annotation and Events on the
simulated API server (real HTTP), written on change only, and an API outage that costs nothing
but a counted error."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.core.findings import FINDINGS_ANNOTATION, Finding, findings_from_json
from exporter.node.agent import NodeAgent
from exporter.node.poller import Poller
from exporter.sim.faults import parse_fault
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sources.kubeapi import ApiError, KubeApi
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from healthcheck.detection.reporter import HEALTH_CONDITION, NodeReporter
from tests.conftest import SimHarness

Sim = Callable[..., SimHarness]
NODE = "ip-10-1-2-3.ec2.internal"
T0 = 1_750_000_000.0
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastHeartbeatTime": "2025-06-15T15:00:00Z",
    "lastTransitionTime": "2025-06-15T14:00:00Z",
}


@pytest.fixture
def store() -> ObjectStore:
    s = ObjectStore()
    s.upsert(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"node.kubernetes.io/instance-type": "p5"}},
            "status": {"conditions": [READY]},
        },
    )
    return s


@pytest.fixture
def server(store: ObjectStore) -> Iterator[FakeApiServer]:
    with FakeApiServer(store) as srv:
        yield srv


@pytest.fixture
def api(server: FakeApiServer) -> Iterator[KubeApi]:
    with KubeApi(server.url) as client:
        yield client


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def report(*findings: Finding) -> HealthReport:
    return HealthReport(NODE, T0, tuple(findings))


RO = Finding("rootfs_read_only", "node", "critical", "reboot", "/ is ro", T0, T0, True)
XID = Finding("xid", "gpu3", "fatal", "replace", "XID 79", T0, T0, True)
NUMA = Finding("numa_misplaced", "gpu7", "warning", "none", "1 of 1", T0, T0, False)


def conditions(store: ObjectStore) -> dict[str, dict[str, Any]]:
    node = store.get("nodes", "", NODE)
    assert node is not None
    return {c["type"]: c for c in node["status"]["conditions"]}


def annotation(store: ObjectStore) -> str | None:
    node = store.get("nodes", "", NODE)
    assert node is not None
    value: str | None = (node["metadata"].get("annotations") or {}).get(FINDINGS_ANNOTATION)
    return value


def events(store: ObjectStore) -> list[dict[str, Any]]:
    return [e for e in store.items("events") if e["involvedObject"]["name"] == NODE]


def test_unhealthy_node_gets_condition_annotation_and_one_event(
    api: KubeApi, store: ObjectStore
) -> None:
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, clock=Clock())
    assert reporter.report(report(RO, XID, NUMA))
    cond = conditions(store)
    assert cond[HEALTH_CONDITION]["status"] == "False"
    assert cond[HEALTH_CONDITION]["reason"] == "Xid"  # the worst finding: replace beats reboot
    assert "gpu3 xid (replace)" in cond[HEALTH_CONDITION]["message"]
    assert cond["Ready"] == READY  # the kubelet's conditions survive
    text = annotation(store)
    assert text is not None
    assert [(f.check, f.action) for f in findings_from_json(text)] == [
        ("xid", "replace"),
        ("rootfs_read_only", "reboot"),
    ]  # actionable only: the NUMA warning is not in it
    (event,) = events(store)
    assert (event["type"], event["reason"]) == ("Warning", "TopowatchUnhealthy")
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["uid"] == store.get("nodes", "", NODE)["metadata"]["uid"]  # type: ignore[index]
    assert event["metadata"]["namespace"] == "default"


def test_same_verdict_is_not_rewritten_until_the_refresh(
    api: KubeApi, server: FakeApiServer, store: ObjectStore
) -> None:
    clock = Clock()
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, clock=clock, refresh_seconds=300)
    reporter.report(report(RO))
    writes = server.requests["PATCH nodes"]
    clock.now += 60
    evidence_changed = Finding(
        "rootfs_read_only", "node", "critical", "reboot", "still", T0, T0, True
    )
    assert reporter.report(report(evidence_changed))
    assert server.requests["PATCH nodes"] == writes  # nothing written
    clock.now += 300
    assert reporter.report(report(evidence_changed))
    assert server.requests["PATCH nodes"] > writes  # the refresh rewrote it...
    assert len(events(store)) == 1  # ...without a new Event
    assert monitor.report_count("written", "event") == 1


def test_recovery_flips_the_condition_and_announces_it(api: KubeApi, store: ObjectStore) -> None:
    clock = Clock()
    reporter = NodeReporter(api, NODE, clock=clock)
    reporter.report(report(RO))
    first_transition = conditions(store)[HEALTH_CONDITION]["lastTransitionTime"]
    clock.now += 120
    reporter.report(report(NUMA))  # nothing actionable: healthy
    cond = conditions(store)[HEALTH_CONDITION]
    assert (cond["status"], cond["reason"]) == ("True", "NoActionableFindings")
    assert cond["lastTransitionTime"] != first_transition
    assert annotation(store) == "[]"
    kinds = [(e["type"], e["reason"]) for e in events(store)]
    assert kinds == [("Warning", "TopowatchUnhealthy"), ("Normal", "TopowatchHealthy")]
    assert "rootfs_read_only" in events(store)[1]["message"]


def test_false_is_never_seen_without_its_findings_going_bad_or_healing(
    api: KubeApi, store: ObjectStore
) -> None:
    """The controller reads a False condition without findings as malformed (an audit problem
    per healing node, seen in the demo after every simulated reboot): after every single write,
    False comes with the findings that explain it."""
    seen: list[tuple[str | None, str | None]] = []
    patch = api.patch

    def watched(path: str, body: Any, **kwargs: Any) -> Any:
        answer = patch(path, body, **kwargs)
        ours = conditions(store).get(HEALTH_CONDITION)
        seen.append((ours["status"] if ours else None, annotation(store)))
        return answer

    api.patch = watched  # type: ignore[method-assign]
    clock = Clock()
    reporter = NodeReporter(api, NODE, clock=clock)
    reporter.report(report(RO))
    clock.now += 120
    reporter.report(report())  # healed
    assert seen[-1] == ("True", "[]")
    for status, text in seen:
        if status == "False":
            assert text is not None and findings_from_json(text), seen


def test_efa_remote_errors_are_published_for_the_cluster_service_but_change_no_verdict(
    api: KubeApi, server: FakeApiServer, store: ObjectStore
) -> None:
    """Rising EFA remote-error counters are a warning with no action on one node (a dead peer
    raises them on every healthy node that talks to it); the cluster service correlates them
    across a workload's nodes (exporter/cluster/efa_remotes.py), so the annotation carries them.
    They never make the node unhealthy nor post an Event, and their start and end rewrite the
    annotation at once (not at the next refresh), so the correlation sees them in time."""
    clock = Clock()
    reporter = NodeReporter(api, NODE, clock=clock, refresh_seconds=300)
    remote = Finding("efa_remote_errors", "rdmap16s27:1", "warning", "none", "+5/s", T0, T0, False)
    assert reporter.report(report(NUMA))
    writes = server.requests["PATCH nodes"]
    clock.now += 10
    assert reporter.report(report(NUMA, remote))
    assert server.requests["PATCH nodes"] > writes
    text = annotation(store)
    assert text is not None
    assert [(f.check, f.actionable) for f in findings_from_json(text)] == [
        ("efa_remote_errors", False)
    ]  # the NUMA warning is still left out
    assert conditions(store)[HEALTH_CONDITION]["status"] == "True"
    assert events(store) == []
    clock.now += 10
    assert reporter.report(report(NUMA))
    assert annotation(store) == "[]"


def test_a_healthy_start_posts_no_event(api: KubeApi, store: ObjectStore) -> None:
    NodeReporter(api, NODE, clock=Clock()).report(report())
    assert conditions(store)[HEALTH_CONDITION]["status"] == "True"
    assert events(store) == []


def test_api_errors_are_counted_and_retried_next_time(
    api: KubeApi, server: FakeApiServer, store: ObjectStore
) -> None:
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, clock=Clock())
    server.fail_next(1, 503)
    assert reporter.report(report(RO)) is False
    assert monitor.report_count("error", "server_error") == 1
    assert HEALTH_CONDITION not in conditions(store)
    assert reporter.report(report(RO))  # the same verdict is written on the next try
    assert conditions(store)[HEALTH_CONDITION]["status"] == "False"


def test_a_dropped_api_server_is_an_error_not_a_crash(
    api: KubeApi, server: FakeApiServer, store: ObjectStore
) -> None:
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, clock=Clock(), timeout=5.0)
    server.stop()
    assert reporter.report(report(RO)) is False
    assert monitor.report_count("error", "unavailable") == 1
    server.start()  # same port
    assert reporter.report(report(RO))
    assert conditions(store)[HEALTH_CONDITION]["status"] == "False"


def test_a_malformed_node_is_a_counted_bad_response(api: KubeApi, store: ObjectStore) -> None:
    store.upsert(
        "nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": "broken"},
    )
    monitor = HealthMonitor()
    assert NodeReporter(api, NODE, monitor, clock=Clock()).report(report(RO)) is False
    assert monitor.report_count("error", "bad_response") == 1


def test_missing_node_is_not_found(api: KubeApi) -> None:
    monitor = HealthMonitor()
    assert NodeReporter(api, "no-such-node", monitor, clock=Clock()).report(report(RO)) is False
    assert monitor.report_count("error", "not_found") == 1


def test_kubeapi_patch_and_post_over_http(api: KubeApi, store: ObjectStore) -> None:
    patched = api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"x": "y"}}})
    assert patched["metadata"]["labels"] == {"node.kubernetes.io/instance-type": "p5", "x": "y"}
    created = api.post(
        "/api/v1/namespaces/default/events",
        {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": NODE}},
    )
    assert created["metadata"]["namespace"] == "default"
    assert store.get("events", "default", "e1") is not None
    with pytest.raises(ApiError) as err:
        api.patch(f"/api/v1/nodes/{NODE}", {}, content_type="application/apply-patch+yaml")
    assert err.value.status == 415
    with pytest.raises(ApiError) as err:
        api.post("/api/v1/namespaces/default/events", {"metadata": {"name": "e1"}})
    assert err.value.status == 409


def test_the_agent_reports_in_the_background_and_keeps_serving_without_the_api(
    sim: Sim,
    api: KubeApi,
    server: FakeApiServer,
    store: ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    callers: list[int] = []  # the thread of every API call
    for method in ("get", "patch", "post"):
        real = getattr(api, method)

        def recording(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            callers.append(threading.get_ident())
            return _real(*args, **kwargs)

        monkeypatch.setattr(api, method, recording)
    h = sim("p5.48xlarge", "rootfs-ro")
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, timeout=5.0).start()
    poller = Poller(NODE, h.sources, clock=lambda: h.now, health=monitor)
    agent = NodeAgent(poller, interval=5, on_snapshot=lambda _: reporter.submit(monitor.last))
    try:
        for _ in range(3):
            h.now += 5
            agent.poll_once()
        deadline = time.monotonic() + 10
        # the first polls were still damping (healthy): wait for the third poll's verdict
        while time.monotonic() < deadline:
            if conditions(store).get(HEALTH_CONDITION, {}).get("status") == "False":
                break
            time.sleep(0.02)
        assert conditions(store)[HEALTH_CONDITION]["status"] == "False"
        assert json.loads(annotation(store) or "[]")[0]["check"] == "rootfs_read_only"

        server.stop()
        monitor.count_report("error", "probe")  # so the family exists even before the retry
        before = monitor.report_count("error", "unavailable")
        h.node.clear(parse_fault("rootfs-ro"))
        h.now += 5
        agent.poll_once()  # the verdict changes; the API server is gone
        deadline = time.monotonic() + 10
        while (
            monitor.report_count("error", "unavailable") == before and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert monitor.report_count("error", "unavailable") > before
        h.now += 5
        agent.poll_once()
        assert b"topowatch_health_report_errors_total" in agent.current.text
        assert b"topowatch_gpu_up" in agent.current.text
        # The poll never waits on the API server: every call came from the reporter's thread.
        assert callers and threading.get_ident() not in callers
    finally:
        reporter.stop()


# --- wiring: the simulated fleet and the command line ---------------------------------------


def test_simulated_fleet_reports_an_injected_fault_to_its_node() -> None:
    from exporter.sim.cluster import ClusterShape
    from exporter.sim.environment import NodeAgentFleet, SimulatedEnvironment

    shape = ClusterShape(
        p5_nodes=2, ultraserver_nodes=0, arrivals_per_minute=0, initial_workloads=0
    )
    env = SimulatedEnvironment(shape=shape, tick=60)
    env.cluster.bootstrap()
    env.server.start()
    names = [n.name for n in env.cluster.nodes()]
    fleet = NodeAgentFleet(
        env, faults=[parse_fault(f"node={names[0]}:xid=79@gpu3")], report_url=env.url
    )
    try:
        fleet.start()
        deadline = time.monotonic() + 10
        status: dict[str, str] = {}
        while time.monotonic() < deadline:
            for member in fleet.agents:
                member.agent.poll_once()
            for name in names:
                node = env.store.get("nodes", "", name) or {}
                for c in node.get("status", {}).get("conditions", []):
                    if c["type"] == HEALTH_CONDITION:
                        status[name] = c["status"]
            if status == {names[0]: "False", names[1]: "True"}:
                break
            time.sleep(0.05)
        assert status == {names[0]: "False", names[1]: "True"}
        node = env.store.get("nodes", "", names[0]) or {}
        found = findings_from_json(node["metadata"]["annotations"][FINDINGS_ANNOTATION])
        assert [(f.check, f.component, f.action) for f in found] == [("xid", "gpu3", "reboot")]
    finally:
        fleet.close()
        env.server.stop()


def test_cli_rejects_a_bad_health_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from exporter.cli import main

    bad = tmp_path / "health.yaml"
    bad.write_text("thermal: {sustain: 5}\n")
    assert main(["node", "--simulate", "p5.48xlarge", "--once", "--health-config", str(bad)]) == 2
    assert "unknown key 'thermal.sustain'" in capsys.readouterr().err


def test_cli_no_health_drops_the_health_series(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    from exporter.cli import main

    assert main(["node", "--simulate", "p5.48xlarge", "--once", "--no-health"]) == 0
    out = capsysbinary.readouterr().out
    assert b"topowatch_gpu_up" in out and b"topowatch_health_finding" not in out


def test_cli_once_reports_to_the_given_api_server(
    store: ObjectStore, server: FakeApiServer, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from exporter.cli import main

    args = ["node", "--simulate", "p5.48xlarge", "--once", "--fault", "xid=79@gpu3"]
    assert main([*args, "--node-name", NODE, "--kube-api", server.url]) == 0
    assert b'topowatch_health_finding{node="' + NODE.encode() in capsysbinary.readouterr().out
    assert conditions(store)[HEALTH_CONDITION]["status"] == "False"
    assert "xid" in (annotation(store) or "")
