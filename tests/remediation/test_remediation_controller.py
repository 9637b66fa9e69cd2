"""The remediation controller: Node reports and alerts in, safe actions out, an audit of all.

Most tests drive `run_once()` directly (no threads) with a recording provider; the state
annotation tests go through the simulated API server and the official client, so a restart
really reads back what the previous controller wrote; the HTTP tests run the cluster service.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import kubernetes
import pytest

from exporter.cluster.run import kube_api_client
from exporter.cluster.service import ClusterService
from exporter.core.findings import FINDINGS_ANNOTATION
from exporter.core.provenance import AGENT_FIELD_MANAGER, agent_entry
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from healthcheck.remediation.alerts import parse_alertmanager
from healthcheck.remediation.audit import AuditRecord
from healthcheck.remediation.controller import KubeNodeWriter, RemediationController
from healthcheck.remediation.policy import PolicyConfig
from healthcheck.remediation.providers.base import ActionRequest, ActionResult
from healthcheck.remediation.providers.hyperpod import HyperPodLabeler
from healthcheck.remediation.state import ANNOTATION as STATE
from healthcheck.remediation.state import RemediationState, dump_state, parse_state
from tests.conftest import serving

HEALTH = "sagemaker.amazonaws.com/node-health-status"
T0 = 1_750_000_000.0
ACT = PolicyConfig(
    mode="act", budget_nodes=2, budget_percent=0, breaker_threshold=5, cooldown_s=600
)


def finding(action: str = "replace", first_seen: str = "2025-06-15T15:06:40Z") -> dict[str, Any]:
    return {
        "check": "xid",
        "component": "gpu3",
        "severity": "fatal",
        "action": action,
        "evidence": "XID 79 fallen off the bus",
        "firstSeen": first_seen,
        "lastSeen": first_seen,
        "actionable": True,
    }


def node(
    name: str,
    findings: list[dict[str, Any]] | str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    notes = dict(annotations or {})
    if findings is not None:
        notes[FINDINGS_ANNOTATION] = findings if isinstance(findings, str) else json.dumps(findings)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {HEALTH: "Schedulable", **(labels or {})},
            "annotations": notes,
            "managedFields": [agent_entry()],  # the node's agent wrote the findings
        },
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


class Recorder:
    name = "recorder"

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[str, str]] = []

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        self.calls += [(r.node, r.action) for r in requests]
        return [ActionResult(r.node, self.ok, "recorded" if self.ok else "boom") for r in requests]


class DictWriter:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.states: dict[str, RemediationState] = {}
        self.events: list[AuditRecord] = []

    def write_state(self, node: str, state: RemediationState) -> None:
        if self.fail:
            raise OSError("apiserver unreachable")
        self.states[node] = state

    def post_event(self, record: AuditRecord) -> None:
        self.events.append(record)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def make(
    config: PolicyConfig = ACT, provider: Recorder | None = None, writer: DictWriter | None = None
) -> tuple[RemediationController, Recorder, DictWriter, Clock]:
    provider = provider or Recorder()
    writer = writer or DictWriter()
    clock = Clock()
    controller = RemediationController(config, [provider], writer, clock=clock)
    return controller, provider, writer, clock


def feed(controller: RemediationController, *objs: dict[str, Any]) -> list[tuple[str, str]]:
    for obj in objs:
        controller.observe_node(obj, T0)
    return [(d.node, d.reason) for d in controller.run_once()]


def trail(controller: RemediationController) -> list[tuple[str, str, str]]:
    return [(r["node"], r["verdict"], r["reason"]) for r in controller.auditor.recent(10_000)]


def test_observe_mode_decides_and_logs_but_touches_nothing() -> None:
    controller, provider, writer, _ = make(PolicyConfig())
    assert feed(controller, node("n1", [finding()])) == [("n1", "observe")]
    assert provider.calls == [] and writer.states == {}
    assert ("n1", "skip", "observe") in trail(controller)
    assert [e.reason for e in writer.events] == ["observe"]  # the Event says so too


def test_act_mode_acts_once_and_records_state() -> None:
    controller, provider, writer, _ = make()
    healthy = node("ok", [])
    # the stronger remedy wins: XID 79's first ladder step (a reboot) and a row-remap failure
    # (replace; no ladder rule)
    remap = {**finding(), "check": "row_remap_failure", "evidence": "row remapping failed"}
    assert feed(controller, node("n1", [finding("reboot"), remap]), healthy) == [("n1", "act")]
    assert provider.calls == [("n1", "replace")]
    assert writer.states["n1"].outcome == "done" and writer.states["n1"].attempts == 1
    # the same report again (every poll re-sends the Node) is not a second action
    assert feed(controller, node("n1", [finding()])) == [("n1", "in_progress")]
    assert feed(controller, node("n1", [finding()])) == []  # identical skip: not re-audited
    assert provider.calls == [("n1", "replace")]


def test_budget_caps_actions_and_waiting_nodes_get_their_turn() -> None:
    controller, provider, writer, clock = make()
    feed(controller, *(node(f"n{i}", [finding()]) for i in range(4)))
    assert len(provider.calls) == 2
    assert sum(1 for _, v, r in trail(controller) if r == "budget_concurrent") == 2
    # one node recovers: a slot opens at once, but two actions this hour use the hourly budget
    acted = provider.calls[0][0]
    clock.now += 30
    assert ("n2", "budget_hourly") in feed(controller, node(acted, []))
    assert writer.states[acted].outcome == "recovered"
    assert len(provider.calls) == 2
    # an hour later the periodic recheck gives a waiting node its turn
    clock.now += 3600
    assert feed(controller) == [("n2", "act"), ("n3", "budget_concurrent")]
    assert len(provider.calls) == 3


def test_breaker_trips_on_a_storm_and_only_an_admin_resets_it() -> None:
    controller, provider, _, clock = make()
    feed(controller, *(node(f"n{i}", [finding()]) for i in range(10)))
    assert controller.breaker.tripped
    assert provider.calls == []  # the storm was seen before any action: nothing acted
    assert any(r["audit"] == "breaker" for r in controller.auditor.recent())
    clock.now += 7200
    controller.run_once()
    assert controller.breaker.tripped and provider.calls == []
    controller.reset_breaker(clock.now, "alice")
    controller.run_once()
    assert len(provider.calls) == 2  # the budget still applies after a reset
    body = b"".join(f.name.encode() for f in controller.families())
    assert b"topowatch_remediation_breaker_tripped" in body


def test_opt_out_label_and_hyperpod_pending_are_honoured() -> None:
    controller, provider, _, _ = make()
    opted = node("n1", [finding()], labels={"topowatch.io/remediation": "disabled"})
    pending = node("n2", [finding()], labels={HEALTH: "UnschedulablePendingReplacement"})
    assert sorted(feed(controller, opted, pending)) == [
        ("n1", "opted_out"),
        ("n2", "already_pending"),
    ]
    assert provider.calls == []


def test_provider_failure_is_audited_and_cooldown_prevents_hammering() -> None:
    controller, _, writer, clock = make(provider=Recorder(ok=False))
    feed(controller, node("n1", [finding()]))
    assert writer.states["n1"].outcome == "failed" and "boom" in writer.states["n1"].message
    assert ("n1", "failed", "provider") in trail(controller)
    clock.now += 60
    assert feed(controller, node("n1", [finding()])) == [("n1", "cooldown")]
    clock.now += 600
    assert feed(controller, node("n1", [finding()])) == [("n1", "act")]
    assert writer.states["n1"].attempts == 2


def test_unwritable_state_means_no_action() -> None:
    controller, provider, _, _ = make(writer=DictWriter(fail=True))
    feed(controller, node("n1", [finding()]))
    assert provider.calls == []
    assert ("n1", "skip", "state_write_failed") in trail(controller)


@pytest.mark.parametrize(
    "findings",
    ["{not json", '{"check":"xid"}', '[{"check":"xid","action":"replace"}]', "[42]"],
)
def test_malformed_findings_are_a_problem_not_an_action(findings: str) -> None:
    controller, provider, _, _ = make()
    assert feed(controller, node("n1", findings)) == []
    assert provider.calls == []
    assert ("n1", "skip", "malformed_findings") in trail(controller)


def test_malformed_state_annotation_blocks_action_on_that_node() -> None:
    controller, provider, _, _ = make()
    bad = node("n1", [finding()], annotations={STATE: '{"action": "reboot"'})
    assert feed(controller, bad, {"metadata": {}}, {"kind": "garbage"}) == [
        ("n1", "malformed_state")
    ]
    assert provider.calls == []
    assert ("", "skip", "malformed_node") in trail(controller)


def test_alerts_drive_actions_and_unknown_nodes_are_refused() -> None:
    controller, provider, _, _ = make()
    feed(controller, node("n1"), node("n2"))
    payload = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {"labels": {"alertname": "GpuDead", "instance": "n1:9400", "action": "reboot"}},
            {
                "labels": {"alertname": "GpuDead", "node": "ghost"},
                "annotations": {"action": "replace"},
            },
            {"labels": {"alertname": "NoNode"}},
        ],
    }
    controller.handle_alerts(parse_alertmanager(json.dumps(payload).encode()), T0)
    assert [(d.node, d.reason) for d in controller.run_once()] == [("n1", "act")]
    assert provider.calls == [("n1", "reboot")]
    reasons = {(n, r) for n, _, r in trail(controller)}
    assert ("ghost", "unknown_node") in reasons and ("", "alert_ignored") in reasons


# --- through the simulated API server: state survives a restart --------------------------------


@pytest.fixture
def api() -> Iterator[tuple[ObjectStore, Any]]:
    store = ObjectStore()
    with FakeApiServer(store) as server:
        yield store, kubernetes.client.CoreV1Api(kube_api_client(server.url))


def kube_controller(api: Any, provider: Any) -> RemediationController:
    return RemediationController(ACT, [provider], KubeNodeWriter(api), clock=Clock())


def test_hyperpod_label_state_annotation_and_event_then_restart_does_not_repeat(
    api: tuple[ObjectStore, Any],
) -> None:
    store, core = api
    store.upsert("nodes", node("n1", [finding()]))
    first = kube_controller(core, HyperPodLabeler(core))
    first.observe_node(store.get("nodes", "", "n1"), T0)  # type: ignore[arg-type]
    assert [d.reason for d in first.run_once()] == ["act"]
    stored = store.get("nodes", "", "n1")
    assert stored is not None
    # XID 79: the ladder's first step is a reboot (NVIDIA's catalog: RESTART_BM), not replace
    assert stored["metadata"]["labels"][HEALTH] == "UnschedulablePendingReboot"
    state, problem = parse_state(stored["metadata"]["annotations"][STATE])
    assert problem is None and state is not None
    assert (state.action, state.outcome, state.provider) == ("reboot", "done", "hyperpod")
    reasons = {e["reason"] for e in store.items("events")}
    assert {"RemediationStarted", "RemediationAccepted"} <= reasons

    # restart: a new controller (empty memory) sees the node as HyperPod left it
    recorder = Recorder()
    second = kube_controller(core, recorder)
    stored["metadata"]["labels"][HEALTH] = "Schedulable"  # even if HyperPod cleared its label
    second.observe_node(stored, T0)
    assert [d.reason for d in second.run_once()] == ["in_progress"]
    assert recorder.calls == []


def test_restart_after_crash_before_the_provider_call_does_not_repeat(
    api: tuple[ObjectStore, Any],
) -> None:
    store, core = api
    requested = RemediationState("reboot", T0 - 5, "hyperpod", 1, "requested")
    store.upsert("nodes", node("n1", [finding()], annotations={STATE: dump_state(requested)}))
    recorder = Recorder()
    controller = kube_controller(core, recorder)
    controller.observe_node(store.get("nodes", "", "n1"), T0)  # type: ignore[arg-type]
    assert [d.reason for d in controller.run_once()] == ["in_progress"]
    assert recorder.calls == []


# --- HTTP: alerts, status, reset -----------------------------------------------------------------

TOKEN = "s3cret-token"


class Served:
    """The cluster service with `controller` and the alert token (`tests.conftest.serving`,
    held open until `stop`); `call` sends an authenticated request."""

    def __init__(self, url: str, controller: RemediationController) -> None:
        self._serving = serving(url, controller=controller, alerts_token=TOKEN)
        self.port, _ = self._serving.__enter__()

    def call(
        self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=body, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def stop(self) -> None:
        self._serving.__exit__(None, None, None)


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {check}")


def test_service_forwards_node_events_and_guards_alerts_and_reset() -> None:
    store = ObjectStore()
    for i in range(8):
        store.upsert("nodes", node(f"n{i}"))
    with FakeApiServer(store, bookmark_interval=0.2) as server:
        core = kubernetes.client.CoreV1Api(kube_api_client(server.url))
        config = PolicyConfig(mode="act", budget_nodes=8, breaker_threshold=2, cooldown_s=600)
        controller = RemediationController(config, [HyperPodLabeler(core)], KubeNodeWriter(core))
        served = Served(server.url, controller)
        try:
            # a finding written by a node agent reaches the controller through the informer
            patched = node("n0", [finding(first_seen="2020-01-01T00:00:00Z")])
            core.patch_node(
                "n0",
                {"metadata": patched["metadata"]},
                field_manager=AGENT_FIELD_MANAGER,  # as the agent writes (healthcheck/provenance)
                _content_type="application/merge-patch+json",
            )

            def labelled(name: str) -> bool:
                obj = store.get("nodes", "", name)
                return obj is not None and obj["metadata"]["labels"][HEALTH] != "Schedulable"

            eventually(lambda: labelled("n0"))

            alerts = {
                "version": "4",
                "alerts": [
                    {"status": "firing", "labels": {"node": f"n{i}", "action": "reboot"}}
                    for i in range(1, 6)
                ],
            }
            body = json.dumps(alerts).encode()
            assert served.call("POST", "/api/v1/alerts", b"{nope")[0] == 400
            assert served.call("POST", "/api/v1/alerts", body, token=None)[0] == 401
            assert served.call("POST", "/api/v1/alerts", body, token="wrong")[0] == 403
            time.sleep(0.2)
            assert not any(labelled(f"n{i}") for i in range(1, 6))  # refused: nothing changed
            assert served.call("POST", "/api/v1/alerts", body) == (
                202,
                {"accepted": 5, "ignored": []},
            )
            status = eventually(
                lambda: (
                    (s := served.call("GET", "/api/v1/remediation")[1])["breaker"]["tripped"] and s
                )
            )
            assert "5 nodes" in status["breaker"]["reason"]
            assert not any(labelled(f"n{i}") for i in range(1, 6))

            assert served.call("POST", "/api/v1/remediation/reset", token="wrong")[0] == 403
            assert served.call("GET", "/api/v1/remediation")[1]["breaker"]["tripped"]
            code, answer = served.call("POST", "/api/v1/remediation/reset")
            assert code == 200 and answer["breaker"]["tripped"] is False
            eventually(lambda: all(labelled(f"n{i}") for i in range(1, 6)))
            with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics") as r:
                metrics = r.read().decode()
            assert 'topowatch_remediation_decisions_total{verdict="act"' in metrics
        finally:
            served.stop()


def test_remediation_metrics_pass_promtool() -> None:
    from exporter.core.exposition import encode_text
    from tests.conftest import promtool_lint

    controller, _, _, _ = make()
    feed(controller, node("n1", [finding()]), node("n2", "{bad"))
    assert promtool_lint(encode_text(controller.families())) == ""


def test_config_file_builds_providers_and_refuses_what_it_cannot_read(tmp_path: Any) -> None:
    from exporter.cluster.run import RemediationConfigError, build_controller

    client = kube_api_client("http://127.0.0.1:1")
    token = tmp_path / "token"
    token.write_text("abc\n")
    good = tmp_path / "good.yaml"
    good.write_text(
        "mode: act\nbudget: {nodes: 3, percent: 5}\nbreaker: {threshold: 4, window_seconds: 60}\n"
        "providers:\n  - hyperpod\n  - kubernetes\n  - {name: slurm, timeout_seconds: 3}\n"
        "  - {name: webhook, url: 'http://127.0.0.1:9/x'}\n"
        f"alert_token_file: {token}\n"
    )
    controller, secret = build_controller(good, client)
    assert secret == "abc"
    assert [p.name for p in controller.providers] == ["hyperpod", "kubernetes", "slurm", "webhook"]
    assert (controller.config.mode, controller.config.budget_nodes) == ("act", 3)
    for text, why in [
        ("mode: act\n", "needs at least one provider"),
        ("providers: [teleport]\n", "providers[0]"),
        ("providers: [{name: webhook}]\n", "webhook"),
        ("mode: [\n", "not YAML"),
        ("budget: {nodes: -1}\n", "budget_nodes"),
        (f"alert_token_file: {tmp_path / 'missing'}\n", "cannot read token"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(RemediationConfigError, match=why.replace("[", r"\[")):
            build_controller(bad, client)
    # nothing configured means observe mode, no providers
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert build_controller(empty, client)[0].config.mode == "observe"


def test_only_the_leader_acts_and_a_standby_takes_over_without_repeating() -> None:
    """Two replicas see the same Nodes. The standby decides nothing while the other leads; when
    it takes over it reads the state the old leader wrote on the Node (here: the replacement it
    started: a reboot, XID 79's first ladder step) and does not ask again."""
    leader, leader_calls, shared, _ = make()
    standby, standby_calls, _, _ = make(writer=shared)
    leads = {"a": True, "b": False}
    leader.leading = lambda: leads["a"]
    standby.leading = lambda: leads["b"]
    bad = node("n1", [finding()])
    assert feed(leader, bad) == [("n1", "act")]
    assert feed(standby, bad) == []  # decides nothing, acts on nothing, posts no Event
    assert leader_calls.calls == [("n1", "reboot")] and standby_calls.calls == []  # XID 79
    # The leader dies; the standby gets the Node as the leader left it (state annotation on).
    leads.update(a=False, b=True)
    written = node("n1", [finding()], annotations={STATE: dump_state(shared.states["n1"])})
    assert feed(standby, written) == [("n1", "in_progress")]
    assert standby_calls.calls == []
    # A node that turns bad now is the new leader's to act on.
    assert feed(standby, node("n2", [finding()])) == [("n2", "act")]
    assert standby_calls.calls == [("n2", "reboot")]


def test_a_standby_replica_refuses_alerts_so_alertmanager_retries_on_the_leader() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from exporter.cluster.service import build_app

    class Standby:
        is_leader = False

        def families(self) -> list[Any]:
            return []

    controller, provider, _, _ = make()
    service = ClusterService(controller=controller, alerts_token="t", leadership=Standby())  # type: ignore[arg-type]
    body = json.dumps(
        {"version": "4", "alerts": [{"status": "firing", "labels": {"node": "n1"}}]}
    ).encode()

    async def post() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(build_app(service))) as client:
            answer = await client.post(
                "/api/v1/alerts", data=body, headers={"Authorization": "Bearer t"}
            )
            return answer.status, await answer.json()

    status, answer = asyncio.run(post())
    assert status == 503 and "not the leader" in answer["error"]
    assert controller.run_once() == [] and provider.calls == []
