"""Remediation policy: what each failing node asks for, plus what is already happening → Decisions.

Pure: plain data in (per-node requests, per-node remediation state, cluster facts, the breaker,
the time), plain data out. Every safety rule of issue 4 lives here so it can be tested without
threads, sockets or clocks; the controller only gathers inputs and carries decisions out.

Rules, checked in this order (the first that applies wins, so the reason is the strongest one):
opt-out label → HyperPod already pending → a deep health check under way or deferred on the node
→ an action in flight on the node → attempts exhausted → cooldown → circuit breaker open →
concurrent budget → hourly budget → observe mode → act.

What a finding asks for is its step on an action ladder (`climb`): a rule per check (and, for
XIDs, per code or NVIDIA catalog bucket) lists steps that only climb, reset → reboot → replace;
the same failure on the same component again within a step's window takes the next step, later
than that starts from the first. Where each node stands lives in its state annotation. `settle`
is the rest of a node's lifecycle: recovered, healthy since when, attempts reset after a healthy
period, ladder marks dropped when their window has passed.

The optional `deep-check` step (between reboot and replace, only where a rule lists it) asks
HyperPod for a deep health check of the node and gates the replacement above it: the rule's
`replace` follows only once that check's result, read back from the node's
`sagemaker.amazonaws.com/deep-health-check-status` label (`read_deep_check`), is `Failed`.
`Passed`: not replaced, the finding the check examined asks for nothing more (a new occurrence
starts the rule over). `InProgress`: the node waits, no other action meanwhile. No result within
`deep_check_timeout_s`: `deep_check_on_timeout` says (default `alert`: not replaced, audited as a
warning, since a check that never reported proves nothing about the hardware).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from exporter.core.findings import Finding, format_time, gpu_index
from exporter.core.xid import catalog, describe
from exporter.topology.labels import DEEP_HEALTH_CHECK_KEY as _DHC_LABEL
from exporter.topology.labels import HEALTH_STATUS_KEY
from healthcheck.remediation.state import (
    ACTIONS,
    MAX_LADDER_MARKS,
    Action,
    DeepCheck,
    LadderMark,
    RemediationState,
    action_rank,
)

Mode = Literal["observe", "act"]
Verdict = Literal["act", "skip"]

HYPERPOD_HEALTH = HEALTH_STATUS_KEY
HYPERPOD_PENDING = frozenset({"UnschedulablePendingReboot", "UnschedulablePendingReplacement"})
OPT_OUT_LABEL = "topowatch.io/remediation"
OPT_OUT_VALUE = "disabled"


DEEP_CHECK: Action = "deep-check"
# Which of two asked-for actions a node gets: the stronger remedy; a deep check (diagnosis, not a
# remedy) only when nothing asks for a remedy, so a reset or reboot another finding needs is not
# held up behind an hour-long check (that finding's deep-check step waits its turn).
_PREFERENCE: tuple[Action, ...] = ("deep-check", "reset", "reboot", "replace")


def strongest(actions: Iterable[str | None]) -> Action | None:
    """replace > reboot > reset > deep-check > nothing: the stronger remedy wins."""
    best: Action | None = None
    for action in actions:
        for known in _PREFERENCE:
            if action == known and (
                best is None or _PREFERENCE.index(known) > _PREFERENCE.index(best)
            ):
                best = known
    return best


# --- the action ladder ------------------------------------------------------------------------

HOUR = 3600.0
DEFAULT_WITHIN_S = 24 * HOUR
XID_IN_EVIDENCE = re.compile(r"\bXID (\d+)\b")  # the xid check's evidence: "XID 79 NAME (BUCKET)"
_RULE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    within_s: float = DEFAULT_WITHIN_S  # the same failure again within this long: the next step

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "within_hours": self.within_s / HOUR}


@dataclass(frozen=True, slots=True)
class LadderRule:
    """Steps for the findings of one check; for `xid`, optionally only some codes or buckets."""

    name: str
    check: str
    steps: tuple[Step, ...]
    xids: frozenset[int] = frozenset()
    buckets: frozenset[str] = frozenset()  # NVIDIA's immediate-action buckets (xid-catalog.csv)

    def matches(self, check: str, xids: Sequence[int]) -> bool:
        if check != self.check:
            return False
        if not self.xids and not self.buckets:
            return True
        return any(x in self.xids or describe(x).action in self.buckets for x in xids)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "check": self.check}
        if self.xids:
            out["xid"] = sorted(self.xids)
        if self.buckets:
            out["bucket"] = sorted(self.buckets)
        out["steps"] = [s.as_dict() for s in self.steps]
        return out


@dataclass(frozen=True, slots=True)
class Ladder:
    """Rules in order; the first that matches a finding is its ladder. No rule: its own action."""

    rules: tuple[LadderRule, ...] = ()

    def rule_for(self, finding: Finding) -> LadderRule | None:
        xids = [int(x) for x in XID_IN_EVIDENCE.findall(finding.evidence)]
        return next((r for r in self.rules if r.matches(finding.check, xids)), None)

    def rule_named(self, name: str) -> LadderRule | None:
        return next((r for r in self.rules if r.name == name), None)

    def as_list(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rules]


_RESET_FIRST = (Step("reset"), Step("reboot"), Step("replace"))
_REBOOT_FIRST = (Step("reboot"), Step("replace"))
# NVIDIA's health-validation order (drain → reset GPU → restart OS → service) with the catalog's
# first step: RESET_GPU (and the XID 48 / NVLink workflows, which begin with a reset) start at a
# reset; RESTART_BM/RESTART_VM, XID 79 among them, at a reboot. A GPU gone from NVML is XID 79 as
# NVML sees it. A GPU NVML answers RESET_REQUIRED for, or with a page retirement pending a reset,
# starts at a reset. The driver's own recovery action (NVML field 230 or the XID 154 announcing
# it) starts where it says: GPU reset or drain-and-reset at a reset, node reboot at a reboot. A
# row remap pending after a contained error asks for nothing (running work continues, the remap
# waits for the next reset: NVIDIA's memory error management), so it has no rule. Findings no
# rule matches (row-remap failure, retired-page limit: hardware that a reset cannot mend) keep
# the action the check gave them. Draining is not a step: every action begins with it (HyperPod
# drains first; the kubernetes provider cordons).
DEFAULT_LADDER = Ladder(
    (
        LadderRule("xid-79", "xid", _REBOOT_FIRST, xids=frozenset({79})),
        LadderRule(
            "xid-restart", "xid", _REBOOT_FIRST, buckets=frozenset({"RESTART_BM", "RESTART_VM"})
        ),
        LadderRule(
            "xid-reset",
            "xid",
            _RESET_FIRST,
            buckets=frozenset(
                {"RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR"}
            ),
        ),
        LadderRule("xid-app-repeat", "xid_app_repeat", _RESET_FIRST),
        LadderRule("gpu-reset-required", "gpu_reset_required", _RESET_FIRST),  # NVML said so
        LadderRule("gpu-missing", "gpu_missing", _REBOOT_FIRST),
        LadderRule("gpu-recovery-reset", "gpu_recovery_reset", _RESET_FIRST),  # driver said so
        LadderRule("gpu-recovery-reboot", "gpu_recovery_reboot", _REBOOT_FIRST),  # driver said so
        LadderRule("retired-pages-pending", "retired_pages_pending", _RESET_FIRST),
    )
)
_LADDER_KEYS = frozenset({"rules", "defaults"})
_RULE_KEYS = frozenset({"name", "check", "xid", "bucket", "steps", "within_hours"})
_STEP_KEYS = frozenset({"action", "within_hours"})


def parse_ladder(raw: Any) -> tuple[Ladder, list[str]]:
    """The `ladder:` section → (ladder, problems). Any problem refuses the whole config.

    `rules` come first, in order; the built-in rules follow (`defaults: false` drops them; a rule
    named like a built-in one replaces it). Each rule: `name`, `check`, optionally `xid` (codes)
    or `bucket` (catalog buckets) for check `xid`, `steps` (actions, or {action, within_hours}),
    and `within_hours` for every step that does not set its own (default 24). Steps must climb,
    reset < reboot < deep-check < replace: a step that repeats or goes back down would make the
    ladder loop. `deep-check` is optional and gates the replacement, so it must be followed by
    `replace` (a check whose failure leads nowhere would only take the node out for an hour).
    """
    if raw is None:
        return DEFAULT_LADDER, []
    if not isinstance(raw, Mapping):
        return DEFAULT_LADDER, ["ladder must be a mapping with rules (and defaults)"]
    problems = [f"ladder: unknown key {k!r}" for k in sorted(set(raw) - _LADDER_KEYS, key=str)]
    defaults = raw.get("defaults", True)
    if not isinstance(defaults, bool):
        problems.append(f"ladder.defaults {defaults!r} is not true|false")
    specs = raw.get("rules", [])
    if not isinstance(specs, list):
        return DEFAULT_LADDER, [*problems, "ladder.rules must be a list"]
    rules: list[LadderRule] = []
    for index, spec in enumerate(specs):
        rule, why = _rule(spec, f"ladder.rules[{index}]")
        problems += why
        if rule is not None:
            if any(r.name == rule.name for r in rules):
                problems.append(f"ladder.rules[{index}]: a second rule named {rule.name!r}")
            rules.append(rule)
    if defaults is not False:
        names = {r.name for r in rules}
        rules += [r for r in DEFAULT_LADDER.rules if r.name not in names]
    return Ladder(tuple(rules)), problems


def _rule(spec: Any, where: str) -> tuple[LadderRule | None, list[str]]:
    if not isinstance(spec, Mapping):
        return None, [f"{where}: a rule must be a mapping (name, check, steps)"]
    problems = [f"{where}: unknown key {k!r}" for k in sorted(set(spec) - _RULE_KEYS, key=str)]
    name, check = spec.get("name"), spec.get("check")
    if not isinstance(name, str) or not _RULE_NAME.match(name):
        problems.append(f"{where}: name {name!r} must be lower-case letters, digits, . _ -")
        name = where
    where = f"ladder rule {name!r}"
    if not isinstance(check, str) or not check:
        problems.append(f"{where}: check (a finding's check id, e.g. xid) is required")
        check = ""
    xids = _xids(spec.get("xid"), where, problems)
    buckets = _buckets(spec.get("bucket"), where, problems)
    if (xids or buckets) and check != "xid":
        problems.append(f"{where}: xid and bucket only apply to check xid, not {check!r}")
    within = _hours(spec.get("within_hours", DEFAULT_WITHIN_S / HOUR), where, problems)
    steps = _steps(spec.get("steps"), within, where, problems)
    if problems:
        return None, problems
    return LadderRule(name, check, steps, xids, buckets), []


def _xids(raw: Any, where: str, problems: list[str]) -> frozenset[int]:
    if raw is None:
        return frozenset()
    values = raw if isinstance(raw, list) else [raw]
    if not values or any(isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in values):
        problems.append(f"{where}: xid {raw!r} must be XID codes (positive integers)")
        return frozenset()
    return frozenset(values)


def _buckets(raw: Any, where: str, problems: list[str]) -> frozenset[str]:
    if raw is None:
        return frozenset()
    values = raw if isinstance(raw, list) else [raw]
    known = {info.action for info in catalog().values()}
    unknown = [b for b in values if b not in known]
    if not values or unknown:
        problems.append(
            f"{where}: bucket {unknown or raw!r} is not in NVIDIA's catalog"
            f" ({', '.join(sorted(known))})"
        )
        return frozenset()
    return frozenset(values)


def _hours(raw: Any, where: str, problems: list[str]) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw < 24 * 365:
        problems.append(f"{where}: within_hours {raw!r} is not a positive number of hours")
        return DEFAULT_WITHIN_S
    return float(raw) * HOUR


def _steps(raw: Any, within_s: float, where: str, problems: list[str]) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}: steps must be a non-empty list of {'|'.join(ACTIONS)}")
        return ()
    steps: list[Step] = []
    for index, item in enumerate(raw, start=1):
        spec: Any = {"action": item} if isinstance(item, str) else item
        if not isinstance(spec, Mapping):
            problems.append(f"{where}: step {index} {item!r} is not an action or a mapping")
            continue
        extra = sorted(set(spec) - _STEP_KEYS, key=str)
        if extra:
            problems.append(f"{where}: step {index}: unknown key {extra[0]!r}")
        action = spec.get("action")
        if action not in ACTIONS:
            problems.append(
                f"{where}: step {index}: unknown action {action!r} (one of {', '.join(ACTIONS)})"
            )
            continue
        step_within = within_s
        if "within_hours" in spec:
            step_within = _hours(spec["within_hours"], f"{where}: step {index}", problems)
        if steps and action_rank(action) <= action_rank(steps[-1].action):
            problems.append(
                f"{where}: step {index} ({action}) does not climb above step {len(steps)}"
                f" ({steps[-1].action}): a ladder that repeats or goes back down loops;"
                f" steps must climb {' < '.join(ACTIONS)}"
            )
            continue
        steps.append(Step(action, step_within))
    if steps and steps[-1].action == DEEP_CHECK:
        problems.append(
            f"{where}: deep-check is the last step: it gates a replacement, so replace must"
            " follow it"
        )
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class Rung:
    """Where one finding stands on its ladder now: the step it asks for, and why."""

    check: str
    component: str
    action: Action
    rule: str = ""  # "": no rule matched; the check's own action, no ladder
    step: int = 0
    steps: int = 1
    why: str = "the check's own action (no ladder rule)"
    then: Action | None = None  # the next step, if the failure comes back within `within_s`
    within_s: float = 0.0
    # Non-empty: the finding asks for nothing now, and why (its deep check passed, say).
    hold: str = ""
    # What the ladder follows for it: the physical GPU (UUID, else `pci:<bus id>`) when the
    # finding names one, "" for the component itself (not a GPU, or an agent that sent no ids).
    device: str = ""
    stale: bool = False  # held because it was first seen before the node's boot (see `climb`)

    def describe(self) -> str:
        if not self.rule:
            if self.hold:
                return f"{self.check}@{self.component}: {self.hold}; nothing asked"
            return f"{self.check}@{self.component}: {self.action}, {self.why}"
        if self.hold:
            return (
                f"{self.rule}@{self.component} step {self.step + 1}/{self.steps}"
                f" {self.action}: {self.hold}; nothing asked"
            )
        after = (
            f"; again within {self.within_s / HOUR:g} h: {self.then}"
            if self.then
            else "; top of the ladder"
        )
        return (
            f"{self.rule}@{self.component} step {self.step + 1}/{self.steps}"
            f" {self.action} ({self.why}){after}{self.followed()}"
        )

    def followed(self) -> str:
        """What the ladder followed, where it is not the component as named: the physical GPU,
        or, for a GPU known only by its index, that it was the index."""
        if self.device and self.device != self.component:
            return f" [{self.device}]"
        if gpu_index(self.component) is not None and not self.device:
            return " [by GPU index: the agent sent no GPU UUID or PCI bus id]"
        return ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule or None,
            "check": self.check,
            "component": self.component,
            "step": self.step + 1,
            "steps": self.steps,
            "action": self.action,
            "why": self.why,
            "next": self.then,
            "next_within_hours": self.within_s / HOUR if self.then else None,
            "hold": self.hold or None,
            "device": self.device or None,
        }


# The rules whose failure is "this GPU is gone": XID 79 (fallen off the bus) and a GPU NVML no
# longer finds are one fault seen two ways (a GPU lost from NVML is XID 79 as NVML sees it).
LOST_GPU_XID = 79
GPU_MISSING = "gpu_missing"


def ladder_device(finding: Finding) -> str:
    """The physical GPU a `gpuN[:...]` finding names, as the ladder keys it: its UUID, else
    `pci:<bus id>`, with the component's sub-part (`:link3`) kept; "" when the finding names no
    GPU or carries neither id (an agent older than issue 28: the index is all there is)."""
    if gpu_index(finding.component) is None:
        return ""
    ident = finding.uuid or (f"pci:{finding.pci_bus_id}" if finding.pci_bus_id else "")
    if not ident:
        return ""
    _, _, sub = finding.component.partition(":")
    return f"{ident}:{sub}" if sub else ident


@dataclass(frozen=True, slots=True)
class Boot:
    """The node has booted since its last action: findings first seen before `before` come from
    before that boot (the failure the action treated), not a recurrence. `how` says how that is
    known, for the audit."""

    before: float
    how: str


def climb(
    findings: Iterable[Finding],
    marks: Iterable[LadderMark],
    ladder: Ladder,
    now: float,
    in_progress: bool = False,
    deep: DeepCheck | None = None,
    boot: Boot | None = None,
) -> tuple[Rung, ...]:
    """Each acting finding's step: the first step, or the next one after the last taken step
    when the same rule fires on the same component within that step's window.

    The component is the physical one: a GPU finding that carries the GPU's UUID (or PCI bus
    id) is followed by it, so the GPU NVML renumbers into the index of one that was lost starts
    its own ladder, and a lost GPU is still the same GPU under another index. A finding without
    ids (an agent older than issue 28) is followed by its index, and its step says so. XID 79
    and a missing GPU are one fault (`LOST_GPU_XID`): a GPU treated for falling off the bus that
    is missing after the step is that failure again, and takes the next step.

    `in_progress`: the node's last action is still under way; a finding first seen before that
    step was taken is the failure the step is treating, not a new one, so it stays on that step.
    `deep`: the node's last deep check; after a rule's deep-check step its verdict decides (see
    `_after_deep_check`), not the window.
    `boot`: the node booted after its last action; a finding first seen before that boot is
    stale (the agent has not reported since, or remembered it across the boot): it asks for
    nothing and is no recurrence, however long the action's in-progress window has been over.
    """
    taken = {m.key: m for m in marks}
    lost = _lost_gpu_rules(ladder) if taken else frozenset()  # only other marks need it
    rungs: list[Rung] = []
    for finding in findings:
        if finding.action not in ACTIONS:
            continue
        rule = ladder.rule_for(finding)
        device = ladder_device(finding)
        stale = _stale(finding, boot)
        if rule is None:
            rungs.append(
                Rung(
                    finding.check,
                    finding.component,
                    finding.action,
                    hold=stale,
                    device=device,
                    stale=bool(stale),
                )
            )
            continue
        mark, via = _mark_for(rule, finding, device, taken, lost)
        if mark is not None and via:
            device = mark.device or mark.component  # the GPU that step was taken for
        hold = ""
        if stale:
            step = min(mark.step, len(rule.steps) - 1) if mark is not None else 0
            why, hold = "from before the node's last boot", stale
        elif mark is not None and mark.performed == DEEP_CHECK and mark.step < len(rule.steps):
            step, why, hold = _after_deep_check(rule, mark, deep, finding, now)
        elif mark is not None and in_progress and finding.first_seen <= mark.at:
            step = min(mark.step, len(rule.steps) - 1)
            why = f"the {mark.performed} of {(now - mark.at) / 60:.0f} min ago is under way"
        else:
            step, why = _position(rule, mark, now)
        if via:
            why = f"{why}; {via}"
        following = rule.steps[step + 1] if step + 1 < len(rule.steps) else None
        rungs.append(
            Rung(
                finding.check,
                finding.component,
                rule.steps[step].action,
                rule.name,
                step,
                len(rule.steps),
                why,
                following.action if following else None,
                rule.steps[step].within_s if following else 0.0,
                hold,
                device,
                bool(stale),
            )
        )
    return tuple(rungs)


def escalate_repeat_offender(rungs: Iterable[Rung], why: str) -> tuple[Rung, ...]:
    """A node that keeps failing is replaced rather than reset or rebooted once more: each
    rung that asks for a reset or a reboot asks for replace, saying `why` ("repeat offender: 2
    hardware incidents in 7 days", from the cluster service's goodput ledger, issue 29). Held
    rungs stay held and a deep check stays (it gates a replacement already). Pure."""
    out: list[Rung] = []
    for rung in rungs:
        if rung.hold or rung.action not in ("reset", "reboot"):
            out.append(rung)
            continue
        out.append(
            replace(rung, action="replace", why=f"{rung.why}; {why}", then=None, within_s=0.0)
        )
    return tuple(out)


def _stale(finding: Finding, boot: Boot | None) -> str:
    """Why the finding is from before the node's last boot ("" when it is not)."""
    if boot is None or finding.first_seen >= boot.before:
        return ""
    return (
        f"first seen {format_time(finding.first_seen)}, before the node's boot after its last"
        f" action ({boot.how}): stale, not a recurrence"
    )


def _lost_gpu_rules(ladder: Ladder) -> frozenset[str]:
    """The rules that follow a lost GPU: those for `gpu_missing`, and the one XID 79 takes."""
    names = {r.name for r in ladder.rules if r.check == GPU_MISSING}
    first = next((r for r in ladder.rules if r.matches("xid", [LOST_GPU_XID])), None)
    if first is not None:
        names.add(first.name)
    return frozenset(names)


def _mark_for(
    rule: LadderRule,
    finding: Finding,
    device: str,
    taken: Mapping[tuple[str, str], LadderMark],
    lost: frozenset[str],
) -> tuple[LadderMark | None, str]:
    """The mark a finding continues from, and how it was found ("" for its own rule and key).

    A lost-GPU rule also continues a lost-GPU mark of the other kind on the same GPU; and a
    GPU missing from the node with no id of its own (after a boot NVML counts fewer GPUs, and
    no longer knows which one is gone) continues the lost-GPU step taken on a GPU of the node,
    since that GPU not coming back is what such a step leaves behind.
    """
    key = device or finding.component
    mark = taken.get((rule.name, key))
    if mark is not None or rule.name not in lost:
        return mark, ""
    same = [m for m in taken.values() if m.rule in lost and m.rule != rule.name and m.key[1] == key]
    if same:
        found = max(same, key=lambda m: (action_rank(m.performed), m.at))
        return _as_step_of(rule, found), f"the same fault as {found.rule}@{found.component}"
    if finding.check != GPU_MISSING or device or gpu_index(finding.component) is not None:
        return None, ""
    treated = [m for m in taken.values() if m.rule in lost and m.key[1] != "node"]
    if not treated:
        return None, ""
    found = max(treated, key=lambda m: (action_rank(m.performed), m.at))
    shown = f"{found.component} ({found.device})" if found.device else found.component
    return (
        _as_step_of(rule, found),
        f"a GPU is missing after the {found.performed} for {found.rule}@{shown}: that GPU did"
        " not come back",
    )


def _as_step_of(rule: LadderRule, mark: LadderMark) -> LadderMark:
    """Another rule's mark placed on `rule`: at its highest step not above what was done."""
    steps = [
        i for i, s in enumerate(rule.steps) if action_rank(s.action) <= action_rank(mark.action)
    ]
    return replace(mark, rule=rule.name, step=steps[-1] if steps else 0)


def _after_deep_check(
    rule: LadderRule, mark: LadderMark, deep: DeepCheck | None, finding: Finding, now: float
) -> tuple[int, str, str]:
    """(step, why, hold) for a finding whose rule last took its deep-check step.

    Waiting: stays on that step (the policy skips the node while the check runs). Failed (or a
    timeout escalated to replace): the next step, replace, whatever the window. Passed (or a
    timeout that only alerts): the finding the check examined asks for nothing (hold); one first
    seen after the check started is a new occurrence and starts the rule from its first step.
    A check the state no longer holds (another one replaced it) proves nothing: first step.
    """
    ours = deep is not None and abs(deep.started_at - mark.at) < 1.0
    if deep is None or not ours:
        return (
            0,
            f"the deep check of {(now - mark.at) / HOUR:.1f} h ago has no result: first step",
            "",
        )
    if deep.waiting:
        minutes = (now - deep.started_at) / 60
        return mark.step, f"deep health check under way for {minutes:.0f} min", ""
    if deep.replace:
        said = "failed" if deep.verdict == "Failed" else f"ended {deep.verdict} (escalated)"
        return min(mark.step + 1, len(rule.steps) - 1), f"deep health check {said}", ""
    if finding.first_seen <= mark.at:
        said = "passed" if deep.verdict == "Passed" else "timed out"
        return mark.step, f"deep health check {said}", f"deep health check {said}; not replaced"
    said = "passed" if deep.verdict == "Passed" else "timed out"
    return 0, f"again after a deep health check that {said}: from the first step", ""


def _position(rule: LadderRule, mark: LadderMark | None, now: float) -> tuple[int, str]:
    if mark is None:
        return 0, "first step"
    last = rule.steps[min(mark.step, len(rule.steps) - 1)]
    age = now - mark.at
    if age > last.within_s:
        return 0, (
            f"last {mark.performed} {age / HOUR:.1f} h ago, beyond {last.within_s / HOUR:g} h:"
            " from the first step"
        )
    for index in range(mark.step + 1, len(rule.steps)):
        if action_rank(rule.steps[index].action) > action_rank(mark.performed):
            return index, f"again {age / HOUR:.1f} h after a {mark.performed}"
    return len(rule.steps) - 1, f"again {age / HOUR:.1f} h after a {mark.performed}; no step above"


def live_marks(marks: Iterable[LadderMark], ladder: Ladder, now: float) -> tuple[LadderMark, ...]:
    """The marks still in their step's window (a mark whose rule is gone is dropped)."""
    kept = []
    for mark in marks:
        rule = ladder.rule_named(mark.rule)
        if rule is None:
            continue
        if now - mark.at <= rule.steps[min(mark.step, len(rule.steps) - 1)].within_s:
            kept.append(mark)
    return tuple(sorted(kept, key=lambda m: m.key))


def mark_ladder(
    marks: Iterable[LadderMark],
    rungs: Iterable[Rung],
    performed: Action,
    ladder: Ladder,
    now: float,
) -> tuple[LadderMark, ...]:
    """The marks after an action for `rungs` that the providers carried out as `performed`.

    A deep check marks only deep-check steps (it mends nothing), and a remedy never marks a
    deep-check step (no check ran): that step waits its turn.
    """
    kept = {m.key: m for m in live_marks(marks, ladder, now)}
    for rung in rungs:
        if rung.rule and not rung.hold and (performed == DEEP_CHECK) == (rung.action == DEEP_CHECK):
            done = performed if action_rank(performed) >= action_rank(rung.action) else rung.action
            mark = LadderMark(
                rung.rule, rung.component, rung.step, rung.action, done, now, rung.device
            )
            kept[mark.key] = mark
    newest = sorted(kept.values(), key=lambda m: m.at)[-MAX_LADDER_MARKS:]
    return tuple(sorted(newest, key=lambda m: m.key))


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    mode: Mode = "observe"
    budget_nodes: int = 2  # N: at least this many nodes may be in remediation at once
    budget_percent: float = 2.0  # P: ... or this share of the GPU nodes, whichever is larger
    budget_window_s: float = 3600.0  # the rolling window of the per-hour budget
    breaker_threshold: int = 5  # T: more than this many nodes newly failing ...
    breaker_window_s: float = 300.0  # W: ... within this many seconds trips the breaker
    cooldown_s: float = 3600.0  # after an action starts, the node is left alone this long
    active_timeout_s: float = 3 * 3600.0  # an unconfirmed action stops counting after this
    max_attempts: int = 3  # after this many actions on one node, a human decides
    healthy_reset_s: float = 24 * 3600.0  # healthy this long without a break: attempts back to 0
    alert_ttl_s: float = 24 * 3600.0  # a firing alert not sent again for this long expires
    ladder: Ladder = DEFAULT_LADDER
    # The deep-check step (only where a ladder rule lists it). YAML `deep_check:`
    # {timeout_seconds, on_timeout, retry_seconds}.
    # No result on the node's deep-health label this long after the request: give up waiting.
    # 2 h: InstanceStress runs DCGM diagnostics level 4, 45-90 min, plus stress-ng and EFA.
    deep_check_timeout_s: float = 2 * 3600.0
    # What a timed-out check leads to: "alert" (default: not replaced, a warning audit record,
    # Event and `topowatch_remediation_lifecycle{reason="deep_check_timeout"}`; a check that never
    # reported says nothing about the hardware, and a replacement destroys the instance's
    # volumes) or "replace" (treated as failed).
    deep_check_on_timeout: Literal["alert", "replace"] = "alert"
    # A check the API would not start yet (ConflictException: one on-demand check per cluster at a
    # time; or still throttled) is asked again after this long; not an attempt, no cooldown.
    deep_check_retry_s: float = 300.0
    # Rack-level escalation (healthcheck/remediation/rack.py), YAML `rack_escalation:`
    # {enabled, share}: off by default (a rack action takes every node of an UltraServer out of
    # service). When on, an UltraServer with at least `rack_share` of its nodes asking for an
    # action gets one rack-level request instead of one per node.
    rack_escalation: bool = False
    rack_share: float = 0.5

    def budget(self, gpu_nodes: int) -> int:
        return max(self.budget_nodes, math.floor(gpu_nodes * self.budget_percent / 100.0))

    @staticmethod
    def from_mapping(raw: Mapping[str, Any]) -> tuple[PolicyConfig, list[str]]:
        """Read the YAML `policy` settings; unknown or bad values are reported, defaults kept."""
        problems: list[str] = []
        defaults = PolicyConfig()
        values: dict[str, Any] = {}
        mode = raw.get("mode", "observe")
        if mode in ("observe", "act"):
            values["mode"] = mode
        else:
            problems.append(f"mode {mode!r} is not observe|act; staying in observe")
        budget = raw.get("budget") or {}
        breaker = raw.get("breaker") or {}
        numbers = {
            "budget_nodes": budget.get("nodes") if isinstance(budget, dict) else None,
            "budget_percent": budget.get("percent") if isinstance(budget, dict) else None,
            "budget_window_s": budget.get("window_seconds") if isinstance(budget, dict) else None,
            "breaker_threshold": breaker.get("threshold") if isinstance(breaker, dict) else None,
            "breaker_window_s": breaker.get("window_seconds")
            if isinstance(breaker, dict)
            else None,
            "cooldown_s": raw.get("cooldown_seconds"),
            "active_timeout_s": raw.get("active_timeout_seconds"),
            "max_attempts": raw.get("max_attempts"),
            "healthy_reset_s": raw.get("healthy_reset_seconds"),
            "alert_ttl_s": raw.get("alert_ttl_seconds"),
        }
        deep = raw.get("deep_check")
        if deep is not None and not isinstance(deep, dict):
            problems.append("deep_check must be a mapping (timeout_seconds, on_timeout, ...)")
            deep = None
        deep = deep or {}
        for key in sorted(set(deep) - {"timeout_seconds", "on_timeout", "retry_seconds"}, key=str):
            problems.append(f"deep_check: unknown key {key!r}")
        numbers["deep_check_timeout_s"] = deep.get("timeout_seconds")
        numbers["deep_check_retry_s"] = deep.get("retry_seconds")
        on_timeout = deep.get("on_timeout", "alert")
        if on_timeout in ("alert", "replace"):
            values["deep_check_on_timeout"] = on_timeout
        else:
            problems.append(f"deep_check.on_timeout {on_timeout!r} is not alert|replace")
        for name, value in numbers.items():
            if value is None:
                continue
            default = getattr(defaults, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                problems.append(f"{name}={value!r} is not a non-negative number; using {default}")
                continue
            values[name] = int(value) if isinstance(default, int) else float(value)
        values["ladder"], ladder_problems = parse_ladder(raw.get("ladder"))
        problems += ladder_problems
        rack_values, rack_problems = _rack_escalation(raw.get("rack_escalation"))
        values.update(rack_values)
        problems += rack_problems
        return replace(defaults, **values), problems


def _rack_escalation(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """YAML `rack_escalation: {enabled: false, share: 0.5}`; anything doubtful keeps it off."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [f"rack_escalation must be a mapping {{enabled, share}}, not {raw!r}"]
    problems = [
        f"rack_escalation: unknown key {key!r} (enabled, share)"
        for key in sorted(set(raw) - {"enabled", "share"}, key=str)
    ]
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        problems.append(f"rack_escalation.enabled={enabled!r} is not true|false")
    share = raw.get("share", 0.5)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        problems.append(
            f"rack_escalation.share={share!r} is not a share of an UltraServer's nodes in (0, 1]"
            " (0.5: half of them)"
        )
    if problems:
        return {}, problems
    return {"rack_escalation": enabled, "rack_share": float(share)}, []


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """What one node's reports and alerts ask for, and the node facts the rules need."""

    node: str
    action: Action | None
    reasons: tuple[str, ...] = ()  # check ids / alert names behind the action
    onset: float | None = None  # when the failure began (earliest first_seen / startsAt)
    opted_out: bool = False
    hyperpod_status: str = ""
    rungs: tuple[Rung, ...] = ()  # the findings' ladder steps behind `action`
    holding: bool = False  # some finding asks for nothing only because its deep check said so
    # Why the node must not be acted on now, from outside the policy (empty: nothing holds it):
    # (code, detail), e.g. ("unavailable", "slurm: DRAIN (maintenance)") for a node someone
    # else took out of service, or ("agent_unreadable", ...) when its findings are in doubt.
    hold: tuple[str, str] = ("", "")
    # The node has booted since its last action began (a new boot ID, a later BootTime): that
    # action has run its course, so it no longer holds the node as in progress (cooldown and
    # budget still apply), and what the node reports now is new.
    booted: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    action: Action | None
    verdict: Verdict
    reason: str  # a stable code, used as a metric label
    detail: str  # for people: the numbers behind the reason
    mode: Mode
    at: float
    triggers: tuple[str, ...] = ()
    rungs: tuple[Rung, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "verdict": self.verdict,
            "reason": self.reason,
            "detail": self.detail,
            "mode": self.mode,
            "at": self.at,
            "triggers": list(self.triggers),
            "ladder": [r.as_dict() for r in self.rungs],
        }


@dataclass(frozen=True, slots=True)
class Breaker:
    """Trips when more than T nodes start failing within W seconds; only an admin resets it."""

    tripped: bool = False
    tripped_at: float | None = None
    reason: str = ""
    onsets: tuple[tuple[float, str], ...] = field(default=())  # (onset, node) inside W

    def as_dict(self) -> dict[str, Any]:
        return {
            "tripped": self.tripped,
            "tripped_at": self.tripped_at,
            "reason": self.reason,
            "recent_failures": len(self.onsets),
        }


def record_onsets(
    breaker: Breaker, onsets: Iterable[tuple[str, float]], now: float, config: PolicyConfig
) -> Breaker:
    """Add newly failing nodes (node, onset time); trip when the window holds more than T."""
    horizon = now - config.breaker_window_s
    kept = {node: t for t, node in breaker.onsets if t >= horizon}
    for node, t in onsets:
        if t >= horizon and t <= now + config.breaker_window_s:
            kept[node] = min(t, kept.get(node, t))
    window = tuple(sorted((t, node) for node, t in kept.items()))
    if breaker.tripped or len(window) <= config.breaker_threshold:
        return replace(breaker, onsets=window)
    reason = (
        f"{len(window)} nodes started failing within {config.breaker_window_s:g} s"
        f" (threshold {config.breaker_threshold}): likely a shared cause"
    )
    return Breaker(tripped=True, tripped_at=now, reason=reason, onsets=window)


def reset_breaker(breaker: Breaker) -> Breaker:
    """An admin's reset: close the breaker and forget the failures that tripped it."""
    return Breaker()


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    gpu_nodes: int
    pending_elsewhere: frozenset[str] = frozenset()  # nodes HyperPod already has pending
    # Deleted nodes (their state dropped) whose last action started within the budget window.
    started_elsewhere: frozenset[str] = frozenset()


def decide(
    requests: Sequence[NodeRequest],
    states: Mapping[str, RemediationState],
    facts: ClusterFacts,
    breaker: Breaker,
    config: PolicyConfig,
    now: float,
) -> list[Decision]:
    """One decision per request with an action, in order; earlier acts consume the budget."""
    limit = config.budget(facts.gpu_nodes)
    # A node in a deep check is out of service: in remediation, however long the check takes.
    active = {n for n, s in states.items() if busy(s, now, config)}
    active |= facts.pending_elsewhere
    hour_start = now - config.budget_window_s
    # Nodes, not actions: a node's deep check and the replacement it leads to count once. A
    # deferred check started nothing.
    started = {
        n for n, s in states.items() if s.started_at > hour_start and s.outcome != "deferred"
    }
    started |= facts.started_elsewhere
    decisions: list[Decision] = []
    for request in requests:
        if request.action is None:
            continue

        def make(verdict: Verdict, reason: str, detail: str, r: NodeRequest = request) -> Decision:
            return Decision(
                r.node, r.action, verdict, reason, detail, config.mode, now, r.reasons, r.rungs
            )

        state = states.get(request.node)
        if request.opted_out:
            decisions.append(make("skip", "opted_out", f"label {OPT_OUT_LABEL}={OPT_OUT_VALUE}"))
        elif request.hyperpod_status in HYPERPOD_PENDING:
            decisions.append(
                make("skip", "already_pending", f"{HYPERPOD_HEALTH}={request.hyperpod_status}")
            )
        elif request.hold[0]:
            decisions.append(make("skip", *request.hold))
        elif state is not None and state.deep_check_waiting():
            assert state.deep_check is not None
            seen = "seen InProgress" if state.deep_check.seen_in_progress else "no result yet"
            decisions.append(
                make(
                    "skip",
                    "deep_check_running",
                    f"deep health check ({', '.join(state.deep_check.checks) or 'requested'})"
                    f" since {(now - state.deep_check.started_at) / 60:.0f} min, {seen};"
                    f" waiting up to {config.deep_check_timeout_s / HOUR:g} h",
                )
            )
        elif (
            state is not None
            and state.outcome == "deferred"
            and request.action == DEEP_CHECK
            and now - state.started_at < config.deep_check_retry_s
        ):
            left = config.deep_check_retry_s - (now - state.started_at)
            decisions.append(
                make("skip", "deep_check_deferred", f"{state.message}; asked again in {left:.0f} s")
            )
        elif (
            state is not None
            and state.is_active(now, config.active_timeout_s)
            and not request.booted
        ):
            decisions.append(
                make(
                    "skip",
                    "in_progress",
                    f"{state.action} via {state.provider} {state.outcome}"
                    f" since {now - state.started_at:.0f} s",
                )
            )
        elif state is not None and state.attempts >= config.max_attempts:
            decisions.append(
                make(
                    "skip",
                    "attempts_exhausted",
                    f"{state.attempts} actions already; a person must look at this node"
                    f" (attempts reset once it reports healthy for"
                    f" {config.healthy_reset_s / HOUR:g} h)",
                )
            )
        elif (
            state is not None
            and now - state.started_at < config.cooldown_s
            and state.outcome != "deferred"
            and not _gate_open(state, request)
        ):
            left = config.cooldown_s - (now - state.started_at)
            decisions.append(make("skip", "cooldown", f"{left:.0f} s of cooldown left"))
        elif breaker.tripped:
            decisions.append(make("skip", "breaker_open", breaker.reason))
        elif len(active) >= limit:
            decisions.append(
                make("skip", "budget_concurrent", f"{len(active)} of {limit} nodes in remediation")
            )
        elif len(started - _own_start(state, request)) >= limit:
            decisions.append(
                make(
                    "skip",
                    "budget_hourly",
                    f"{len(started)} of {limit} actions in the last {config.budget_window_s:g} s",
                )
            )
        else:
            # Observe mode spends the budget within one round too, so it shows what act would do.
            active.add(request.node)
            started.add(request.node)
            if config.mode == "observe":
                decisions.append(
                    make("skip", "observe", f"would {request.action}; mode is observe")
                )
            else:
                triggers = ", ".join(request.reasons) or "requested"
                decisions.append(make("act", "act", f"{request.action}: {triggers}"))
    return decisions


def busy(state: RemediationState, now: float, config: PolicyConfig) -> bool:
    """In remediation now: an action under way, or a deep check waiting for its result."""
    return state.is_active(now, config.active_timeout_s) or state.deep_check_waiting()


def _own_start(state: RemediationState | None, request: NodeRequest) -> set[str]:
    """The node itself, where its own earlier start in the window must not block this action:
    a deep check continues the remediation its reboot began, and the replacement a failed check
    opened continues the check. The hourly budget counts nodes, so the node counts once."""
    if request.action == DEEP_CHECK or (state is not None and _gate_open(state, request)):
        return {request.node}
    return set()


def _gate_open(state: RemediationState, request: NodeRequest) -> bool:
    """The replacement a failed deep check opened: what the node waited for, so no cooldown."""
    deep = state.deep_check
    return (
        request.action == "replace"
        and state.action == DEEP_CHECK
        and deep is not None
        and deep.replace
    )


def read_deep_check(
    state: RemediationState, label: str, now: float, config: PolicyConfig
) -> tuple[RemediationState, str, str]:
    """A waiting deep check brought up to `now` from the node's deep-health label.

    Returns (state, change, detail); change is "" (nothing new), `deep_check_running` (first seen
    InProgress), `deep_check_failed`, `deep_check_passed` or `deep_check_timeout`. A `Passed` or
    `Failed` counts only once the label was seen InProgress since the request or differs from
    its value then (HyperPod keeps the last check's value on the node). A result ends the step:
    outcome `checked`, no longer in remediation.
    """
    deep = state.deep_check
    if deep is None or not state.deep_check_waiting():
        return state, "", ""
    if label == "InProgress":
        if deep.seen_in_progress:
            return state, "", ""
        seen = replace(deep, seen_in_progress=True)
        detail = f"{_DHC_LABEL}=InProgress {(now - deep.started_at) / 60:.0f} min after the request"
        return replace(state, deep_check=seen), "deep_check_running", detail
    age = now - deep.started_at
    if label in ("Passed", "Failed") and (deep.seen_in_progress or label != deep.before):
        verdict: Literal["Passed", "Failed"] = "Passed" if label == "Passed" else "Failed"
        gate = verdict == "Failed"
        detail = (
            "deep health check failed; the ladder's replace follows"
            if gate
            else "deep health check passed; not replaced"
        ) + f" ({_DHC_LABEL}={verdict} {age / 60:.0f} min after the request)"
        code = "deep_check_failed" if gate else "deep_check_passed"
        done = replace(deep, verdict=verdict, verdict_at=now, replace=gate)
        return replace(state.finished("checked", now, detail), deep_check=done), code, detail
    if age < config.deep_check_timeout_s:
        return state, "", ""
    escalate = config.deep_check_on_timeout == "replace"
    shown = f"{_DHC_LABEL}={label!r}" if label else f"no {_DHC_LABEL} label"
    detail = (
        f"deep health check gave no result within {config.deep_check_timeout_s / HOUR:g} h"
        f" ({shown}); "
        + (
            "on_timeout replace: the ladder's replace follows"
            if escalate
            else "not replaced (on_timeout alert): a person should look at this node"
        )
    )
    done = replace(deep, verdict="timeout", verdict_at=now, replace=escalate)
    return (
        replace(state.finished("checked", now, detail), deep_check=done),
        "deep_check_timeout",
        detail,
    )


# --- a node's lifecycle -----------------------------------------------------------------------


def settle(
    state: RemediationState, requesting: bool, pending: bool, now: float, config: PolicyConfig
) -> tuple[RemediationState, tuple[str, ...]]:
    """A node's state brought up to `now`, and what changed (stable codes, in order).

    `recovered`: an accepted action and the node reports healthy; `healthy`: healthy again, so
    the clock of `healthy_since` starts; `unhealthy`: that clock stops; `attempts_reset`: healthy
    for `healthy_reset_s` without a break, so the node gets its attempts back; `ladder_expired`:
    marks whose window has passed are dropped (the next failure starts from the first step).
    `pending`: HyperPod still has the node pending, which is not health.
    """
    changes: list[str] = []
    if (
        state.healthy_since is not None
        and state.attempts > 0
        and now - state.healthy_since >= config.healthy_reset_s
    ):
        state = replace(state, attempts=0)
        changes.append("attempts_reset")
    marks = live_marks(state.ladder, config.ladder, now)
    if marks != state.ladder:
        state = replace(state, ladder=marks)
        changes.append("ladder_expired")
    if requesting:
        if state.healthy_since is not None:
            state = replace(state, healthy_since=None)
            changes.append("unhealthy")
    elif not pending:
        if state.outcome == "done" and not state.deep_check_waiting():
            state = state.finished("recovered", now, "node reports healthy")
            changes.append("recovered")
        if state.healthy_since is None and not state.is_active(now, config.active_timeout_s):
            state = replace(state, healthy_since=now)
            changes.append("healthy")
    return state, tuple(changes)
