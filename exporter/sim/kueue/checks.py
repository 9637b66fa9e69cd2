"""Kueue's admission checks, as the simulated Kueue runs them (kubernetes-sigs/kueue @ff69552).

A ClusterQueue lists AdmissionChecks in `spec.admissionChecksStrategy.admissionChecks`, each
optionally only `onFlavors`; each AdmissionCheck names the controller that decides it. Kueue's
part, ported here as plain functions over `status.admissionChecks` entries (dicts in the CRD's
shape):

- which checks a workload gets (pkg/workload/workload.go `AdmissionChecksForWorkload`): with an
  admission, the checks whose flavors meet the flavors assigned to its pod sets; without one,
  only the checks that apply to every flavor of the ClusterQueue. A check with no `onFlavors`
  applies to every flavor (pkg/util/admissioncheck `NewAdmissionChecks`);
- keeping the entries in step with that set (workload_controller.go
  `syncAdmissionCheckConditions`): a missing check is added Pending with an empty message, a
  check no longer wanted is dropped, entries are sorted by name;
- all Ready admits (pkg/workload/admissionchecks.go `SyncAdmittedCondition`); a Retry evicts
  with reason `AdmissionCheck` and a Rejected deactivates (workload_controller.go
  `reconcileCheckBasedEviction`, message from `buildAdmissionChecksMessage`);
- an eviction resets every check to Pending, counting a Retry in `retryCount`
  (pkg/workload/evict/evict.go `resetChecksOnEviction`);
- a Retry's `requeueAfterSeconds`, counted from its `lastTransitionTime`, is the backoff: the
  latest one is the workload's `status.requeueState.requeueAt` (`GetMaxRetryTime`,
  `NeedsRequeueAtUpdate`); without one the workload is requeued at once. Kueue's core adds no
  backoff of its own on this path: the check's controller asks for it. `retry_backoff_s` is the
  backoff Kueue's own controllers ask for (`UpdateAdmissionCheckRequeueState`), for a test or
  stand-in controller to use;
- a ClusterQueue that lists a missing AdmissionCheck, or one whose `Active` condition is not
  True, admits nothing (pkg/cache/scheduler/clusterqueue.go `updateWithAdmissionChecks`,
  `inactiveReason`). Kueue's core never sets `Active`: each check's controller does.

Times in entries are RFC 3339 strings, as the API server serialises them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

CAUSE = "admission_check"  # the decisions record's cause (exporter/sim/kueue/decisions.py)
NODE_HEALTH_CHECK = "topowatch-node-health"
NODE_HEALTH_CONTROLLER = "topowatch.io/node-health"
PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
STATES = (PENDING, READY, RETRY, REJECTED)
# Reasons and messages (apis/kueue/v1beta2 workload_types.go, clusterqueue_types.go).
EVICTED_BY_CHECK = "AdmissionCheck"  # WorkloadEvictedByAdmissionCheck
DEACTIVATED = "Deactivated"  # WorkloadDeactivated
DEACTIVATED_BY_CHECK = "DeactivatedDueToAdmissionCheck"  # ReasonWithCause(Deactivated, ...)
BACKOFF_FINISHED = "BackoffFinished"
BACKOFF_FINISHED_MESSAGE = "The workload backoff was finished"
UNSATISFIED_CHECKS = "UnsatisfiedChecks"  # UnadmittedWorkloadsObservability off, as status.py
UNSATISFIED_MESSAGE = "The workload has not all checks ready"
CQ_CHECK_NOT_FOUND = "AdmissionCheckNotFound"
CQ_CHECK_INACTIVE = "AdmissionCheckInactive"

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One AdmissionCheck a ClusterQueue lists: its name, its controller, the flavors it runs
    for (empty: all the queue's flavors), and whether the simulation writes it with the
    `Active` condition its controller would set (False: the real controller must set it)."""

    name: str = NODE_HEALTH_CHECK
    controller: str = NODE_HEALTH_CONTROLLER
    on_flavors: tuple[str, ...] = ()
    active: bool = True


@dataclass(frozen=True, slots=True)
class AdmissionChecks:
    """Which checks the simulated cluster's ClusterQueues list: `queues` names the
    ClusterQueues (None: every one); `create` False leaves the AdmissionCheck objects out of
    the cluster (a ClusterQueue naming a missing check is inactive)."""

    checks: tuple[CheckSpec, ...] = (CheckSpec(),)
    queues: tuple[str, ...] | None = None
    create: bool = True

    def for_queue(self, queue: str) -> tuple[CheckSpec, ...]:
        if self.queues is not None and queue not in self.queues:
            return ()
        return self.checks


def strategy_manifest(checks: Sequence[CheckSpec]) -> Obj:
    """`spec.admissionChecksStrategy` of a ClusterQueue listing `checks`."""
    rules: list[Obj] = []
    for check in checks:
        rule: Obj = {"name": check.name}
        if check.on_flavors:
            rule["onFlavors"] = list(check.on_flavors)
        rules.append(rule)
    return {"admissionChecks": rules}


def admission_check_manifest(
    check: CheckSpec, uid: str, created: str, active: bool | None = None
) -> Obj:
    """An AdmissionCheck (v1beta2). With `active` (default: `check.active`) its status carries
    the `Active` condition its controller sets when it is ready to decide."""
    out: Obj = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": check.name, "uid": uid, "creationTimestamp": created},
        "spec": {"controllerName": check.controller},
    }
    if check.active if active is None else active:
        out["status"] = {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Active",
                    "message": "The admission check is active",
                    "lastTransitionTime": created,
                    "observedGeneration": 1,
                }
            ]
        }
    return out


def is_active(obj: Mapping[str, Any] | None) -> bool:
    """The AdmissionCheck's `Active` condition is True (cache.go AddOrUpdateAdmissionCheck)."""
    if not isinstance(obj, Mapping):
        return False
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and cond.get("type") == "Active":
            return cond.get("status") == "True"
    return False


def queue_inactive(missing: Sequence[str], inactive: Sequence[str]) -> tuple[str, str] | None:
    """The ClusterQueue's Active=False reason and message (clusterqueue.go inactiveReason),
    or None when every check it lists exists and is active."""
    reasons: list[str] = []
    messages: list[str] = []
    if missing:
        reasons.append(CQ_CHECK_NOT_FOUND)
        messages.append(f"references missing AdmissionCheck(s): {','.join(sorted(missing))}")
    if inactive:
        reasons.append(CQ_CHECK_INACTIVE)
        messages.append(f"references inactive AdmissionCheck(s): {','.join(sorted(inactive))}")
    if not reasons:
        return None
    return reasons[0], f"Can't admit new workloads: {', '.join(messages)}."


def checks_for_workload(
    checks: Sequence[CheckSpec],
    queue_flavors: Iterable[str],
    assigned: Iterable[str] | None,
) -> set[str]:
    """AdmissionChecksForWorkload: the names of the checks a workload must pass. `assigned`:
    the flavors of its admission (None: it has none yet)."""
    every = set(queue_flavors)
    out: set[str] = set()
    for check in checks:
        flavors = set(check.on_flavors) if check.on_flavors else every
        if assigned is None:
            if flavors >= every:
                out.add(check.name)
        elif flavors & set(assigned):
            out.add(check.name)
    return out


def sync_entries(entries: Sequence[Obj], wanted: set[str], now: str) -> list[Obj]:
    """syncAdmissionCheckConditions: `entries` holding exactly the `wanted` checks, sorted."""
    current = {e.get("name"): e for e in entries}
    out = [dict(e) for name, e in current.items() if name in wanted]
    for name in wanted - set(current):
        out.append({"name": name, "state": PENDING, "message": "", "lastTransitionTime": now})
    out.sort(key=lambda e: str(e.get("name", "")))
    return out


def states(entries: Sequence[Obj], state: str) -> list[Obj]:
    return [e for e in entries if e.get("state") == state]


def all_ready(entries: Sequence[Obj]) -> bool:
    """HasAllChecksReady (true for no checks at all)."""
    return all(e.get("state") == READY for e in entries)


def checks_message(entries: Sequence[Obj], state: str) -> str:
    """buildAdmissionChecksMessage: `AdmissionCheck in Retry state: "a" (why); "b"`."""
    parts = []
    for e in sorted(entries, key=lambda e: str(e.get("name", ""))):
        quoted = _go_quote(str(e.get("name", "")))
        message = e.get("message")
        parts.append(f"{quoted} ({message})" if message else quoted)
    noun = "AdmissionChecks" if len(entries) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: {'; '.join(parts)}"


def reset_on_eviction(entries: Sequence[Obj], now: str) -> list[Obj]:
    """resetChecksOnEviction: every check back to Pending; a Retry counts in retryCount."""
    out = []
    for e in entries:
        state = e.get("state")
        if state == PENDING:
            out.append(dict(e))
            continue
        new: Obj = {
            "name": e.get("name"),
            "state": PENDING,
            "message": f"Reset to Pending after eviction. Previously: {state}",
            "lastTransitionTime": now,
        }
        if isinstance(e.get("requeueAfterSeconds"), int):
            new["requeueAfterSeconds"] = e["requeueAfterSeconds"]
        if state == RETRY:
            count = e.get("retryCount")
            new["retryCount"] = (count if isinstance(count, int) else 0) + 1
        out.append(new)
    return out


def max_retry_time(entries: Sequence[Obj]) -> float | None:
    """GetMaxRetryTime: the latest lastTransitionTime + requeueAfterSeconds of a Retry check
    (None: no Retry check asks for a delay)."""
    latest: float | None = None
    for e in states(entries, RETRY):
        after = e.get("requeueAfterSeconds")
        since = parse_time(e.get("lastTransitionTime"))
        if not isinstance(after, int) or isinstance(after, bool) or since is None:
            continue
        at = since + after
        if latest is None or at > latest:
            latest = at
    return latest


def retry_backoff_s(retry_count: int, base_s: int = 60, max_s: int = 1800) -> int:
    """UpdateAdmissionCheckRequeueState: base * 2^retryCount seconds, capped (Kueue's
    provisioning controller's defaults: 60 s, 1800 s; its jitter of 0.0001 left out)."""
    wait: int = base_s * 2 ** max(0, retry_count)
    return min(wait, max_s) if max_s > 0 else wait


def parse_time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def valid_entry(entry: object) -> bool:
    """An entry a check controller may have written that the simulation can act on."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and entry.get("state") in STATES
    )


def _go_quote(text: str) -> str:
    """Go's %q for the plain names and messages checks carry."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def merge_entries(base: Sequence[Obj], ours: Sequence[Obj], theirs: Sequence[Obj]) -> list[Obj]:
    """A three-way merge of `status.admissionChecks`, keyed by name: per check, theirs (what
    the API server holds) where a check controller changed it since `base` (what the
    simulation last wrote) and the simulation did not; else ours. The checks are ours."""
    old = {e.get("name"): e for e in base}
    stored = {e.get("name"): e for e in theirs if valid_entry(e)}
    out = []
    for entry in ours:
        name = entry.get("name")
        other, was = stored.get(name), old.get(name)
        if other is not None and was is not None and other != was and entry == was:
            out.append(dict(other))
        else:
            out.append(entry)
    return out
