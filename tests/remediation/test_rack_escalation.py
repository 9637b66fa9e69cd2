"""Rack-level escalation (issue 30, item 3): at least half an UltraServer's nodes bad → one
rack request, never 18; the budget and the breaker count it as the rack's nodes; the webhook
posts one body for the rack. Pure, on plain data (healthcheck/remediation/rack.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from healthcheck.remediation.policy import (
    Breaker,
    ClusterFacts,
    NodeRequest,
    PolicyConfig,
    decide,
    record_onsets,
)
from healthcheck.remediation.providers.webhook import WebhookNotifier, rack_payload
from healthcheck.remediation.rack import (
    RackConfig,
    RackDecision,
    decide_racks,
    escalate,
    facts_after,
    rack_onsets,
)
from healthcheck.remediation.state import RemediationState

NOW = 1_750_000_000.0
# A budget that holds a rack: 18 nodes of a 1,000-node cluster at 2 % is 20.
ACT = PolicyConfig(mode="act", budget_nodes=2, budget_percent=2.0)
FACTS = ClusterFacts(gpu_nodes=1000)
RACK = tuple(f"us-a-{i:02d}" for i in range(18))
RACKS = {"us-a": RACK, "us-b": tuple(f"us-b-{i:02d}" for i in range(18))}


def bad(nodes: tuple[str, ...] | list[str], action: str = "reboot") -> list[NodeRequest]:
    return [
        NodeRequest(n, action, ("gpu_fabric",), NOW - 30)  # type: ignore[arg-type]
        for n in nodes
    ]


# (why, bad nodes of us-a, rack requests, node requests left)
ROWS = [
    ("1 of 18 bad: below 50 %, a per-node request", 1, 0, 1),
    ("8 of 18 bad: still below half, 8 per-node requests", 8, 0, 8),
    ("9 of 18 bad: exactly half, one rack request", 9, 1, 0),
    ("18 of 18 bad: one rack request, never 18", 18, 1, 0),
]


@pytest.mark.parametrize(("why", "n", "racks", "left"), ROWS, ids=[r[0] for r in ROWS])
def test_escalation_at_the_share(why: str, n: int, racks: int, left: int) -> None:
    requests = [*bad(RACK[:n]), NodeRequest("p5-node", "replace", ("xid",), NOW)]
    nodes, escalated = escalate(requests, RACKS)
    assert len(escalated) == racks
    assert len([r for r in nodes if r.node.startswith("us-a")]) == left
    assert "p5-node" in {r.node for r in nodes}  # in no UltraServer: untouched


def test_the_rack_request_names_the_rack_its_nodes_and_the_strongest_action() -> None:
    requests = [*bad(RACK[:8]), *bad(RACK[8:10], "replace"), NodeRequest(RACK[10], None)]
    _, (rack,) = escalate(requests, RACKS)
    assert (rack.rack, rack.action, rack.members, len(rack.bad)) == ("us-a", "replace", RACK, 10)
    assert rack.reasons == ("gpu_fabric",)
    assert rack.share == pytest.approx(10 / 18)


def test_a_gpu_reset_asked_by_half_a_rack_is_a_rack_reboot() -> None:
    _, (rack,) = escalate(bad(RACK[:9], "reset"), RACKS)
    assert rack.action == "reboot"


def test_nodes_hyperpod_already_has_pending_count_as_bad() -> None:
    pending = [NodeRequest(n, None, hyperpod_status="UnschedulablePendingReboot") for n in RACK[:5]]
    _, racks = escalate([*pending, *bad(RACK[5:9])], RACKS)
    assert [len(r.bad) for r in racks] == [9]


def test_the_share_is_configurable() -> None:
    config, problems = RackConfig.from_mapping({"escalate_share": 0.25})
    assert problems == [] and config.escalate_share == 0.25
    _, racks = escalate(bad(RACK[:5]), RACKS, config)
    assert len(racks) == 1
    for wrong in (0, 1.5, "half", True):
        fallback, problems = RackConfig.from_mapping({"escalate_share": wrong})
        assert fallback == RackConfig() and "escalate_share" in problems[0]


def rack_verdicts(n: int = 9, **kw: Any) -> list[tuple[str, str, str]]:
    _, racks = escalate(bad(RACK[:n]), RACKS)
    args: dict[str, Any] = {"states": {}, "facts": FACTS, "breaker": Breaker(), "config": ACT}
    args.update(kw)
    return [(d.rack, d.verdict, d.reason) for d in decide_racks(racks, now=NOW, **args)]


def test_act_mode_acts_on_the_rack_and_observe_only_says_so() -> None:
    assert rack_verdicts() == [("us-a", "act", "act")]
    assert rack_verdicts(config=PolicyConfig()) == [("us-a", "skip", "observe")]


def test_the_budget_counts_the_rack_as_its_18_nodes() -> None:
    # 1,000 GPU nodes at 2 %: a budget of 20; 3 nodes already in remediation leave 17 < 18
    busy = RemediationState("reboot", NOW - 60, "hyperpod", 1, "requested")
    states = {f"p5-{i}": busy for i in range(3)}
    ((_, verdict, reason),) = rack_verdicts(states=states)
    assert (verdict, reason) == ("skip", "budget_concurrent")
    # the same 3 started earlier in the hour, done now: the hourly budget holds it back
    done = RemediationState("reboot", NOW - 1200, "hyperpod", 1, "recovered", NOW - 600)
    ((_, verdict, reason),) = rack_verdicts(states={f"p5-{i}": done for i in range(3)})
    assert (verdict, reason) == ("skip", "budget_hourly")
    # a small cluster's default budget (2 nodes) never holds a rack
    ((_, verdict, reason),) = rack_verdicts(facts=ClusterFacts(gpu_nodes=36))
    assert (verdict, reason) == ("skip", "budget_concurrent")


def test_node_requests_after_a_rack_see_the_budget_it_took() -> None:
    _, racks = escalate(bad(RACK[:9]), RACKS)
    decided = decide_racks(racks, {}, FACTS, Breaker(), ACT, NOW)
    after = facts_after(FACTS, decided)
    assert set(RACK) <= after.pending_elsewhere
    # 18 of the budget of 20 taken: two more nodes may act, the third may not
    nodes = decide(bad(["p5-0", "p5-1", "p5-2"], "replace"), {}, after, Breaker(), ACT, NOW)
    assert [(d.node, d.reason) for d in nodes] == [
        ("p5-0", "act"),
        ("p5-1", "act"),
        ("p5-2", "budget_concurrent"),
    ]


def test_the_breaker_refuses_a_rack_and_counts_its_bad_nodes_after_the_decision() -> None:
    tripped = Breaker(tripped=True, tripped_at=NOW, reason="6 nodes started failing")
    assert rack_verdicts(breaker=tripped) == [("us-a", "skip", "breaker_open")]
    # 9 bad nodes of one rack do not trip the breaker against their own rack request ...
    _, racks = escalate(bad(RACK[:9]), RACKS)
    breaker = Breaker()
    decided = decide_racks(racks, {}, FACTS, breaker, ACT, NOW)
    assert [d.verdict for d in decided] == ["act"]
    # ... but they count, one per node, in the window afterwards: more than 5 trips it
    breaker = record_onsets(breaker, rack_onsets(racks), NOW, ACT)
    assert breaker.tripped and "9 nodes started failing" in breaker.reason


def test_a_rack_with_an_opted_out_or_busy_member_is_not_acted_on() -> None:
    opted = [*bad(RACK[:9]), NodeRequest(RACK[9], "reboot", opted_out=True)]
    _, racks = escalate(opted, RACKS)
    decided = decide_racks(racks, {}, FACTS, Breaker(), ACT, NOW)
    assert [(d.reason, RACK[9] in d.detail) for d in decided] == [("opted_out", True)]
    quiet = escalate(bad(RACK[:9]), RACKS, opted_out=[RACK[17]])[1]
    assert quiet[0].opted_out == (RACK[17],)
    busy = {RACK[12]: RemediationState("reboot", NOW - 60, "hyperpod", 1, "requested")}
    assert rack_verdicts(states=busy) == [("us-a", "skip", "in_progress")]


# --- the webhook: one POST for the rack --------------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        _Sink.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[str]:
    _Sink.bodies = []
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def rack_decision() -> RackDecision:
    _, racks = escalate(bad(RACK[:10]), RACKS)
    (decision,) = decide_racks(racks, {}, FACTS, Breaker(), ACT, NOW)
    return decision


def test_the_webhook_payload_of_a_rack() -> None:
    body = rack_payload(rack_decision())
    assert body["scope"] == "ultraserver" and body["ultraserver"] == "us-a"
    assert body["action"] == "reboot"
    assert body["nodes"] == list(RACK) and body["bad_nodes"] == list(RACK[:10])
    assert body["decision"]["reason"] == "act"
    assert "10 of 18 nodes bad (56%)" in body["decision"]["detail"]
    json.dumps(body)  # serialisable as is


def test_the_webhook_posts_one_request_for_the_rack(sink: str) -> None:
    result = WebhookNotifier(sink, timeout_s=5.0).post_rack(rack_decision())
    assert (result.node, result.ok) == ("us-a", True)
    assert len(_Sink.bodies) == 1 and _Sink.bodies[0]["ultraserver"] == "us-a"
