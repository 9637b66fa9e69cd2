"""Faults only the kernel log shows: a GPU fallen off the bus, NVSwitch SXIDs, EFA driver
errors, PCIe AER, NVLink error lines, hung tasks, NVIDIA UVM's global fatal error ("requiring os
reboot to recover": `kernel_uvm_fatal` on the node) and a GPU the driver failed to initialise
(`RmInitAdapter failed!`: `kernel_gpu_init_failed` on that GPU, or on its PCI address when the
agent never read it, as a GPU that failed to initialise never answers NVML).

Lines are events, judged as XIDs are: a finding per (kind, GPU or device) while the latest
matching line is younger than `kernel_log.hold_seconds`. What a line asks for follows the
pattern table's severity (exporter/core/data/kernel-log-patterns.csv): fatal lines a reboot (the
first rung; the remediation ladder climbs from there), errors nothing unless configured,
warnings (a hung task, a non-fatal SXID) nothing, corrected PCIe errors only in numbers. XID
lines are left to the XID check: the poller merged them with NVML's XIDs, one fault one event.

"N callbacks suppressed" lines (the kernel's ratelimit dropped N messages) are counted in
`topowatch_kernel_log_suppressed_total`, not judged: what was dropped is unknown.

A fatal line's finding has severity `fatal`, as a FATAL XID's has: damping (K of N polls) is for
readings that can flap, a counter read mid-reset or a link retraining; a line the driver printed
is a fact that does not un-happen on the next poll, so it is actionable on the poll that read it
(healthcheck/detection/damping.py), at start-up as later. Errors and warnings stay damped.

The lines a finding rests on are not read again after a restart of the agent (the kernel log's
cursor resumes after them), so the monitor keeps what it holds in the state file beside that
cursor (healthcheck/detection/xid_state.py; `held_lines` below says what is kept) and hands it
back through `History.kernel_log` (`HeldLine`): a restarted agent in the same boot judges those
lines as the one before it did, first seen when they were first seen. After a reboot nothing is
restored, as for the XIDs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace

from exporter.core.findings import ACTIONS, SEVERITIES, Finding
from exporter.core.snapshot import KernelLogCount, NodeSnapshot
from healthcheck.detection.checks.base import HeldLine, History, finding
from healthcheck.detection.config import HealthConfig

_NOT_JUDGED = frozenset({"xid", "printk_suppressed"})  # the XID check's; only counted
MAX_HELD = 512  # lines kept over a restart, newest first (the ledger's own series cap)

LineKey = tuple[str, str, str, str, str]  # kind, pattern, severity, GPU, device


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    reading = snapshot.kernel_log
    if reading is None:
        return []
    cfg = config.kernel_log
    restored = {h.key: h for h in history.kernel_log}
    judged: dict[tuple[str, str], list[tuple[tuple[str, str], KernelLogCount]]] = defaultdict(list)
    onset: dict[tuple[str, str], float] = {}
    for c in merged(reading.counts, history.kernel_log):
        if c.kind in _NOT_JUDGED or now - c.last_at > cfg.hold_seconds:
            continue
        verdict = _verdict(c, config)
        if verdict is not None:
            key = (f"kernel_{c.kind}", _component(c))
            judged[key].append((verdict, c))
            held = restored.get(_key(c))
            if held is not None:  # first seen by the agent before this one
                onset[key] = min(onset.get(key, held.first_seen), held.first_seen)
    out = []
    for (check_id, component), entries in sorted(judged.items()):
        severity, action = max((verdict for verdict, _ in entries), key=_rank)
        counts = [c for _, c in entries]
        latest = max(counts, key=lambda c: c.last_at)
        lines = sum(c.count for c in counts)
        evidence = (
            f"{lines} kernel log line(s), latest {max(0, int(now - latest.last_at))}s ago: "
            f"{latest.last_message}"
        )
        made = finding(history, now, check_id, component, severity, action, evidence)
        earlier = onset.get((check_id, component))
        if earlier is not None and earlier < made.first_seen:
            made = replace(made, first_seen=earlier)
        out.append(made)
    return out


def merged(counts: Iterable[KernelLogCount], restored: Iterable[HeldLine]) -> list[KernelLogCount]:
    """This agent's counts with those an earlier agent of this boot held: the same key adds
    up (the two agents read different lines: the cursor hands each line out once) and keeps
    the later latest line."""
    out: dict[LineKey, KernelLogCount] = {_key(c): c for c in counts}
    for held in restored:
        mine = out.get(held.key)
        old = held.count
        if mine is None:
            out[held.key] = old
            continue
        later = mine if mine.last_at >= old.last_at else old
        out[held.key] = replace(
            mine,
            count=mine.count + old.count,
            last_at=later.last_at,
            last_message=later.last_message,
        )
    return list(out.values())


def held_lines(
    counts: Iterable[KernelLogCount],
    restored: Iterable[HeldLine],
    first_seen: Mapping[LineKey, float],
    hold_seconds: float,
    now: float,
) -> tuple[HeldLine, ...]:
    """What the monitor keeps over a restart: every judged line (XIDs are the XID memory's)
    still inside its hold, this agent's and the earlier agent's together, each with when it was
    first held (restored: as it was; `first_seen` for this agent's, by key, else now)."""
    before = {h.key: h.first_seen for h in restored}
    out = [
        HeldLine(c, before.get(_key(c), first_seen.get(_key(c), now)))
        for c in merged(counts, restored)
        if c.kind not in _NOT_JUDGED and now - c.last_at <= hold_seconds
    ]
    out.sort(key=lambda h: (-h.count.last_at, h.key))
    return tuple(sorted(out[:MAX_HELD], key=lambda h: h.key))


def _key(c: KernelLogCount) -> LineKey:
    return (c.kind, c.pattern, c.severity, c.gpu, c.device)


def _verdict(c: KernelLogCount, config: HealthConfig) -> tuple[str, str] | None:
    cfg = config.kernel_log
    if c.severity == "fatal":  # a fact, not a reading: undamped (see the module docstring)
        return "fatal", cfg.fatal_action
    if c.severity == "error":
        return "warning", cfg.error_action
    if c.severity == "corrected":
        if cfg.corrected_report_count and c.count >= cfg.corrected_report_count:
            return "warning", "none"
        return None
    return "warning", "none"


def _rank(verdict: tuple[str, str]) -> tuple[int, int]:
    return ACTIONS.index(verdict[1]), SEVERITIES.index(verdict[0])


def _component(c: KernelLogCount) -> str:
    if c.gpu:
        return f"gpu{c.gpu}"
    return c.device or "node"
