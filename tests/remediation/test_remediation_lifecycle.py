"""Issue 13, items 2 and 3, through the controller: the action ladder (per finding, continued
after a restart from the node's annotation alone) and a node's remediation lifecycle (attempts
reset after a healthy period, ended alerts withdraw their request, deleted nodes are audited and
dropped, Events in observe mode too and a failed Event counted).

Most tests drive `run_once()` on a fake clock with the recording provider and writer of
tests/remediation/test_remediation_controller.py; the restart test goes through the simulated API
server and the official client, so the second controller knows only what the first wrote on the
Node."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from exporter.cluster.run import RemediationConfigError, build_controller, kube_api_client
from exporter.core.exposition import encode_text
from exporter.core.findings import FINDINGS_ANNOTATION, format_time
from exporter.core.provenance import AGENT_FIELD_MANAGER
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from healthcheck.remediation.alerts import parse_alertmanager
from healthcheck.remediation.audit import AuditRecord, node_event
from healthcheck.remediation.controller import KubeNodeWriter, RemediationController
from healthcheck.remediation.policy import PolicyConfig
from healthcheck.remediation.providers.base import ActionRequest, ActionResult
from healthcheck.remediation.providers.hyperpod import HyperPodLabeler
from healthcheck.remediation.state import ANNOTATION as STATE
from healthcheck.remediation.state import RemediationState, dump_state, parse_state
from tests.conftest import promtool_lint
from tests.remediation.test_remediation_controller import (
    ACT,
    HEALTH,
    T0,
    Clock,
    DictWriter,
    Recorder,
    feed,
    finding,
    make,
    node,
    trail,
)

H = 3600.0
MERGE_PATCH = "application/merge-patch+json"


def xid(code: int, name: str, bucket: str, action: str, seen: float) -> dict[str, Any]:
    """An XID finding as the node agent writes it, first seen at `seen`."""
    return {
        **finding(action, format_time(seen)),
        "evidence": f"XID {code} {name} ({bucket}) x1",
    }


def xid79(seen: float = T0 - 60) -> dict[str, Any]:
    return xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "replace", seen)


def xid95(seen: float = T0 - 60) -> dict[str, Any]:
    return xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "reboot", seen)


def plain(check: str, action: str = "reboot") -> dict[str, Any]:
    """A finding no ladder rule matches: its own action, one step."""
    return {**finding(action), "check": check, "component": "node", "evidence": check}


def records(controller: RemediationController) -> list[dict[str, Any]]:
    return controller.auditor.recent(10_000)


def metrics(controller: RemediationController) -> str:
    return encode_text(controller.families()).decode()


class ResettingRecorder(Recorder):
    """A provider that can reset a single GPU (a webhook to automation that runs nvidia-smi -r)."""

    actions = frozenset({"reset", "reboot", "replace"})


# --- the ladder ---------------------------------------------------------------------------------


def test_xid79_reboots_first_and_replaces_when_the_gpu_fails_again_within_24h() -> None:
    controller, provider, writer, clock = make()
    assert feed(controller, node("n1", [xid79()])) == [("n1", "act")]
    assert provider.calls == [("n1", "reboot")]  # today's code: replace at once
    [mark] = writer.states["n1"].ladder
    assert (mark.rule, mark.component, mark.step, mark.performed) == ("xid-79", "gpu3", 0, "reboot")
    act = next(r for r in records(controller) if r["verdict"] == "act")
    assert any("xid-79@gpu3 step 1/2 reboot" in step for step in act["ladder"])
    # the node reboots and reports healthy, then gpu3 falls off the bus again 2 h later
    clock.now += 1800
    assert feed(controller, node("n1", [])) == []
    assert writer.states["n1"].outcome == "recovered"
    clock.now += 1.5 * H
    assert feed(controller, node("n1", [xid79(clock.now - 30)])) == [("n1", "act")]
    assert provider.calls == [("n1", "reboot"), ("n1", "replace")]
    state = writer.states["n1"]
    assert (state.action, state.attempts, state.ladder[0].step) == ("replace", 2, 1)
    act = [r for r in records(controller) if r["verdict"] == "act"][-1]
    assert any("step 2/2 replace (again 2.0 h after a reboot)" in s for s in act["ladder"])
    event = node_event(AuditRecord(**{k: v for k, v in _record_fields(act).items()}))
    assert "xid-79@gpu3 step 2/2 replace" in event["message"]


def _record_fields(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": record["audit"],
        "node": record["node"],
        "verdict": record["verdict"],
        "reason": record["reason"],
        "detail": record["detail"],
        "at": record["at"],
        "action": record["action"],
        "mode": record["mode"],
        "ladder": tuple(record["ladder"]),
    }


def test_the_same_failure_after_the_window_starts_from_the_first_step() -> None:
    controller, provider, writer, clock = make()
    feed(controller, node("n1", [xid79()]))
    clock.now += 1800
    feed(controller, node("n1", []))
    clock.now += 25 * H  # beyond the reboot step's 24 h
    assert feed(controller, node("n1", [xid79(clock.now - 30)])) == [("n1", "act")]
    assert provider.calls == [("n1", "reboot"), ("n1", "reboot")]
    assert writer.states["n1"].ladder[0].at == clock.now  # a new mark, step 1 again


def test_a_reset_step_is_a_reboot_where_the_provider_cannot_reset_one_gpu() -> None:
    controller, provider, writer, clock = make()  # the recorder declares no reset, like HyperPod
    assert feed(controller, node("n1", [xid95()])) == [("n1", "act")]
    assert provider.calls == [("n1", "reboot")]
    state = writer.states["n1"]
    assert state.action == "reset" and "(reset done as reboot)" in state.message
    assert (state.ladder[0].action, state.ladder[0].performed) == ("reset", "reboot")
    clock.now += 1800
    feed(controller, node("n1", []))
    clock.now += H
    feed(controller, node("n1", [xid95(clock.now - 30)]))
    # the node was rebooted already: the next step up is a replacement, not a second reboot
    assert provider.calls[-1] == ("n1", "replace")


def test_a_provider_that_can_reset_gets_a_reset_then_a_reboot() -> None:
    controller, provider, _, clock = make(provider=ResettingRecorder())
    feed(controller, node("n1", [xid95()]))
    clock.now += 1800
    feed(controller, node("n1", []))
    clock.now += H
    feed(controller, node("n1", [xid95(clock.now - 30)]))
    assert provider.calls == [("n1", "reset"), ("n1", "reboot")]


def test_a_failed_step_is_tried_again_not_climbed_past() -> None:
    controller, provider, writer, clock = make(provider=Recorder(ok=False))
    feed(controller, node("n1", [xid79()]))
    assert writer.states["n1"].outcome == "failed" and writer.states["n1"].ladder == ()
    clock.now += 700  # past the cooldown
    feed(controller, node("n1", [xid79()]))
    assert provider.calls == [("n1", "reboot"), ("n1", "reboot")]


def test_status_api_shows_each_findings_step_and_the_ladder_in_force() -> None:
    controller, _, _, _ = make(PolicyConfig())  # observe: decides, writes nothing
    feed(controller, node("n1", [xid79(), {**xid95(), "component": "gpu1"}]))
    status = json.loads(json.dumps(controller.status()))  # what GET /api/v1/remediation sends
    [entry] = status["nodes"]
    steps = {(s["rule"], s["component"], s["action"], s["next"]) for s in entry["ladder"]}
    assert steps == {
        ("xid-79", "gpu3", "reboot", "replace"),
        ("xid-reset", "gpu1", "reset", "reboot"),
    }
    assert entry["requested"] == "reboot"
    assert "xid-79" in {r["name"] for r in status["ladder"]}
    assert status["lifecycle"]["healthy_reset_seconds"] == 24 * H
    observe = next(r for r in status["recent"] if r["reason"] == "observe")
    assert "would reboot" in observe["detail"] and len(observe["ladder"]) == 2


@pytest.fixture
def api() -> Iterator[tuple[ObjectStore, Any]]:
    store = ObjectStore()
    with FakeApiServer(store) as server:
        yield store, kubernetes.client.CoreV1Api(kube_api_client(server.url))


def agent_writes(core: Any, name: str, findings: Sequence[dict[str, Any]]) -> None:
    """The node agent's write of its findings (its field manager, as in production)."""
    body = {"metadata": {"annotations": {FINDINGS_ANNOTATION: json.dumps(list(findings))}}}
    core.patch_node(name, body, field_manager=AGENT_FIELD_MANAGER, _content_type=MERGE_PATCH)


def test_a_restarted_controller_continues_the_ladder_from_the_annotation(
    api: tuple[ObjectStore, Any],
) -> None:
    store, core = api
    store.upsert("nodes", {k: v for k, v in node("n1").items()})
    agent_writes(core, "n1", [xid79()])
    clock = Clock()

    def controller() -> RemediationController:
        return RemediationController(
            ACT, [HyperPodLabeler(core)], KubeNodeWriter(core), clock=clock
        )

    def observe(c: RemediationController) -> list[tuple[str, str, str | None]]:
        c.observe_node(store.get("nodes", "", "n1"), clock.now)  # type: ignore[arg-type]
        return [(d.node, d.reason, d.action) for d in c.run_once()]

    def health() -> str:
        obj = store.get("nodes", "", "n1")
        assert obj is not None
        return str(obj["metadata"]["labels"][HEALTH])

    first = controller()
    assert observe(first) == [("n1", "act", "reboot")]
    assert health() == "UnschedulablePendingReboot"
    # HyperPod reboots the node and clears its label; the agent reports healthy
    clock.now += 1800
    core.patch_node(
        "n1", {"metadata": {"labels": {HEALTH: "Schedulable"}}}, _content_type=MERGE_PATCH
    )
    agent_writes(core, "n1", [])
    assert observe(first) == []
    # the controller restarts; an hour later gpu3 falls off the bus again
    clock.now += H
    agent_writes(core, "n1", [xid79(clock.now - 30)])
    second = controller()  # empty memory: all it knows is on the Node
    assert observe(second) == [("n1", "act", "replace")]
    assert health() == "UnschedulablePendingReplacement"
    stored = store.get("nodes", "", "n1")
    assert stored is not None
    state, problem = parse_state(stored["metadata"]["annotations"][STATE])
    assert problem is None and state is not None
    assert (state.action, state.attempts, state.outcome) == ("replace", 2, "done")
    assert [(m.rule, m.step, m.performed) for m in state.ladder] == [("xid-79", 1, "replace")]
    events = [e for e in store.items("events") if e["reason"] == "RemediationStarted"]
    assert any("step 2/2 replace" in e["message"] for e in events)


# --- lifecycle ----------------------------------------------------------------------------------


def test_attempts_reset_after_the_node_is_healthy_for_the_configured_time() -> None:
    config = replace(ACT, max_attempts=1, healthy_reset_s=H)
    controller, provider, writer, clock = make(config)
    sick = node("n1", [plain("rootfs_read_only")])
    assert feed(controller, sick) == [("n1", "act")]
    clock.now += 600
    feed(controller, node("n1", []))
    assert writer.states["n1"].healthy_since == clock.now
    clock.now += 1200
    assert feed(controller, sick) == [("n1", "attempts_exhausted")]
    assert writer.states["n1"].healthy_since is None  # the healthy clock stopped
    clock.now += 600
    feed(controller, node("n1", []))  # healthy again: the clock starts over
    clock.now += 50 * 60
    controller.run_once()  # the periodic recheck: 50 min healthy is not enough
    assert writer.states["n1"].attempts == 1
    clock.now += 11 * 60
    controller.run_once()
    assert writer.states["n1"].attempts == 0
    assert ("n1", "attempts_reset", "attempts_reset") in trail(controller)
    assert "RemediationAttemptsReset" in {node_event(e)["reason"] for e in writer.events}
    assert 'topowatch_remediation_lifecycle_total{reason="attempts_reset"} 1' in metrics(controller)
    assert feed(controller, sick) == [("n1", "act")]
    assert writer.states["n1"].attempts == 1 and len(provider.calls) == 2


def alerts(*items: dict[str, Any], status: str = "firing") -> Any:
    return parse_alertmanager(
        json.dumps({"version": "4", "status": status, "alerts": list(items)}).encode()
    )


def alert(node_name: str, status: str = "firing", **extra: Any) -> dict[str, Any]:
    labels = {"alertname": "GpuDead", "node": node_name, "action": "reboot"}
    return {"status": status, "labels": labels, "fingerprint": f"fp-{node_name}", **extra}


def test_a_resolved_alert_withdraws_its_request_and_is_audited() -> None:
    config = replace(ACT, budget_nodes=1)
    controller, provider, writer, clock = make(config)
    feed(controller, node("n0", [plain("rootfs_read_only")]), node("n1"))
    assert provider.calls == [("n0", "reboot")]
    controller.handle_alerts(alerts(alert("n1")), clock.now)
    assert [(d.node, d.reason) for d in controller.run_once()] == [("n1", "budget_concurrent")]
    controller.handle_alerts(alerts(alert("n1", "resolved")), clock.now)
    controller.run_once()
    cancelled = [r for r in records(controller) if r["audit"] == "alert"]
    assert [(r["node"], r["verdict"], r["reason"], r["action"]) for r in cancelled] == [
        ("n1", "cancelled", "alert_resolved", "reboot")
    ]
    assert "withdrawn" in cancelled[0]["detail"]
    assert "RemediationCancelled" in {node_event(e)["reason"] for e in writer.events}
    # n0 recovers and the budget frees up: n1 no longer asks for anything
    clock.now += 2 * H
    feed(controller, node("n0", []))
    controller.run_once()
    assert provider.calls == [("n0", "reboot")]
    assert controller.status()["nodes"][-1]["node"] == "n0"
    assert 'topowatch_remediation_alerts_resolved_total{result="resolved"} 1' in metrics(controller)


def test_ends_at_in_the_past_ends_an_alert_even_marked_firing() -> None:
    controller, provider, _, clock = make(PolicyConfig())
    feed(controller, node("n1"))
    controller.handle_alerts(alerts(alert("n1")), clock.now)
    assert feed(controller) == [("n1", "observe")]
    ended = alert("n1", "firing", endsAt="2025-06-15T15:00:00Z")  # before T0
    controller.handle_alerts(alerts(ended), clock.now)
    controller.run_once()
    assert ("n1", "cancelled", "alert_expired") in trail(controller)
    assert controller.status()["nodes"] == []  # nothing asked for any more
    assert provider.calls == []


def test_a_firing_alert_expires_at_its_ends_at_lease_or_time_to_live() -> None:
    config = replace(PolicyConfig(), alert_ttl_s=2 * H)
    controller, _, _, clock = make(config)
    feed(controller, node("n1"), node("n2"))
    lease = alert("n1", endsAt=format_time(clock.now + 600))  # a sender's lease
    controller.handle_alerts(alerts(lease, alert("n2")), clock.now)
    controller.run_once()
    assert {n["node"] for n in controller.status()["nodes"]} == {"n1", "n2"}
    clock.now += 601
    controller.run_once()
    assert {n["node"] for n in controller.status()["nodes"]} == {"n2"}
    clock.now += 2 * H  # a lost resolve: n2's alert was never sent again
    controller.run_once()
    assert controller.status()["nodes"] == []
    expired = [r["node"] for r in records(controller) if r["reason"] == "alert_expired"]
    assert expired == ["n1", "n2"]


def test_a_resolved_alert_for_an_unknown_node_is_a_counted_logged_no_op(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller, provider, writer, clock = make()
    feed(controller, node("n1"))
    caplog.set_level(logging.INFO, "topowatch.audit")
    controller.handle_alerts(alerts(alert("ghost", "resolved"), alert("n1", "resolved")), clock.now)
    assert controller.run_once() == []
    assert provider.calls == [] and writer.states == {} and writer.events == []
    body = metrics(controller)
    assert 'topowatch_remediation_alerts_resolved_total{result="unknown_node"} 1' in body
    assert 'topowatch_remediation_alerts_resolved_total{result="not_firing"} 1' in body
    assert "topowatch_remediation_problems_total" not in body  # not an error
    assert any("ghost" in m and "no-op" in m for m in caplog.messages)


def test_a_deleted_nodes_state_is_audited_then_dropped_but_still_counts_this_hour() -> None:
    config = replace(ACT, budget_nodes=1)
    controller, provider, _, clock = make(config)
    sick = node("n0", [plain("rootfs_read_only")])
    feed(controller, sick)
    assert provider.calls == [("n0", "reboot")]
    controller.observe_node(sick, clock.now, deleted=True)
    controller.run_once()
    deleted = [r for r in records(controller) if r["reason"] == "node_deleted"]
    assert [(r["node"], r["audit"], r["action"]) for r in deleted] == [
        ("n0", "lifecycle", "reboot")
    ]
    assert "reboot done" in deleted[0]["detail"]
    assert controller.status()["nodes"] == []  # dropped, not kept as "gone" forever
    # the hourly budget still counts the action on the deleted node
    clock.now += 600
    assert feed(controller, node("n1", [plain("rootfs_read_only")])) == [("n1", "budget_hourly")]
    clock.now += H
    assert feed(controller) == [("n1", "act")]
    # a node deleted without any remediation state leaves no record
    controller.observe_node(node("n9"), clock.now)
    controller.run_once()
    controller.observe_node(node("n9"), clock.now, deleted=True)
    controller.run_once()
    assert [r["node"] for r in records(controller) if r["reason"] == "node_deleted"] == ["n0"]


class RefusingWriter(DictWriter):
    """An API that refuses Events, as one without `create events` for the service account."""

    def post_event(self, record: AuditRecord) -> None:
        error = kubernetes.client.ApiException(status=403, reason="Forbidden")
        raise error


def test_observe_mode_posts_events_and_a_refused_event_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller, _, _, _ = make(PolicyConfig(), writer=RefusingWriter())
    caplog.set_level(logging.WARNING, "topowatch.audit")
    assert feed(controller, node("n1", [xid79()])) == [("n1", "observe")]
    body = metrics(controller)
    assert 'topowatch_remediation_event_write_failures_total{error="403"} 1' in body
    assert any(
        "could not write the Event for observe on node n1 (403)" in m for m in caplog.messages
    )
    assert promtool_lint(encode_text(controller.families())) == ""


def test_observe_mode_keeps_the_lifecycle_in_memory_and_writes_nothing() -> None:
    done = RemediationState("reboot", T0 - 600, "hyperpod", 1, "done")
    controller, _, writer, _ = make(PolicyConfig())
    feed(controller, node("n1", [], annotations={STATE: dump_state(done)}))
    assert writer.states == {}  # observe touches nothing on Nodes
    [entry] = controller.status()["nodes"]
    assert entry["state"]["outcome"] == "recovered" and entry["state"]["healthy_since"] == T0
    assert "RemediationRecovered" in {node_event(e)["reason"] for e in writer.events}


class FailingResults(Recorder):
    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        raise RuntimeError("provider bug")


def test_a_provider_that_raises_is_reported_once_per_node() -> None:
    controller, _, writer, _ = make(provider=FailingResults())
    feed(controller, node("n1", [xid79()]))
    assert writer.states["n1"].message == "recorder: raised: provider bug"


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ladder", "why"),
    [
        (
            "{rules: [{name: x, check: xid, xid: [79], steps: [reboot, replace, reboot]}]}",
            "loops",
        ),
        ("{rules: [{name: x, check: xid, steps: [reboot, drain]}]}", "unknown action 'drain'"),
        (
            "{rules: [{name: x, check: xid, bucket: [RESTART_BM], steps: [reboot], when: 1}]}",
            "when",
        ),
    ],
)
def test_a_bad_ladder_stops_the_service_at_start_up(tmp_path: Path, ladder: str, why: str) -> None:
    config = tmp_path / "remediation.yaml"
    config.write_text(f"mode: act\nproviders: [hyperpod]\nladder: {ladder}\n")
    with pytest.raises(RemediationConfigError, match=why):
        build_controller(config, kube_api_client("http://127.0.0.1:1"))


def test_a_good_ladder_and_lifecycle_settings_are_read(tmp_path: Path) -> None:
    config = tmp_path / "remediation.yaml"
    config.write_text(
        "mode: act\nproviders: [hyperpod]\nhealthy_reset_seconds: 7200\nalert_ttl_seconds: 0\n"
        "ladder:\n  rules:\n    - {name: xid-79, check: xid, xid: [79], within_hours: 12,"
        " steps: [reboot, replace]}\n"
    )
    controller, _ = build_controller(config, kube_api_client("http://127.0.0.1:1"))
    assert (controller.config.healthy_reset_s, controller.config.alert_ttl_s) == (7200.0, 0.0)
    rule = controller.config.ladder.rule_named("xid-79")
    assert rule is not None and rule.steps[0].within_s == 12 * H


def test_the_documented_example_config_is_one_the_service_accepts() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "remediation.md").read_text()
    block = page.split("# remediation.yaml\n", 1)[1].split("```", 1)[0]
    config, problems = PolicyConfig.from_mapping(yaml.safe_load(block))
    assert problems == [] and config.mode == "act"
    assert [r.name for r in config.ladder.rules][:2] == ["xid-79", "nvlink"]
