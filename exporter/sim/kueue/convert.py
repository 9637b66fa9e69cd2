"""Conversion of Kueue objects between the v1beta1 and v1beta2 API versions.

The simulated API server stores Kueue objects in v1beta2 (Kueue's storage version since
v0.15) and serves them at either version, as Kueue's conversion webhook does; writes may
arrive at either. Only the real schema differences are converted (diffed from the CRDs):

- Workload: `status.admission.podSetAssignments[].topologyAssignment` is `{levels, domains}`
  in v1beta1 and `{levels, slices}` in v1beta2; `spec.priorityClassRef` replaces
  `priorityClassName` + `priorityClassSource`; v1beta1 spells
  `status.accumulatedPastExexcutionTimeSeconds` with an extra "x".
- ClusterQueue: `spec.cohort` became `spec.cohortName`; v1beta1's `spec.admissionChecks`
  became rules in `spec.admissionChecksStrategy`; the `Borrow` / `Preempt` fungibility
  values are gone.
- LocalQueue: `status.flavorUsage` became `status.flavorsUsage`; `status.flavors` is gone.
- AdmissionCheck: v1beta1's deprecated `spec.retryDelayMinutes` (default 15, which the API
  server fills in when serving v1beta1) is gone from v1beta2. A Workload's
  `status.admissionChecks` is the same in both versions.
- Fields one version lacks are dropped, as schema pruning would.

Conversion is tolerant: a malformed piece is left out (never an exception), so one bad
object cannot take a whole list or watch down.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

GROUP = "kueue.x-k8s.io"
STORAGE_VERSION = "v1beta2"
OLD_VERSION = "v1beta1"
VERSIONS = (STORAGE_VERSION, OLD_VERSION)

_WPC_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_POD_PC_SOURCE = "scheduling.k8s.io/priorityclass"
_REF_FOR_SOURCE = {
    _WPC_SOURCE: {"group": GROUP, "kind": "WorkloadPriorityClass"},
    _POD_PC_SOURCE: {"group": "scheduling.k8s.io", "kind": "PriorityClass"},
}
_MAX_ROOTS = 100_000  # the CRD's maxItems for roots and individual pod counts
_MAX_AFFIX = 63
_RETRY_DELAY_MINUTES = 15  # v1beta1 AdmissionCheck spec.retryDelayMinutes default
_REMOVED_FUNGIBILITY = {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"}

Obj = dict[str, Any]


def version_of(obj: Obj) -> str:
    """The version part of an object's apiVersion ("" when absent or not a string)."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        return ""
    return api_version.rpartition("/")[2]


def convert(obj: Obj, version: str) -> Obj:
    """A copy of the Kueue object `obj` at `version`; `obj` itself is never changed."""
    out = copy.deepcopy(obj)
    source = version_of(obj)
    if source != version:
        kind = obj.get("kind")
        if version == OLD_VERSION:
            _down(kind, out)
        elif version == STORAGE_VERSION and source == OLD_VERSION:
            _up(kind, out)
    out["apiVersion"] = f"{GROUP}/{version}"
    return out


def _up(kind: object, obj: Obj) -> None:
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    if kind == "Workload":
        if spec is not None:
            _priority_up(spec)
        if status is not None:
            _rename(
                status,
                "accumulatedPastExexcutionTimeSeconds",
                "accumulatedPastExecutionTimeSeconds",
            )
            for assignment in _topology_assignments(status):
                domains = assignment.pop("domains", None)
                assignment["slices"] = slices_from_domains(_domains(domains, assignment))
    elif kind == "ClusterQueue":
        if spec is not None:
            _rename(spec, "cohort", "cohortName")
            _admission_checks_up(spec)
            fungibility = _dict(spec.get("flavorFungibility"))
            for key, removed in _REMOVED_FUNGIBILITY.items():
                if fungibility is not None and fungibility.get(key) == removed:
                    fungibility[key] = "MayStopSearch"
        if status is not None:
            status.pop("pendingWorkloadsStatus", None)
            _drop_admission_fair_sharing(status)
    elif kind == "LocalQueue":
        if status is not None:
            _rename(status, "flavorUsage", "flavorsUsage")
            status.pop("flavors", None)
    elif kind == "AdmissionCheck" and spec is not None:
        spec.pop("retryDelayMinutes", None)
    elif kind == "Cohort" and status is not None:
        _drop_admission_fair_sharing(status)


def _down(kind: object, obj: Obj) -> None:
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    if kind == "Workload":
        if spec is not None:
            _priority_down(spec)
            spec.pop("preemptionGates", None)
            for pod_set in _dicts(spec.get("podSets")):
                request = _dict(pod_set.get("topologyRequest"))
                if request is not None:
                    request.pop("podsetSliceRequiredTopologyConstraints", None)
        if status is not None:
            _rename(
                status,
                "accumulatedPastExecutionTimeSeconds",
                "accumulatedPastExexcutionTimeSeconds",
            )
            status.pop("preemptionGates", None)
            for assignment in _topology_assignments(status):
                slices = assignment.pop("slices", None)
                assignment["domains"] = [
                    {"values": list(values), "count": count}
                    for values, count in domains_from_slices(slices)
                ]
    elif kind == "ClusterQueue":
        if spec is not None:
            _rename(spec, "cohortName", "cohort")
            spec.pop("concurrentAdmissionPolicy", None)
    elif kind == "LocalQueue" and status is not None:
        _rename(status, "flavorsUsage", "flavorUsage")
    elif kind == "AdmissionCheck" and spec is not None:
        spec.setdefault("retryDelayMinutes", _RETRY_DELAY_MINUTES)


def domains_from_slices(slices: object) -> Iterator[tuple[tuple[str, ...], int]]:
    """Expand v1beta2 `slices` into (values per level, pod count) per domain, in order."""
    for raw in slices if isinstance(slices, list) else ():
        if not isinstance(raw, dict):
            continue
        count = raw.get("domainCount")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            continue
        pods = _pod_counts(raw.get("podCounts"), count)
        levels = [_level_values(level, count) for level in _list(raw.get("valuesPerLevel"))]
        if pods is None or not levels or any(values is None for values in levels):
            continue
        columns = [values for values in levels if values is not None]
        for index in range(count):
            yield tuple(values[index] for values in columns), pods[index]


def slices_from_domains(domains: list[tuple[tuple[str, ...], int]]) -> list[Obj]:
    """The compact v1beta2 form of domains: common prefixes/suffixes and universal values."""
    return [
        _slice(domains[start : start + _MAX_ROOTS]) for start in range(0, len(domains), _MAX_ROOTS)
    ]


def _slice(domains: list[tuple[tuple[str, ...], int]]) -> Obj:
    counts = [count for _, count in domains]
    width = len(domains[0][0])
    levels = [_compact_values([values[i] for values, _ in domains]) for i in range(width)]
    pod_counts: Obj = {"universal": counts[0]} if len(set(counts)) == 1 else {"individual": counts}
    return {"domainCount": len(domains), "valuesPerLevel": levels, "podCounts": pod_counts}


def _compact_values(values: list[str]) -> Obj:
    if len(set(values)) == 1:
        return {"universal": values[0]}
    prefix = _common_prefix(values)[:_MAX_AFFIX]
    rest = [value[len(prefix) :] for value in values]
    suffix = _common_prefix([value[::-1] for value in rest])[::-1][:_MAX_AFFIX]
    if suffix:
        rest = [value[: len(value) - len(suffix)] for value in rest]
    individual: Obj = {}
    if prefix:
        individual["prefix"] = prefix
    individual["roots"] = rest
    if suffix:
        individual["suffix"] = suffix
    return {"individual": individual}


def _common_prefix(values: list[str]) -> str:
    first, last = min(values), max(values)  # the extremes bound every common prefix
    size = 0
    while size < len(first) and first[size] == last[size]:
        size += 1
    return first[:size]


def _pod_counts(raw: object, count: int) -> list[int] | None:
    if not isinstance(raw, dict):
        return None
    universal = raw.get("universal")
    if isinstance(universal, int) and not isinstance(universal, bool):
        return [universal] * count
    individual = raw.get("individual")
    if isinstance(individual, list) and len(individual) == count and all(map(_is_int, individual)):
        return individual
    return None


def _level_values(raw: object, count: int) -> list[str] | None:
    if not isinstance(raw, dict):
        return None
    universal = raw.get("universal")
    if isinstance(universal, str):
        return [universal] * count
    individual = raw.get("individual")
    if not isinstance(individual, dict):
        return None
    prefix = individual.get("prefix") or ""
    suffix = individual.get("suffix") or ""
    roots = individual.get("roots")
    if (
        not isinstance(prefix, str)
        or not isinstance(suffix, str)
        or not isinstance(roots, list)
        or len(roots) != count
        or not all(isinstance(root, str) for root in roots)
    ):
        return None
    return [prefix + root + suffix for root in roots]


def _domains(raw: object, assignment: Obj) -> list[tuple[tuple[str, ...], int]]:
    width = len(_list(assignment.get("levels")))
    domains: list[tuple[tuple[str, ...], int]] = []
    for domain in _dicts(raw):
        values = domain.get("values")
        count = domain.get("count")
        if (
            isinstance(values, list)
            and len(values) == width
            and all(isinstance(v, str) for v in values)
            and isinstance(count, int)
            and not isinstance(count, bool)
        ):
            domains.append((tuple(values), count))
    return domains


def _topology_assignments(status: Obj) -> Iterator[Obj]:
    admission = _dict(status.get("admission"))
    if admission is None:
        return
    for assignment in _dicts(admission.get("podSetAssignments")):
        topology = _dict(assignment.get("topologyAssignment"))
        if topology is not None:
            yield topology


def _priority_up(spec: Obj) -> None:
    name = spec.pop("priorityClassName", None)
    source = spec.pop("priorityClassSource", None)
    ref = _REF_FOR_SOURCE.get(source) if isinstance(source, str) else None
    if isinstance(name, str) and name and ref is not None:
        spec["priorityClassRef"] = {**ref, "name": name}


def _priority_down(spec: Obj) -> None:
    ref = _dict(spec.pop("priorityClassRef", None))
    if ref is None:
        return
    for source, expected in _REF_FOR_SOURCE.items():
        if ref.get("group") == expected["group"] and ref.get("kind") == expected["kind"]:
            spec["priorityClassSource"] = source
            spec["priorityClassName"] = ref.get("name", "")


def _admission_checks_up(spec: Obj) -> None:
    checks = spec.pop("admissionChecks", None)
    names = [name for name in _list(checks) if isinstance(name, str) and name]
    if names and "admissionChecksStrategy" not in spec:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": n} for n in names]}


def _drop_admission_fair_sharing(status: Obj) -> None:
    fair_sharing = _dict(status.get("fairSharing"))
    if fair_sharing is not None:
        fair_sharing.pop("admissionFairSharingStatus", None)


def _rename(obj: Obj, old: str, new: str) -> None:
    if old in obj:
        obj[new] = obj.pop(old)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dict(value: object) -> Obj | None:
    return value if isinstance(value, dict) else None


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: object) -> Iterator[Obj]:
    return (item for item in _list(value) if isinstance(item, dict))
