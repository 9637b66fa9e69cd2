"""The remediation policy's safety rules, one by one, on plain data (no threads, no clock): the
rules of `decide`, the action ladder (`climb`, `parse_ladder`) and a node's lifecycle (`settle`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from exporter.core.findings import Finding
from exporter.core.xid import describe
from healthcheck.remediation.policy import (
    DEFAULT_LADDER,
    Breaker,
    ClusterFacts,
    NodeRequest,
    PolicyConfig,
    climb,
    decide,
    mark_ladder,
    parse_ladder,
    record_onsets,
    reset_breaker,
    settle,
    strongest,
)
from healthcheck.remediation.state import (
    LadderMark,
    RemediationState,
    dump_state,
    parse_state,
)

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


def test_replace_beats_reboot_beats_reset() -> None:
    assert strongest(["reboot", "replace", None]) == "replace"
    assert strongest(["reboot", None]) == "reboot"
    assert strongest(["reset", "reboot", "reset"]) == "reboot"
    assert strongest(["reset", "none", "bogus"]) == "reset"
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
        '{"action":"reboot","started_at":1,"outcome":"done","attempts":-1}',
        '{"action":"reboot","started_at":1,"outcome":"done","ladder":{}}',
        '{"action":"reboot","started_at":1,"outcome":"done","ladder":[{"rule":"r"}]}',
        '{"action":"reboot","started_at":1,"outcome":"done","healthy_since":"now"}',
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
    marks = (
        LadderMark("xid-79", "gpu3", 0, "reboot", "reboot", NOW - 60),
        LadderMark("xid-reset", "gpu1", 0, "reset", "reboot", NOW - 60),
    )
    laddered = replace(state, action="reset", attempts=0, ladder=marks, healthy_since=NOW)
    assert parse_state(dump_state(laddered)) == (laddered, None)
    # an annotation written before ladders existed still reads
    old = '{"action":"reboot","attempts":1,"outcome":"done","provider":"hyperpod","started_at":1}'
    parsed, problem = parse_state(old)
    assert problem is None and parsed is not None and parsed.ladder == ()


def test_config_from_yaml_mapping_reports_bad_values() -> None:
    config, problems = PolicyConfig.from_mapping(
        {"mode": "act", "budget": {"nodes": 4, "percent": 10}, "breaker": {"threshold": "x"}}
    )
    assert (config.mode, config.budget_nodes, config.budget_percent) == ("act", 4, 10.0)
    assert config.breaker_threshold == PolicyConfig().breaker_threshold
    assert any("breaker_threshold" in p for p in problems)
    config, problems = PolicyConfig.from_mapping({"mode": "yolo"})
    assert config.mode == "observe" and problems


def test_hourly_budget_counts_actions_on_nodes_deleted_since() -> None:
    facts = ClusterFacts(100, started_elsewhere=frozenset({"gone1", "gone2"}))
    assert verdicts(failing(1), facts=facts) == [("n0", "skip", "budget_hourly")]


# --- the action ladder --------------------------------------------------------------------------

H = 3600.0


def xid(code: int, gpu: int = 3, action: str = "replace") -> Finding:
    """An XID finding as the node agent writes it (evidence from the catalog)."""
    info = describe(code)
    evidence = f"XID {code} {info.name} ({info.action}) x1"
    return Finding("xid", f"gpu{gpu}", "fatal", action, evidence, NOW - 60, NOW, True)


def other(check: str, action: str, component: str = "gpu3") -> Finding:
    return Finding(check, component, "critical", action, "evidence", NOW - 60, NOW, True)


def mark(rule: str, step: int, action: str, performed: str, ago: float) -> LadderMark:
    return LadderMark(rule, "gpu3", step, action, performed, NOW - ago)  # type: ignore[arg-type]


# (finding, marks already in the node's state) -> (rule, step 1-based, action)
LADDER_ROWS: dict[str, tuple[Finding, list[LadderMark], tuple[str, int, str]]] = {
    "xid 79 first: reboot (catalog RESTART_BM), not replace": (
        xid(79),
        [],
        ("xid-79", 1, "reboot"),
    ),
    "xid 79 again 2 h after a reboot: replace": (
        xid(79),
        [mark("xid-79", 0, "reboot", "reboot", 2 * H)],
        ("xid-79", 2, "replace"),
    ),
    "xid 79 again 25 h after a reboot: from the start": (
        xid(79),
        [mark("xid-79", 0, "reboot", "reboot", 25 * H)],
        ("xid-79", 1, "reboot"),
    ),
    "xid 79 on another GPU: that GPU's own ladder": (
        xid(79, gpu=5),
        [mark("xid-79", 0, "reboot", "reboot", 2 * H)],
        ("xid-79", 1, "reboot"),
    ),
    "replaced, and again: the top step, no higher": (
        xid(79),
        [mark("xid-79", 1, "replace", "replace", 2 * H)],
        ("xid-79", 2, "replace"),
    ),
    "xid 95 (RESET_GPU): reset first": (xid(95, action="reboot"), [], ("xid-reset", 1, "reset")),
    "xid 48 (its workflow starts with a reset)": (
        xid(48, action="reboot"),
        [],
        ("xid-reset", 1, "reset"),
    ),
    "reset done as a reset, again: reboot": (
        xid(95, action="reboot"),
        [mark("xid-reset", 0, "reset", "reset", H)],
        ("xid-reset", 2, "reboot"),
    ),
    "reset done as a reboot (HyperPod), again: replace, not a second reboot": (
        xid(95, action="reboot"),
        [mark("xid-reset", 0, "reset", "reboot", H)],
        ("xid-reset", 3, "replace"),
    ),
    "GPU gone from NVML: reboot first": (
        other("gpu_missing", "replace"),
        [],
        ("gpu-missing", 1, "reboot"),
    ),
    "NVML RESET_REQUIRED: reset": (
        other("gpu_reset_required", "reboot"),
        [],
        ("gpu-reset-required", 1, "reset"),
    ),
    # A pending row remap waits for the next reset while running work continues (NVIDIA memory
    # error management; issue 28): the check asks for nothing, so no built-in rule puts it on
    # the ladder. A finding that still asked for a reboot (an older agent) keeps its own action.
    "row remap pending a GPU reset: no rule any more": (
        other("row_remap_pending", "reboot"),
        [],
        ("", 1, "reboot"),
    ),
    "the driver's recovery action GPU reset (or drain and reset): reset": (
        other("gpu_recovery_reset", "reboot"),
        [],
        ("gpu-recovery-reset", 1, "reset"),
    ),
    "the driver's recovery action node reboot: reboot, then replace": (
        other("gpu_recovery_reboot", "reboot"),
        [],
        ("gpu-recovery-reboot", 1, "reboot"),
    ),
    "row remap failure: no rule, the check's own replace": (
        other("row_remap_failure", "replace"),
        [],
        ("", 1, "replace"),
    ),
    "nvlink down: no rule, the check's own reboot": (
        other("nvlink_down", "reboot", "gpu0:link3"),
        [],
        ("", 1, "reboot"),
    ),
}


@pytest.mark.parametrize("row", sorted(LADDER_ROWS))
def test_ladder_rows(row: str) -> None:
    finding, marks, (rule, step, action) = LADDER_ROWS[row]
    [rung] = climb([finding], marks, DEFAULT_LADDER, NOW)
    assert (rung.rule, rung.step + 1, rung.action) == (rule, step, action), rung.describe()


def test_the_failure_a_step_is_treating_stays_on_that_step_while_it_is_under_way() -> None:
    taken = [mark("xid-79", 0, "reboot", "reboot", 600)]
    before = replace(xid(79), first_seen=NOW - 900)  # the failure the reboot is treating
    [busy] = climb([before], taken, DEFAULT_LADDER, NOW, in_progress=True)
    assert (busy.step, busy.action, busy.then) == (0, "reboot", "replace")
    assert "under way" in busy.why
    # first seen after the step was taken (a new occurrence), or the step is over: climb
    assert climb([xid(79)], taken, DEFAULT_LADDER, NOW, in_progress=True)[0].action == "replace"
    assert climb([before], taken, DEFAULT_LADDER, NOW)[0].action == "replace"


def test_a_finding_with_two_xids_takes_the_first_rule_that_matches() -> None:
    both = replace(xid(95), evidence="XID 95 A (RESET_GPU) x1; XID 79 B (RESTART_BM) x1")
    [rung] = climb([both], [], DEFAULT_LADDER, NOW)
    assert (rung.rule, rung.action) == ("xid-79", "reboot")


def test_findings_without_an_action_get_no_rung() -> None:
    assert climb([other("numa_mismatch", "none")], [], DEFAULT_LADDER, NOW) == ()


def test_rung_says_where_it_stands_and_what_comes_next() -> None:
    [rung] = climb([xid(79)], [], DEFAULT_LADDER, NOW)
    text = rung.describe()
    assert "xid-79@gpu3 step 1/2 reboot" in text and "again within 24 h: replace" in text
    assert rung.as_dict()["next"] == "replace" and rung.as_dict()["next_within_hours"] == 24


def test_marks_record_what_was_performed_and_drop_expired_ones() -> None:
    rungs = climb([xid(95, action="reboot"), xid(79, gpu=1)], [], DEFAULT_LADDER, NOW)
    stale = LadderMark("xid-79", "gpu7", 0, "reboot", "reboot", NOW - 30 * H)
    marks = mark_ladder([stale], rungs, "reboot", DEFAULT_LADDER, NOW)
    assert [(m.rule, m.component, m.action, m.performed) for m in marks] == [
        ("xid-79", "gpu1", "reboot", "reboot"),
        ("xid-reset", "gpu3", "reset", "reboot"),  # HyperPod rebooted for the reset
    ]


def test_a_custom_ladder_comes_first_and_can_replace_a_built_in_rule() -> None:
    ladder, problems = parse_ladder(
        {
            "rules": [
                {"name": "nvlink", "check": "nvlink_down", "steps": ["reset", "reboot"]},
                {
                    "name": "xid-79",
                    "check": "xid",
                    "xid": 79,
                    "within_hours": 6,
                    "steps": [{"action": "reboot", "within_hours": 48}, "replace"],
                },
            ]
        }
    )
    assert problems == []
    names = [r.name for r in ladder.rules]
    assert names[:2] == ["nvlink", "xid-79"] and names.count("xid-79") == 1
    assert len(ladder.rules) == len(DEFAULT_LADDER.rules) + 1
    xid79 = ladder.rule_named("xid-79")
    assert xid79 is not None and [s.within_s for s in xid79.steps] == [48 * H, 6 * H]
    [rung] = climb([other("nvlink_down", "reboot")], [], ladder, NOW)
    assert (rung.rule, rung.action) == ("nvlink", "reset")
    only, problems = parse_ladder({"defaults": False, "rules": []})
    assert problems == [] and only.rules == ()
    assert climb([xid(79)], [], only, NOW)[0].action == "replace"  # the check's own action


def rule(**fields: Any) -> dict[str, Any]:
    return {"rules": [{"name": "x", "check": "xid", "steps": ["reset"], **fields}]}


BAD_LADDERS: list[tuple[Any, str]] = [
    (rule(steps=["reboot", "replace", "reboot"]), "loops"),
    (rule(steps=["reboot", "reboot"]), "loops"),
    (rule(steps=["replace", "reset"]), "loops"),
    (rule(steps=["rebot"]), "unknown action 'rebot'"),
    (rule(steps=["drain"]), "unknown action 'drain'"),
    (rule(steps=[]), "non-empty list"),
    (rule(steps="reboot"), "non-empty list"),
    (rule(bucket="RESET_CPU"), "catalog"),
    (rule(xid=["79"]), "XID codes"),
    (rule(check="ecc_uncorrectable", xid=79), "only apply to"),
    (rule(check=None), "check"),
    (rule(name="X Y"), "name"),
    (rule(when=1), "unknown key 'when'"),
    (rule(steps=[{"action": "reset", "hours": 1}]), "unknown key 'hours'"),
    (rule(within_hours=0), "within_hours"),
    ({"rules": rule()["rules"] * 2}, "a second rule named 'x'"),
    ({"rule": []}, "unknown key 'rule'"),
    ({"defaults": "yes"}, "defaults"),
    ("reboot", "must be a mapping"),
    ({"rules": {"x": 1}}, "must be a list"),
]


@pytest.mark.parametrize(("raw", "why"), BAD_LADDERS)
def test_a_bad_ladder_is_refused_with_the_reason(raw: Any, why: str) -> None:
    _, problems = parse_ladder(raw)
    assert any(why in p for p in problems), problems
    _, problems = PolicyConfig.from_mapping({"mode": "act", "ladder": raw})
    assert problems  # and the service refuses to start (exporter/cluster/run.py)


def test_policy_config_reads_the_lifecycle_settings() -> None:
    config, problems = PolicyConfig.from_mapping(
        {"healthy_reset_seconds": 7200, "alert_ttl_seconds": 0}
    )
    assert problems == [] and (config.healthy_reset_s, config.alert_ttl_s) == (7200.0, 0.0)
    assert config.ladder is DEFAULT_LADDER
    _, problems = PolicyConfig.from_mapping({"healthy_reset_seconds": "a day"})
    assert problems


# --- lifecycle ----------------------------------------------------------------------------------

LIFE = replace(ACT, healthy_reset_s=6 * H, active_timeout_s=3 * H)
DONE = RemediationState("reboot", NOW - 600, "hyperpod", 3, "done")
RECOVERED = RemediationState("reboot", NOW - 8 * H, "hyperpod", 3, "recovered", NOW - 7 * H)
Settled = tuple[tuple[str, ...], str, int, float | None]

# (state, requesting, pending) -> (changes, outcome, attempts, healthy_since - NOW)
SETTLE_ROWS: dict[str, tuple[RemediationState, bool, bool, Settled]] = {
    "accepted action, node healthy: recovered, the healthy clock starts": (
        DONE,
        False,
        False,
        (("recovered", "healthy"), "recovered", 3, 0.0),
    ),
    "HyperPod still pending is not health": (DONE, False, True, ((), "done", 3, None)),
    "accepted action, node still failing: nothing changes": (
        DONE,
        True,
        False,
        ((), "done", 3, None),
    ),
    "healthy 7 h (reset after 6): attempts back to 0": (
        replace(RECOVERED, healthy_since=NOW - 7 * H),
        False,
        False,
        (("attempts_reset",), "recovered", 0, -7 * H),
    ),
    "healthy 5 h: attempts kept": (
        replace(RECOVERED, healthy_since=NOW - 5 * H),
        False,
        False,
        ((), "recovered", 3, -5 * H),
    ),
    "failing again after 7 h healthy: reset first, then the clock stops": (
        replace(RECOVERED, healthy_since=NOW - 7 * H),
        True,
        False,
        (("attempts_reset", "unhealthy"), "recovered", 0, None),
    ),
    "failing again after 1 h healthy: the clock stops, attempts kept": (
        replace(RECOVERED, healthy_since=NOW - H),
        True,
        False,
        (("unhealthy",), "recovered", 3, None),
    ),
    "failed action, node healthy: the clock starts": (
        replace(RECOVERED, outcome="failed", finished_at=NOW - H),
        False,
        False,
        (("healthy",), "failed", 3, 0.0),
    ),
    "requested (a call may be out), node healthy: wait": (
        replace(DONE, outcome="requested"),
        False,
        False,
        ((), "requested", 3, None),
    ),
    "requested long ago (timed out), node healthy: the clock starts": (
        replace(DONE, outcome="requested", started_at=NOW - 4 * H),
        False,
        False,
        (("healthy",), "requested", 3, 0.0),
    ),
}


@pytest.mark.parametrize("row", sorted(SETTLE_ROWS))
def test_settle_rows(row: str) -> None:
    state, requesting, pending, expected = SETTLE_ROWS[row]
    settled, got = settle(state, requesting, pending, NOW, LIFE)
    since = None if settled.healthy_since is None else settled.healthy_since - NOW
    assert (got, settled.outcome, settled.attempts, since) == expected


def test_settle_drops_ladder_marks_past_their_window() -> None:
    old = LadderMark("xid-79", "gpu3", 0, "reboot", "reboot", NOW - 25 * H)
    young = LadderMark("xid-79", "gpu4", 0, "reboot", "reboot", NOW - 23 * H)
    unknown = LadderMark("no-such-rule", "gpu5", 0, "reboot", "reboot", NOW)
    state = replace(RECOVERED, ladder=(old, young, unknown), healthy_since=NOW - H)
    settled, changes = settle(state, False, False, NOW, LIFE)
    assert changes == ("ladder_expired",) and settled.ladder == (young,)


def test_a_node_that_recovered_three_times_is_not_blocked_for_good() -> None:
    """Act, recover, fail again, on a fake clock: blocked after max_attempts, then a healthy
    period gives the node its attempts back (before, the count never went down)."""
    now = NOW
    state: RemediationState | None = None
    request = NodeRequest("n0", "reboot", ("rootfs_read_only@node",), now)
    for _ in range(3):
        [d] = decide([request], {"n0": state} if state else {}, FACTS, Breaker(), LIFE, now)
        assert d.verdict == "act", d
        state = RemediationState(
            "reboot", now, "hyperpod", (state.attempts if state else 0) + 1, "done"
        )
        now += 2 * H  # the node reboots and reports healthy: recovered
        state, _ = settle(state, False, False, now, LIFE)
        now += H  # an hour later it fails again, within the reset period
        state, _ = settle(state, True, False, now, LIFE)
    assert state is not None and state.attempts == 3
    [d] = decide([request], {"n0": state}, FACTS, Breaker(), LIFE, now)
    assert (d.verdict, d.reason) == ("skip", "attempts_exhausted")
    assert "healthy for 6 h" in d.detail
    # a person fixes it; healthy for the reset period, it gets its attempts back
    state, _ = settle(state, False, False, now, LIFE)
    now += 6 * H
    state, changes = settle(state, False, False, now, LIFE)
    assert "attempts_reset" in changes and state.attempts == 0
    state, _ = settle(state, True, False, now + 60, LIFE)
    [d] = decide([request], {"n0": state}, FACTS, Breaker(), LIFE, now + 60)
    assert d.verdict == "act"
