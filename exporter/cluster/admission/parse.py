"""Raw API objects in, the plain facts the admission check needs out; never raises.

Kueue serves AdmissionCheck, ClusterQueue and Workload at v1beta1 and v1beta2 (v1beta2 is
storage since v0.15). What the check reads is the same in both but for the ClusterQueue's list
of checks: v1beta1 has `spec.admissionChecks` (names, every flavor) beside
`spec.admissionChecksStrategy`, v1beta2 only the strategy (apis/kueue/v1beta2
clusterqueue_types.go). The Workload's admission (flavors, counts, the TAS assignment in
`domains` or `slices` form) is read by `exporter.cluster.parse.kueue`, as the model reads it;
only `status.admissionChecks` is read here. Malformed input becomes a problem string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.cluster.parse.core import parse_time
from exporter.core.findings import FINDINGS_ANNOTATION, Finding, decode_findings

# apis/kueue/v1beta2 workload_types.go CheckState
STATES = ("Pending", "Ready", "Retry", "Rejected")
# The CRD caps status.admissionChecks at 8 entries and a message at 32768 characters.
MAX_MESSAGE = 32768


@dataclass(frozen=True, slots=True)
class AdmissionCheckInfo:
    """An AdmissionCheck object: whose it is, and whether its parameters can be used.

    A check controller defines its own parameters kind, which `spec.parameters` {apiGroup,
    kind, name} names (apis/kueue/v1beta2 admissioncheck_types.go); ours defines none, so a
    check that names any is judged with the configured settings and the parameters are
    reported as a problem, never a reason to stop answering."""

    name: str
    controller_name: str
    problems: tuple[str, ...] = ()
    # Its `Active` condition is True: Kueue's core never sets it, the check's controller does
    # (provisioning admissioncheck_reconciler.go), and a ClusterQueue listing a check that is
    # not Active admits nothing (pkg/cache/scheduler clusterqueue.go inactiveReason).
    active: bool = False
    generation: int = 0
    api_version: str = ""
    resource_version: str = ""
    conditions: tuple[Mapping[str, Any], ...] = ()  # status.conditions as read


@dataclass(frozen=True, slots=True)
class CheckEntry:
    """One `status.admissionChecks[]` entry (apis/kueue/v1beta2 AdmissionCheckState)."""

    name: str
    state: str  # Pending | Ready | Retry | Rejected; "" when unreadable
    message: str
    last_transition: float | None


@dataclass(frozen=True, slots=True)
class WorkloadChecks:
    """A Workload's check entries, and what a status patch must carry to replace them: the
    raw entries as read (other controllers' entries go back unchanged) and the resourceVersion
    (the patch's precondition: a Workload changed since is refused with 409)."""

    namespace: str
    name: str
    uid: str
    api_version: str
    resource_version: str
    entries: tuple[CheckEntry, ...]
    raw_entries: tuple[Mapping[str, Any], ...]
    problems: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def entry(self, name: str) -> CheckEntry | None:
        for entry in self.entries:
            if entry.name == name:
                return entry
        return None


# A ClusterQueue's checks: name -> the flavors it applies to (None: every flavor).
CheckStrategy = Mapping[str, frozenset[str] | None]


def _name(obj: object) -> str | None:
    """A cluster-scoped object's metadata.name; None when it is not an object or has none."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else None


def parse_admission_check(obj: object) -> AdmissionCheckInfo | None:
    """An AdmissionCheck of either version; None when it has no name at all."""
    name = _name(obj)
    if name is None:
        return None
    assert isinstance(obj, Mapping)
    meta = obj["metadata"]
    spec = obj.get("spec")
    problems: list[str] = []
    controller = ""
    if isinstance(spec, Mapping):
        raw = spec.get("controllerName")
        if isinstance(raw, str):
            controller = raw
        else:
            problems.append(f"AdmissionCheck {name}: spec.controllerName is not a string")
        params = spec.get("parameters")
        if params is not None:
            problems.append(f"AdmissionCheck {name}: {_parameters_problem(params)}")
    else:
        problems.append(f"AdmissionCheck {name}: no spec")
    status = obj.get("status")
    raw_conditions = status.get("conditions") if isinstance(status, Mapping) else None
    conditions = tuple(
        c
        for c in (raw_conditions if isinstance(raw_conditions, list) else ())
        if isinstance(c, Mapping)
    )
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    api_version = obj.get("apiVersion")
    return AdmissionCheckInfo(
        name,
        controller,
        tuple(problems),
        active=any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions),
        generation=generation if isinstance(generation, int) else 0,
        api_version=api_version if isinstance(api_version, str) else "",
        resource_version=str(meta.get("resourceVersion") or "")
        if isinstance(meta, Mapping)
        else "",
        conditions=conditions,
    )


def _parameters_problem(params: object) -> str:
    """Why `spec.parameters` is not used: this controller defines no parameters kind."""
    if not isinstance(params, Mapping):
        return f"spec.parameters is not an object ({type(params).__name__}); ignored"
    missing = [k for k in ("apiGroup", "kind", "name") if not isinstance(params.get(k), str)]
    if missing:
        return f"spec.parameters lacks {', '.join(missing)}; ignored"
    ref = f"{params['apiGroup']}/{params['kind']} {params['name']}"
    return f"spec.parameters names {ref}, but topowatch.io/node-health takes none; ignored"


def parse_check_entries(
    raw: object, problems: list[str]
) -> tuple[tuple[CheckEntry, ...], tuple[Mapping[str, Any], ...]]:
    """`status.admissionChecks`: the entries, and the raw ones that a patch sends back."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        problems.append(f"status.admissionChecks is not a list ({type(raw).__name__})")
        return (), ()
    entries: list[CheckEntry] = []
    kept: list[Mapping[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            problems.append(f"status.admissionChecks[{i}] has no name; kept as it is")
            if isinstance(item, Mapping):
                kept.append(item)
            continue
        state = item.get("state")
        if state not in STATES:
            problems.append(f"status.admissionChecks[{i}] ({item['name']}): state {state!r}")
            state = ""
        message = item.get("message")
        entries.append(
            CheckEntry(
                item["name"],
                str(state),
                message if isinstance(message, str) else "",
                parse_time(item.get("lastTransitionTime")),
            )
        )
        kept.append(item)
    return tuple(entries), tuple(kept)


def parse_workload_checks(obj: object) -> WorkloadChecks | None:
    """The check entries of a Workload of either version; None without namespace and name."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not name:
        return None
    status = obj.get("status")
    problems: list[str] = []
    entries: tuple[CheckEntry, ...] = ()
    raw: tuple[Mapping[str, Any], ...] = ()
    if isinstance(status, Mapping):
        entries, raw = parse_check_entries(status.get("admissionChecks"), problems)
    api_version = obj.get("apiVersion")
    return WorkloadChecks(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        api_version=api_version if isinstance(api_version, str) else "",
        resource_version=str(meta.get("resourceVersion") or ""),
        entries=entries,
        raw_entries=raw,
        problems=tuple(problems),
    )


def parse_check_strategy(obj: object, problems: list[str]) -> tuple[str, CheckStrategy] | None:
    """(ClusterQueue name, its checks): `spec.admissionChecksStrategy.admissionChecks[]`
    {name, onFlavors} (an empty onFlavors: every flavor, pkg/util/admissioncheck
    NewAdmissionChecks) and v1beta1's plain `spec.admissionChecks` names (every flavor)."""
    name = _name(obj)
    if name is None:
        return None
    assert isinstance(obj, Mapping)
    spec = obj.get("spec")
    checks: dict[str, frozenset[str] | None] = {}
    if not isinstance(spec, Mapping):
        return name, checks
    for check in _list(spec.get("admissionChecks"), f"ClusterQueue {name}", problems):
        if isinstance(check, str) and check:
            checks[check] = None
    strategy = spec.get("admissionChecksStrategy")
    if isinstance(strategy, Mapping):
        rules = _list(strategy.get("admissionChecks"), f"ClusterQueue {name}", problems)
        for i, rule in enumerate(rules):
            if not isinstance(rule, Mapping) or not isinstance(rule.get("name"), str):
                problems.append(f"ClusterQueue {name}: admissionChecksStrategy[{i}] has no name")
                continue
            flavors = [f for f in rule.get("onFlavors") or () if isinstance(f, str)]
            checks[rule["name"]] = frozenset(flavors) if flavors else None
    return name, checks


def _list(value: object, where: str, problems: list[str]) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"{where}: expected a list, got {type(value).__name__}")
        return ()
    return value


def parse_node_findings(obj: object) -> tuple[str, tuple[Finding, ...], tuple[str, ...]]:
    """(node name, its node agent's actionable findings, problems) from the Node's
    `topowatch.io/findings` annotation: findings damping has confirmed (`actionable`) that ask
    for an action; a finding still being watched holds no one off."""
    if not isinstance(obj, Mapping):
        return "", (), ()
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "", (), ()
    name = meta.get("name")
    annotations = meta.get("annotations")
    text = annotations.get(FINDINGS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str):
        return str(name or ""), (), ()
    findings, problems = decode_findings(text)
    kept = tuple(f for f in findings if f.actionable and f.action != "none")
    return str(name or ""), kept, tuple(f"Node {name}: {p}" for p in problems)
