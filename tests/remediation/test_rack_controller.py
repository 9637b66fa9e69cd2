"""Rack-level escalation wired into the controller (issue 30 item 3): off by default; when on,
half an UltraServer bad makes one rack request (webhook: one POST; HyperPod: its members'
labels as one decision), one audit record naming the members, budget counted as its nodes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import kubernetes
import pytest

from exporter.cluster.run import RemediationConfigError, controller_from_mapping
from exporter.core.findings import FINDINGS_ANNOTATION
from exporter.core.provenance import agent_entry
from exporter.topology.labels import ULTRASERVER_KEY
from healthcheck.remediation.audit import AuditRecord
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.policy import PolicyConfig
from healthcheck.remediation.providers.base import Provider
from healthcheck.remediation.providers.hyperpod import HyperPodLabeler
from healthcheck.remediation.providers.webhook import WebhookNotifier
from healthcheck.remediation.state import RemediationState

T0 = 1_750_000_000.0
HEALTH = "sagemaker.amazonaws.com/node-health-status"
RACK = "us-rack-a"
# Budget room for a whole rack (18) and a breaker that a storm of per-node requests would trip.
ON = PolicyConfig(
    mode="act", budget_nodes=20, budget_percent=0, cooldown_s=600, rack_escalation=True
)
OFF = PolicyConfig(mode="act", budget_nodes=20, budget_percent=0, breaker_threshold=50)


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        type(self).received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/remediate", handler
    server.shutdown()
    server.server_close()


class DictWriter:
    def __init__(self) -> None:
        self.states: dict[str, RemediationState] = {}
        self.events: list[AuditRecord] = []

    def write_state(self, node: str, state: RemediationState) -> None:
        self.states[node] = state

    def post_event(self, record: AuditRecord) -> None:
        self.events.append(record)


class FakeCore:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> None:
        self.patches.append((name, body))


def finding(action: str = "replace") -> dict[str, Any]:
    return {
        "check": "xid",
        "component": "gpu3",
        "severity": "fatal",
        "action": action,
        "evidence": "XID 79 fallen off the bus",
        "firstSeen": "2025-06-15T15:06:40Z",
        "lastSeen": "2025-06-15T15:06:40Z",
        "actionable": True,
    }


def rack_nodes(bad: int, total: int = 18) -> list[dict[str, Any]]:
    """An UltraServer of `total` nodes, the first `bad` of them with a fatal finding."""
    objs = []
    for i in range(total):
        notes = {FINDINGS_ANNOTATION: json.dumps([finding()] if i < bad else [])}
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"n{i:02d}",
                    "labels": {HEALTH: "Schedulable", ULTRASERVER_KEY: RACK},
                    "annotations": notes,
                    "managedFields": [agent_entry()],
                },
                "status": {"capacity": {"nvidia.com/gpu": "4"}},
            }
        )
    return objs


def run(
    config: PolicyConfig, provider: Provider, objs: list[dict[str, Any]]
) -> tuple[RemediationController, DictWriter]:
    writer = DictWriter()
    controller = RemediationController(config, [provider], writer, clock=lambda: T0)
    for obj in objs:
        controller.observe_node(obj, T0)
    controller.run_once()
    return controller, writer


def decisions(controller: RemediationController) -> list[AuditRecord]:
    return [r for r in controller.auditor.trail if r.kind == "decision"]


def test_off_by_default_each_bad_node_is_its_own_request(hook: tuple[str, type[_Hook]]) -> None:
    assert PolicyConfig().rack_escalation is False
    url, handler = hook
    controller, writer = run(OFF, WebhookNotifier(url), rack_nodes(9))
    assert sorted(body["node"] for body in handler.received) == [f"n{i:02d}" for i in range(9)]
    assert len(decisions(controller)) == 9 and controller.rack_decisions == []
    assert len(writer.states) == 9


def test_half_a_rack_bad_is_one_webhook_request_and_one_audit_record(
    hook: tuple[str, type[_Hook]],
) -> None:
    url, handler = hook
    controller, writer = run(ON, WebhookNotifier(url), rack_nodes(9))
    [body] = handler.received  # one POST for the rack, never 9 (or 18)
    assert body["scope"] == "ultraserver" and body["ultraserver"] == RACK
    assert body["action"] == "reboot"  # XID 79: the ladder's first step
    assert body["nodes"] == [f"n{i:02d}" for i in range(18)]
    assert body["bad_nodes"] == [f"n{i:02d}" for i in range(9)]
    [record] = decisions(controller)
    assert (record.verdict, record.reason, record.action) == ("act", "act", "reboot")
    assert RACK in record.detail and "n17" in record.detail  # names the rack and its members
    [event] = [e for e in writer.events if e.kind == "decision"]
    assert event is record
    # every member's state: an attempt, done, so in progress / cooldown hold it next round
    assert sorted(writer.states) == [f"n{i:02d}" for i in range(18)]
    assert all(s.attempts == 1 and s.outcome == "done" for s in writer.states.values())
    [outcome] = [r for r in controller.auditor.trail if r.kind == "outcome"]
    assert outcome.verdict == "succeeded" and RACK in outcome.detail
    # the rack's own 9 failures did not block it; they count in the breaker afterwards
    assert controller.breaker.tripped
    for obj in rack_nodes(9):
        controller.observe_node(obj, T0)
    controller.run_once()
    assert len(handler.received) == 1  # asked once


def test_below_the_share_each_node_is_asked_as_before(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    config = PolicyConfig(
        mode="act", budget_nodes=20, budget_percent=0, breaker_threshold=50, rack_escalation=True
    )
    controller, _ = run(config, WebhookNotifier(url), rack_nodes(8))
    assert sorted(body["node"] for body in handler.received) == [f"n{i:02d}" for i in range(8)]
    assert controller.rack_decisions == []


def test_a_rack_larger_than_the_budget_is_refused_with_the_numbers(
    hook: tuple[str, type[_Hook]],
) -> None:
    url, handler = hook
    config = PolicyConfig(mode="act", budget_nodes=10, budget_percent=0, rack_escalation=True)
    controller, writer = run(config, WebhookNotifier(url), rack_nodes(9))
    assert handler.received == [] and writer.states == {}
    [record] = decisions(controller)
    assert (record.verdict, record.reason) == ("skip", "budget_concurrent")
    assert "18 nodes would make 18 of 10" in record.detail


def test_observe_mode_decides_the_rack_and_writes_nothing(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    config = PolicyConfig(budget_nodes=20, budget_percent=0, rack_escalation=True)
    controller, writer = run(config, WebhookNotifier(url), rack_nodes(9))
    assert handler.received == [] and writer.states == {}
    [record] = decisions(controller)
    assert (record.verdict, record.reason) == ("skip", "observe")
    assert "would reboot the rack: 9 of 18 nodes bad (50%)" in record.detail


def test_hyperpod_labels_every_member_as_one_rack_action() -> None:
    core = FakeCore()
    controller, writer = run(ON, HyperPodLabeler(core), rack_nodes(10))
    assert sorted(name for name, _ in core.patches) == [f"n{i:02d}" for i in range(18)]
    assert {b["metadata"]["labels"][HEALTH] for _, b in core.patches} == {
        "UnschedulablePendingReboot"
    }
    [record] = decisions(controller)
    assert record.reason == "act" and "10 of 18 nodes bad" in record.detail
    [outcome] = [r for r in controller.auditor.trail if r.kind == "outcome"]
    assert outcome.verdict == "succeeded" and "18 of 18 nodes" in outcome.detail
    # every member holds the rack's action; the bad ones' ladder step is marked taken
    assert all(s.action == "reboot" and s.attempts == 1 for s in writer.states.values())
    assert writer.states["n00"].ladder and not writer.states["n17"].ladder


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"enabled": "yes"}, "rack_escalation.enabled='yes' is not true|false"),
        ({"enabled": True, "share": 0}, "rack_escalation.share=0 is not a share"),
        ({"enabled": True, "share": 1.5}, "rack_escalation.share=1.5"),
        ({"enabled": True, "shares": 0.5}, "unknown key 'shares'"),
        ("on", "rack_escalation must be a mapping"),
    ],
)
def test_a_bad_rack_escalation_value_is_a_clear_error(raw: Any, words: str) -> None:
    policy, problems = PolicyConfig.from_mapping({"rack_escalation": raw})
    assert policy.rack_escalation is False
    assert any(words in p for p in problems), problems
    with pytest.raises(RemediationConfigError, match="rack_escalation"):
        controller_from_mapping({"rack_escalation": raw}, kubernetes.client.ApiClient())


def test_rack_escalation_is_read_from_the_policy_yaml() -> None:
    policy, problems = PolicyConfig.from_mapping({"rack_escalation": {"enabled": True}})
    assert problems == [] and policy.rack_escalation and policy.rack_share == 0.5
    policy, problems = PolicyConfig.from_mapping({"rack_escalation": {"share": 0.75}})
    assert problems == [] and not policy.rack_escalation and policy.rack_share == 0.75


def test_a_failed_rack_request_is_not_repeated_within_the_cooldown() -> None:
    down = WebhookNotifier("http://127.0.0.1:1/x", timeout_s=1)
    controller, writer = run(ON, down, rack_nodes(9))
    [outcome] = [r for r in controller.auditor.trail if r.kind == "outcome"]
    assert outcome.verdict == "failed" and "unreachable" in outcome.detail
    assert {s.outcome for s in writer.states.values()} == {"failed"}
    assert not writer.states["n00"].ladder  # not taken: the step is tried again later
    for obj in rack_nodes(9):
        controller.observe_node(obj, T0 + 60)
    controller.run_once()
    assert [d.reason for d in controller.rack_decisions] == ["cooldown"]
    assert sum(1 for r in controller.auditor.trail if r.kind == "outcome") == 1


def test_a_member_with_an_unreadable_state_holds_the_rack(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    objs = rack_nodes(9)
    objs[17]["metadata"]["annotations"]["topowatch.io/remediation"] = "{not json"
    controller, writer = run(ON, WebhookNotifier(url), objs)
    assert handler.received == [] and writer.states == {}
    assert [d.reason for d in controller.rack_decisions] == ["malformed_state"]


def test_the_remediation_status_shows_what_was_escalated_for_which_rack_and_why(
    hook: tuple[str, type[_Hook]],
) -> None:
    """/api/v1/remediation (`RemediationController.status`) names the setting and the rack
    decisions: which UltraServer, what it was asked, its bad nodes and the reason."""
    url, _ = hook
    controller, _ = run(ON, WebhookNotifier(url), rack_nodes(9))
    rack = controller.status()["rack_escalation"]
    assert (rack["enabled"], rack["share"]) == (True, 0.5)
    [decision] = rack["decisions"]
    assert decision["scope"] == "ultraserver" and decision["ultraserver"] == RACK
    assert (decision["action"], decision["verdict"]) == ("reboot", "act")
    assert decision["bad_nodes"] == [f"n{i:02d}" for i in range(9)]
    assert decision["detail"] == "reboot the rack: 9 of 18 nodes bad (50%)"  # why
    json.dumps(controller.status())  # what the route answers: JSON as it is
    off, _ = run(OFF, WebhookNotifier(url), rack_nodes(9))
    assert off.status()["rack_escalation"] == {"enabled": False, "share": 0.5, "decisions": []}
