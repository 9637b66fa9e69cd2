"""What the cluster service runs each cycle: the index of check entries, the judging, the
writing and the audit, tied together.

The service feeds `observe`/`observe_list` with the raw Workloads, Nodes and ClusterQueues its
informers deliver (the model keeps none of what the check reads: the entries, the findings
annotation, the ClusterQueue's check strategy), and `set_admission_checks` with the
AdmissionCheck objects the edge lists. `judge` runs under the service's lock (it reads the
model), `settle` outside it (it writes to the API).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.cluster.admission.audit import AdmissionAudit, held_line
from exporter.cluster.admission.decide import Decision, Facts, applies, decide, pods_started
from exporter.cluster.admission.parse import (
    AdmissionCheckInfo,
    CheckEntry,
    CheckStrategy,
    WorkloadChecks,
    parse_admission_check,
    parse_check_strategy,
    parse_node_findings,
    parse_workload_checks,
)
from exporter.cluster.admission.settings import CONTROLLER_NAME, AdmissionSettings
from exporter.cluster.admission.writer import StatusWriter, active_patch, status_patch
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import Pod
from exporter.core.findings import Finding

log = logging.getLogger("topowatch.admission")

MAX_PROBLEMS = 100
CHECKS_LIST_S = 30.0  # AdmissionChecks change rarely: listed this often, not every cycle
# The check name observe mode judges under when no AdmissionCheck of ours exists yet (the
# chart's default object is named so).
DEFAULT_CHECK = "topowatch-node-health"


@dataclass(frozen=True, slots=True)
class Judged:
    decision: Decision
    checks: WorkloadChecks
    seconds: float  # time spent judging it


class AdmissionController:
    def __init__(
        self,
        settings: AdmissionSettings,
        writer: StatusWriter | None = None,
        audit: AdmissionAudit | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.audit = audit or AdmissionAudit()
        self._perf = clock
        self._workloads: dict[tuple[str, str], WorkloadChecks] = {}
        # The workloads that may need an answer: changed since judged, or waiting (a Pending
        # entry, a Ready one whose pods have not started). A cycle visits only these.
        self._attention: set[tuple[str, str]] = set()
        self._findings: dict[str, tuple[Finding, ...]] = {}
        self._strategies: dict[str, CheckStrategy] = {}
        self._checks: dict[str, AdmissionCheckInfo] | None = None  # None: never listed
        self._first_seen: dict[tuple[str, str, str, str], float] = {}  # uid.. -> Pending since
        self._written: dict[tuple[str, str], str] = {}  # workload -> resourceVersion written at
        self.problems: dict[str, None] = {}  # bounded, insertion-ordered
        self._listed_at: float | None = None
        # Set when a Workload arrives with an entry to answer: the cycle runs at once rather
        # than at its next interval (Kueue waits on us from its quota reservation).
        self._wake = threading.Event()

    # --- what the informers deliver -----------------------------------------------------

    def observe(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        deleted = event_type == "DELETED"
        if kind == "Workload":
            checks = parse_workload_checks(obj)
            if checks is None:
                return
            self._note(checks.problems, f"Workload {checks.namespace}/{checks.name}: ")
            if deleted or not checks.entries:
                self._workloads.pop(checks.key, None)
                self._written.pop(checks.key, None)
                return
            self._workloads[checks.key] = checks
            if any(e.state in ("Pending", "Ready") for e in checks.entries):
                self._attention.add(checks.key)
                self._wake.set()
        elif kind == "Node":
            name, findings, problems = parse_node_findings(obj)
            self._note(problems)
            if deleted or not findings:
                self._findings.pop(name, None)
            else:
                self._findings[name] = findings
        elif kind == "ClusterQueue":
            notes: list[str] = []
            parsed = parse_check_strategy(obj, notes)
            self._note(notes)
            if parsed is not None:
                if deleted:
                    self._strategies.pop(parsed[0], None)
                else:
                    self._strategies[parsed[0]] = parsed[1]

    def wait(self, timeout: float) -> bool:
        """Block until a Workload asks for an answer or `timeout` passes (the cycle's pace)."""
        woken = self._wake.wait(timeout)
        self._wake.clear()
        return woken

    def observe_list(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A full (re)list of `kind`: what it no longer holds is gone."""
        if kind == "Workload":
            self._workloads.clear()
            self._attention.clear()
        elif kind == "Node":
            self._findings.clear()
        elif kind == "ClusterQueue":
            self._strategies.clear()
        else:
            return
        for item in items:
            self.observe(kind, "ADDED", item)

    def set_admission_checks(self, items: Iterable[Mapping[str, Any]] | None) -> None:
        """The AdmissionCheck objects as listed now; None: they could not be listed (the
        configured check names are then used alone)."""
        if items is None:
            return
        found: dict[str, AdmissionCheckInfo] = {}
        for item in items:
            info = parse_admission_check(item)
            if info is None:
                self._note(["an AdmissionCheck without a name"])
                continue
            if info.controller_name == CONTROLLER_NAME:
                self._note(info.problems)
            found[info.name] = info
        self._checks = found

    def ours(self) -> frozenset[str]:
        """The check names this controller answers: AdmissionChecks whose controllerName is
        ours (pkg/util/admissioncheck FilterForController), narrowed to the configured names
        when there are any; the configured names alone while no list has been read."""
        wanted = set(self.settings.checks)
        if self._checks is None:
            return frozenset(wanted)
        mine = {n for n, c in self._checks.items() if c.controller_name == CONTROLLER_NAME}
        return frozenset(mine & wanted if wanted else mine)

    # --- a cycle ----------------------------------------------------------------------------

    def sync_checks(self, now: float) -> None:
        """List the AdmissionChecks (every CHECKS_LIST_S) and, in enforce mode, mark ours
        Active, which Kueue needs before a ClusterQueue listing it admits anything (outside
        the lock: API calls)."""
        if self.writer is None:
            return
        if self._listed_at is None or now - self._listed_at >= CHECKS_LIST_S:
            self._listed_at = now
            self.set_admission_checks(self.writer.list_checks())
        if not self.settings.writes or self._checks is None:
            return
        for name in sorted(self.ours()):
            check = self._checks.get(name)
            patch = active_patch(check, now) if check is not None else None
            if check is None or patch is None:
                continue
            result = self.writer.activate(check, patch)
            if result == "written":
                log.info("admission: AdmissionCheck %s marked Active", name)
                self._checks[name] = AdmissionCheckInfo(
                    check.name, check.controller_name, check.problems, active=True
                )
                self._listed_at = None  # read its new resourceVersion next cycle
            else:
                self.audit.write_error(result)

    def judge(
        self, model: ClusterModel, now: float, offenders: Mapping[str, str], synced: bool
    ) -> list[Judged]:
        """Judge every workload with an entry of ours (under the service's lock)."""
        ours = self.ours()
        observing = self.settings.mode == "observe"
        if not ours and not observing:
            return []
        facts = Facts(
            nodes=model.nodes,
            findings=self._findings,
            offenders=offenders,
            synced=synced,
            eligible=lambda flavor, pod_set: model.eligibility(flavor, pod_set).nodes,
        )
        out: list[Judged] = []
        live_first_seen: set[tuple[str, str, str, str]] = set()
        for key in list(self._attention):
            checks = self._workloads.get(key)
            if checks is None:
                self._attention.discard(key)
                continue
            state = model.workloads.get(key)
            waiting = False  # an entry of ours may still need an answer
            for entry in checks.entries:
                if entry.name not in ours or entry.state not in ("Pending", "Ready"):
                    continue
                started = self._perf()
                first = now
                if entry.state == "Pending":
                    waiting = True
                    seen_key = (checks.namespace, checks.name, checks.uid, entry.name)
                    live_first_seen.add(seen_key)
                    first = self._first_seen.setdefault(seen_key, now)
                if state is None:
                    waiting = True
                    continue  # the model has not applied it yet: next cycle
                wl = state.workload
                pods: list[Pod] = []
                if entry.state == "Ready":  # the kueue#12757 re-check, until its pods run
                    if not wl.is_true("Admitted") or not any(p.levels for p in wl.placements):
                        continue  # its admission is a Workload event: it comes back then
                    pods = model.pods_of(wl)
                    if pods_started(wl, pods):
                        continue
                    waiting = True
                if not applies(entry.name, wl.cluster_queue, wl, self._strategies):
                    continue  # onFlavors rules it out; Kueue removes such an entry
                decision = decide(wl, checks.uid, entry, facts, pods, self.settings, now, first)
                if decision is not None:
                    out.append(Judged(decision, checks, self._perf() - started))
            if not waiting and ours:
                self._attention.discard(key)  # until its next change
        if observing:
            out.extend(self._observe_unchecked(model, ours, facts, now))
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in live_first_seen}
        return out

    def _observe_unchecked(
        self, model: ClusterModel, ours: frozenset[str], facts: Facts, now: float
    ) -> list[Judged]:
        """Observe mode, before any ClusterQueue lists our check: judge every workload with
        quota reserved and not yet admitted as if a Pending entry of ours were there (since
        its quota reservation), so an admin sees what enforcing would do before turning it on.
        Nothing is written: no entry exists to write to."""
        name = min(ours) if ours else DEFAULT_CHECK
        out = []
        for key, state in model.workloads.items():
            wl = state.workload
            if not wl.cluster_queue or wl.is_true("Admitted") or not wl.is_true("QuotaReserved"):
                continue
            checks = self._workloads.get(key)
            if checks is not None and any(e.name in ours for e in checks.entries):
                continue  # judged from its real entry
            reserved = wl.condition("QuotaReserved")
            since = reserved.last_transition if reserved is not None else None
            entry = CheckEntry(name, "Pending", "", since)
            started = self._perf()
            decision = decide(wl, wl.uid, entry, facts, (), self.settings, now, since or now)
            if decision is not None:
                shadow = WorkloadChecks(wl.namespace, wl.name, wl.uid, wl.api_version, "", (), ())
                out.append(Judged(decision, shadow, self._perf() - started))
        return out

    def settle(self, judged: Iterable[Judged], now: float) -> list[tuple[Decision, str]]:
        """Write what enforce mode writes, and audit every decision (outside the lock)."""
        done = []
        mode = self.settings.mode
        for item in judged:
            decision, checks = item.decision, item.checks
            written = ""
            if decision.state and self.settings.writes and self.writer is not None:
                written = self._write(checks, decision, now)
            elif decision.state:
                written = "observe"
            self.audit.record(decision, mode, written, item.seconds)
            done.append((decision, written))
        return done

    def _write(self, checks: WorkloadChecks, decision: Decision, now: float) -> str:
        if self._written.get(checks.key) == checks.resource_version:
            return "unchanged"  # already written at this version; wait for the new one
        patch = status_patch(checks, decision, now)
        if patch is None:
            return "unchanged"
        assert self.writer is not None
        result = self.writer.write(checks, patch)
        if result == "written":
            self._written[checks.key] = checks.resource_version
        else:
            self.audit.write_error(result)
        return result

    # --- what others read -------------------------------------------------------------------

    def held(self, namespace: str, name: str, uid: str) -> str:
        """explain's line while our check holds the workload, "" otherwise."""
        row = self.audit.latest(namespace, name)
        if row is None or row.get("uid") != uid:
            return ""
        checks = self._workloads.get((namespace, name))
        entry = checks.entry(row["check"]) if checks is not None else None
        if entry is not None and entry.state == "Pending" and row.get("written") != "observe":
            return ""  # Kueue requeued it since; the check is asked again
        line = held_line(row)
        if line and row.get("written") == "observe":
            line = line.replace("admission held", "admission would be held (observe mode)", 1)
        return line

    def view(self, workload: str | None, limit: int) -> dict[str, Any]:
        return {
            "enabled": self.settings.enabled,
            "mode": self.settings.mode,
            "controller": CONTROLLER_NAME,
            "checks": sorted(self.ours()),
            "fail_open_seconds": self.settings.fail_open_seconds,
            "decisions": self.audit.recent(workload, limit),
            "problems": list(self.problems),
        }

    def _note(self, problems: Iterable[str], prefix: str = "") -> None:
        for problem in problems:
            text = prefix + problem
            if text in self.problems:
                continue
            log.warning("admission: %s", text)
            self.problems[text] = None
            if len(self.problems) > MAX_PROBLEMS:
                del self.problems[next(iter(self.problems))]
