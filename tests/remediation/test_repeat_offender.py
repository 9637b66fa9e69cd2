"""A repeat offender (issue 29) is replaced rather than reset or rebooted once more."""

from __future__ import annotations

from healthcheck.remediation.policy import Rung, escalate_repeat_offender
from tests.cluster.goodput.harness import T0, World, xid79


def test_reset_and_reboot_steps_become_replace_and_say_why() -> None:
    rungs = (
        Rung("xid", "gpu3", "reboot", "xid-restart-bm", 0, 2, "first occurrence", "replace", 3600),
        Rung("nvlink_down", "gpu0:link1", "reset", "nvlink", 0, 3, "first occurrence"),
        Rung("ecc", "gpu1", "reboot", hold="deep health check passed"),
        Rung("custom", "node", "deep-check", "custom", 1, 2),
    )
    out = escalate_repeat_offender(rungs, "repeat offender: 2 hardware incidents in 7 days")
    assert [r.action for r in out] == ["replace", "replace", "reboot", "deep-check"]
    assert out[0].why == "first occurrence; repeat offender: 2 hardware incidents in 7 days"
    assert out[0].then is None and out[0].within_s == 0.0
    assert out[2] is rungs[2] and out[3] is rungs[3]


def test_the_goodput_ledger_says_why_a_node_is_a_repeat_offender() -> None:
    w = World()
    w.node("a")
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    assert w.book.repeat_offender_reason("a", T0 + 200) == ""
    w.at(T0 + 86_400).node("a", findings=[xid79(T0 + 86_400, gpu=5)])
    reason = w.book.repeat_offender_reason("a", T0 + 86_500)
    assert reason == "repeat offender: 2 hardware incidents in 7 days (gpu)"
