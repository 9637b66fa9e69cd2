"""The remediation policy's safety rules, one by one, on plain data (no threads, no clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from healthcheck.policy import (
    Breaker,
    ClusterFacts,
    NodeRequest,
    PolicyConfig,
    decide,
    record_onsets,
    reset_breaker,
    strongest,
)
from healthcheck.state import RemediationState, dump_state, parse_state

NOW = 1_750_000_000.0
ACT = PolicyConfig(mode="act", budget_nodes=2, budget_percent=0.0, cooldown_s=600)
FACTS = ClusterFacts(gpu_nodes=100)


def failing(n: int, action: str = "replace") -> list[NodeRequest]:
    return [NodeRequest(f"n{i}", action, (f"xid@gpu{i % 8}",), NOW) for i in range(n)]  # type: ignore[arg-type]


def verdicts(requests: list[NodeRequest], **kw: object) -> list[tuple[str, str, str]]:
    args: dict[str, object] = {"states": {}, "facts": FACTS, "breaker": Breaker(), "config": ACT}
    args.update(kw)
    out = decide(requests, now=NOW, **args)  # type: ignore[arg-type]
    return [(d.node, d.verdict, d.reason) for d in out]


def test_observe_is_the_default_and_never_acts() -> None:
    decisions = decide(failing(1), {}, FACTS, Breaker(), PolicyConfig(), NOW)
    assert PolicyConfig().mode == "observe"
    assert [(d.verdict, d.reason) for d in decisions] == [("skip", "observe")]
    assert "would replace" in decisions[0].detail


def test_act_mode_acts_and_healthy_nodes_get_no_decision() -> None:
    healthy = NodeRequest("ok", None)
    assert verdicts([healthy, *failing(1)]) == [("n0", "act", "act")]


def test_replace_beats_reboot() -> None:
    assert strongest(["reboot", "replace", None]) == "replace"
    assert strongest(["reboot", None]) == "reboot"
    assert strongest([None]) is None


def test_budget_at_once_is_max_of_nodes_and_percent() -> None:
    assert [v for _, v, _ in verdicts(failing(5))] == ["act", "act", "skip", "skip", "skip"]
    assert verdicts(failing(3))[2][2] == "budget_concurrent"
    # 5 % of 100 GPU nodes = 5 > N=2
    five = replace(ACT, budget_percent=5.0)
    assert [v for _, v, _ in verdicts(failing(7), config=five)].count("act") == 5


def test_budget_counts_nodes_in_remediation_and_pending_at_hyperpod() -> None:
    busy = {"x": RemediationState("reboot", NOW - 60, "hyperpod", 1, "done")}
    facts = ClusterFacts(100, pending_elsewhere=frozenset({"y"}))
    result = verdicts(failing(1), states=busy, facts=facts)
    assert result == [("n0", "skip", "budget_concurrent")]


def test_budget_per_hour_counts_finished_actions_too() -> None:
    recent = {
        f"old{i}": RemediationState("reboot", NOW - 1800, "hyperpod", 1, "recovered", NOW - 900)
        for i in range(2)
    }
    assert verdicts(failing(1), states=recent) == [("n0", "skip", "budget_hourly")]
    long_ago = {k: replace(s, started_at=NOW - 4000) for k, s in recent.items()}
    assert verdicts(failing(1), states=long_ago) == [("n0", "act", "act")]


def test_breaker_trips_above_threshold_and_stays_tripped_until_reset() -> None:
    config = replace(ACT, breaker_threshold=3, breaker_window_s=60)
    b = record_onsets(Breaker(), [(f"n{i}", NOW - i) for i in range(3)], NOW, config)
    assert not b.tripped  # 3 is not more than 3
    b = record_onsets(b, [("n3", NOW)], NOW, config)
    assert b.tripped and "4 nodes" in b.reason
    later = record_onsets(b, [], NOW + 3600, config)
    assert later.tripped  # time alone does not close it
    assert verdicts(failing(1), breaker=later, config=config) == [("n0", "skip", "breaker_open")]
    assert not reset_breaker(later).tripped


def test_breaker_ignores_failures_spread_over_time() -> None:
    config = replace(ACT, breaker_threshold=2, breaker_window_s=60)
    b = Breaker()
    for i in range(10):
        b = record_onsets(b, [(f"n{i}", NOW + 100 * i)], NOW + 100 * i, config)
    assert not b.tripped
    # one node re-reported counts once
    b = record_onsets(Breaker(), [("n0", NOW), ("n0", NOW), ("n0", NOW)], NOW, config)
    assert not b.tripped


def test_cooldown_and_one_action_per_node() -> None:
    in_flight = {"n0": RemediationState("reboot", NOW - 10, "hyperpod", 1, "requested")}
    assert verdicts(failing(1), states=in_flight) == [("n0", "skip", "in_progress")]
    failed = {"n0": RemediationState("reboot", NOW - 10, "hyperpod", 1, "failed", NOW - 5)}
    assert verdicts(failing(1), states=failed) == [("n0", "skip", "cooldown")]
    cooled = {"n0": replace(failed["n0"], started_at=NOW - 601)}
    assert verdicts(failing(1), states=cooled) == [("n0", "act", "act")]


def test_attempts_exhausted_needs_a_person() -> None:
    tired = {"n0": RemediationState("reboot", NOW - 9999, "hyperpod", 3, "recovered", NOW - 9000)}
    assert verdicts(failing(1), states=tired) == [("n0", "skip", "attempts_exhausted")]


def test_opt_out_and_hyperpod_pending_win_over_everything() -> None:
    opted = replace(failing(1)[0], opted_out=True)
    pending = replace(failing(1)[0], node="p", hyperpod_status="UnschedulablePendingReboot")
    tripped = Breaker(tripped=True, reason="storm")
    assert verdicts([opted, pending], breaker=tripped) == [
        ("n0", "skip", "opted_out"),
        ("p", "skip", "already_pending"),
    ]


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "[]",
        '{"action":"explode","started_at":1,"outcome":"done"}',
        '{"action":"reboot","started_at":"yesterday","outcome":"done"}',
        '{"action":"reboot","started_at":1,"outcome":"done","attempts":0}',
        '{"action":"reboot","started_at":1e999,"outcome":"done"}',
    ],
)
def test_malformed_state_is_a_problem_not_a_crash(raw: str) -> None:
    state, problem = parse_state(raw)
    assert state is None and problem and "topowatch.io/remediation" in problem


def test_state_round_trips() -> None:
    state = RemediationState("replace", NOW, "sagemaker-api", 2, "done", None, "ok")
    assert parse_state(dump_state(state)) == (state, None)
    assert parse_state(None) == (None, None)


def test_config_from_yaml_mapping_reports_bad_values() -> None:
    config, problems = PolicyConfig.from_mapping(
        {"mode": "act", "budget": {"nodes": 4, "percent": 10}, "breaker": {"threshold": "x"}}
    )
    assert (config.mode, config.budget_nodes, config.budget_percent) == ("act", 4, 10.0)
    assert config.breaker_threshold == PolicyConfig().breaker_threshold
    assert any("breaker_threshold" in p for p in problems)
    config, problems = PolicyConfig.from_mapping({"mode": "yolo"})
    assert config.mode == "observe" and problems
