"""Parse Kueue objects (v1beta1 and v1beta2) and Kueue's preemption messages.

Kueue has changed both its API and its words over time: the topology assignment moved from a
flat list of domains (v1beta1) to compressed slices (v1beta2), the priority class from a name
to a reference, the cohort from `cohort` to `cohortName`, and the preemption message grew the
preemptor's UID, then its job UID, then the queue paths. Everything here reads every form and
produces the same `objects` types, so the model never asks which version it is looking at.

Nothing here raises on bad input (except `decode_topology_assignment` and `parse_quantity`,
which say so): a malformed field becomes a problem note and a default.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from exporter.cluster.objects import (
    GPU_RESOURCE,
    ClusterQueue,
    Cohort,
    Condition,
    DomainAssignment,
    FlavorQuota,
    KueueTopology,
    LocalQueue,
    PodSetPlacement,
    PodSetRequest,
    PreemptionNote,
    PriorityClass,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    TopologyMode,
    TopologyRequest,
    Workload,
)
from exporter.cluster.parse.core import (
    JOB_UID_LABEL,
    MILLI_RESOURCES,
    QUEUE_NAME_LABEL,
    controlling_owner,
    flag,
    gpu_count,
    integer,
    items,
    mapping,
    node_selector,
    object_parts,
    parse_quantity,
    parse_time,
    pod_spec_requests,
    quota_amount,
    report,
    required_affinity,
    resource_tuple,
    string_map,
    taints,
    text,
    tolerations,
    type_name,
)

log = logging.getLogger(__name__)

__all__ = [
    "KUEUE_GROUP",
    "MILLI_RESOURCES",
    "PREEMPTED_REASONS",
    "decode_topology_assignment",
    "parse_cluster_queue",
    "parse_cohort",
    "parse_local_queue",
    "parse_preemption_message",
    "parse_priority_class",
    "parse_quantity",
    "parse_resource_flavor",
    "parse_topology",
    "parse_workload",
    "quota_amount",
    "reason_for_cause",
    "resource_quotas",
    "topology_request",
]

KUEUE_GROUP: Final = "kueue.x-k8s.io"

# Reasons of the Workload's `Preempted` condition. ConfigurablePreemption arrived (alpha) in
# Kueue v0.20 with the PreemptionConfig API; the other four since v0.8.
PREEMPTED_REASONS: Final = (
    "InClusterQueue",
    "InCohortReclamation",
    "InCohortFairSharing",
    "InCohortReclaimWhileBorrowing",
    "ConfigurablePreemption",
)

DEFAULT_POD_SET: Final = "main"  # the name Kueue defaults a pod set to

REQUIRED_ANNOTATION: Final = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_ANNOTATION: Final = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED_ANNOTATION: Final = "kueue.x-k8s.io/podset-unconstrained-topology"
SLICE_TOPOLOGY_ANNOTATION: Final = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE_ANNOTATION: Final = "kueue.x-k8s.io/podset-slice-size"

# An assignment that expands past this many domains is refused rather than materialized: the
# v1beta2 form can describe billions of domains in a few bytes (universal values and counts).
MAX_DOMAINS: Final = 1_000_000


# --- preemption messages -----------------------------------------------------------------

# The phrase after "due to", lower-cased, to the Preempted condition's reason. Kueue's own map is
# HumanReadablePreemptionReasons in pkg/scheduler/preemption/preemption.go; v0.8-v0.10 wrote
# "fair sharing", later releases "Fair Sharing". The two "in the ..." origins are v0.7's, when
# the reason was only InClusterQueue or InCohort (the latter is reported as reclamation).
_CAUSE_REASONS: Final[Mapping[str, str]] = {
    "prioritization in the clusterqueue": "InClusterQueue",
    "reclamation within the cohort": "InCohortReclamation",
    "fair sharing within the cohort": "InCohortFairSharing",
    "reclamation within the cohort while borrowing": "InCohortReclaimWhileBorrowing",
    "the configured preemption rules": "ConfigurablePreemption",
    "in the clusterqueue": "InClusterQueue",
    "in the cohort": "InCohortReclamation",
}

_UNKNOWN: Final = "UNKNOWN"  # what Kueue (v0.11+) writes for a missing UID, JobUID or path

# v0.8+: "Preempted to accommodate a workload (UID: U[, JobUID: J]) due to C[; preemptor path:
# P; preemptee path: Q]"; v0.7: "... (UID: U) in the ClusterQueue|cohort".
_WITH_UID = re.compile(
    r"Preempted to accommodate a workload \(UID: (?P<uid>[^,()]*)"
    r"(?:, JobUID: (?P<job>[^()]*))?\) (?P<rest>.*)",
    re.DOTALL,
)
# v0.3-v0.6: the condition said no more than this, and the Event named only the origin.
_LEGACY_CONDITION = "Preempted to accommodate a higher priority Workload"
_LEGACY_EVENT = re.compile(r"Preempted by another workload in the (?P<origin>ClusterQueue|cohort)")


def reason_for_cause(cause: str) -> str:
    """The Preempted reason (one of PREEMPTED_REASONS) a message's cause phrase stands for.

    "Unknown" for an empty, "UNKNOWN" or unrecognised phrase.
    """
    return _CAUSE_REASONS.get(" ".join(cause.split()).lower(), "Unknown")


def _path(value: str) -> tuple[str, ...]:
    value = value.strip()
    if not value or value == _UNKNOWN:
        return ()
    return tuple(part for part in value.split("/") if part)


def _known(value: str | None) -> str:
    value = (value or "").strip()
    return "" if value == _UNKNOWN else value


def parse_preemption_message(message: str) -> PreemptionNote | None:
    """What a Kueue preemption message (Preempted/Evicted condition or Event) says.

    Reads every format Kueue has written, v0.3 to v0.20; `format` names the family:
    "v0.4" (no UID), "v0.7" (UID, origin), "v0.10" (UID, cause), "v0.11" (+JobUID),
    "v0.15" (+queue paths). Trailing segments that later releases add to the Event (effective
    priorities, with priority boost) are ignored. Returns None for any other text: the caller
    counts those.
    """
    if not isinstance(message, str):
        return None
    flat = " ".join(message.split())
    match = _WITH_UID.match(flat)
    if match is None:
        return _legacy_note(flat)
    uid = _known(match["uid"])
    job_uid = _known(match["job"])
    rest = match["rest"]
    if rest.startswith("in the "):
        origin = rest.removesuffix(".")
        if origin not in ("in the ClusterQueue", "in the cohort"):
            return None
        return PreemptionNote(uid, "", (), (), origin, "v0.7")
    if rest != "due to" and not rest.startswith("due to "):
        return None
    segments = rest[len("due to") :].split(";")
    cause = segments[0].strip()
    preemptor: tuple[str, ...] = ()
    preemptee: tuple[str, ...] = ()
    has_paths = False
    for segment in segments[1:]:
        label, _, value = segment.strip().partition(":")
        if label == "preemptor path":
            preemptor, has_paths = _path(value), True
        elif label == "preemptee path":
            preemptee, has_paths = _path(value), True
    if has_paths:
        family = "v0.15"
    elif match["job"] is not None:
        family = "v0.11"
    else:
        family = "v0.10"
    return PreemptionNote(uid, job_uid, preemptor, preemptee, cause, family)


def _legacy_note(flat: str) -> PreemptionNote | None:
    if flat.removesuffix(".") == _LEGACY_CONDITION:
        return PreemptionNote("", "", (), (), "", "v0.4")
    event = _LEGACY_EVENT.fullmatch(flat.removesuffix("."))
    if event is not None:
        return PreemptionNote("", "", (), (), f"in the {event['origin']}", "v0.4")
    return None


# --- topology ----------------------------------------------------------------------------


def _levels(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"topologyAssignment.levels must be a non-empty list, got {value!r:.60}")
    for level in value:
        if not isinstance(level, str) or not level:
            raise ValueError(f"topologyAssignment.levels holds {level!r:.60}, not a label key")
    return tuple(value)


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r:.60}")
    return value


def _decode_domains(raw: object, levels: tuple[str, ...]) -> tuple[DomainAssignment, ...]:
    """The v1beta1 form: one entry per domain, values highest level first."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"topologyAssignment.domains must be a list, got {type_name(raw)}")
    if len(raw) > MAX_DOMAINS:
        raise ValueError(f"topologyAssignment has {len(raw)} domains, more than {MAX_DOMAINS}")
    domains = []
    for i, domain in enumerate(raw):
        if not isinstance(domain, Mapping):
            raise ValueError(f"domains[{i}] must be an object, got {type_name(domain)}")
        values = domain.get("values")
        if (
            not isinstance(values, list | tuple)
            or len(values) != len(levels)
            or not all(isinstance(v, str) for v in values)
        ):
            raise ValueError(
                f"domains[{i}].values must be {len(levels)} string(s), one per level,"
                f" got {values!r:.80}"
            )
        count = _positive(domain.get("count"), f"domains[{i}].count")
        domains.append(DomainAssignment(tuple(values), count))
    return tuple(domains)


def _slice_column(entry: object, n: int, where: str) -> Sequence[str]:
    """One level's values in one slice: `n` times a universal value, or prefix+root+suffix."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object, got {type_name(entry)}")
    universal = entry.get("universal")
    individual = entry.get("individual")
    if (universal is None) == (individual is None):
        raise ValueError(f"{where} must set exactly one of universal, individual")
    if universal is not None:
        if not isinstance(universal, str):
            raise ValueError(f"{where}.universal must be a string, got {type_name(universal)}")
        return [universal] * n
    if not isinstance(individual, Mapping):
        raise ValueError(f"{where}.individual must be an object, got {type_name(individual)}")
    prefix = individual.get("prefix") or ""
    suffix = individual.get("suffix") or ""
    roots = individual.get("roots")
    if not isinstance(prefix, str) or not isinstance(suffix, str):
        raise ValueError(f"{where}.individual prefix and suffix must be strings")
    if not isinstance(roots, list | tuple) or len(roots) != n:
        raise ValueError(f"{where}.individual.roots must be a list of domainCount ({n}) strings")
    if not all(isinstance(root, str) for root in roots):
        raise ValueError(f"{where}.individual.roots must hold only strings")
    if not prefix and not suffix:
        return roots
    return [prefix + root + suffix for root in roots]


def _slice_counts(raw: object, n: int, where: str) -> Sequence[int]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object, got {type_name(raw)}")
    universal = raw.get("universal")
    individual = raw.get("individual")
    if (universal is None) == (individual is None):
        raise ValueError(f"{where} must set exactly one of universal, individual")
    if universal is not None:
        return [_positive(universal, f"{where}.universal")] * n
    if not isinstance(individual, list | tuple) or len(individual) != n:
        raise ValueError(f"{where}.individual must be a list of domainCount ({n}) counts")
    for count in individual:
        _positive(count, f"{where}.individual[]")
    return individual


def _decode_slices(raw: object, levels: tuple[str, ...]) -> tuple[DomainAssignment, ...]:
    """The v1beta2 form: per slice, the values arranged by level, then by domain."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"topologyAssignment.slices must be a list, got {type_name(raw)}")
    domains: list[DomainAssignment] = []
    for s, piece in enumerate(raw):
        where = f"slices[{s}]"
        if not isinstance(piece, Mapping):
            raise ValueError(f"{where} must be an object, got {type_name(piece)}")
        n = _positive(piece.get("domainCount"), f"{where}.domainCount")
        if len(domains) + n > MAX_DOMAINS:
            raise ValueError(f"topologyAssignment expands to more than {MAX_DOMAINS} domains")
        per_level = piece.get("valuesPerLevel")
        if not isinstance(per_level, list | tuple) or len(per_level) != len(levels):
            raise ValueError(
                f"{where}.valuesPerLevel must have one entry per level ({len(levels)})"
            )
        columns = [
            _slice_column(entry, n, f"{where}.valuesPerLevel[{i}]")
            for i, entry in enumerate(per_level)
        ]
        counts = _slice_counts(piece.get("podCounts"), n, f"{where}.podCounts")
        domains.extend(
            DomainAssignment(values, count)
            for values, count in zip(zip(*columns, strict=True), counts, strict=True)
        )
    return tuple(domains)


def decode_topology_assignment(
    ta: Mapping[str, Any],
) -> tuple[tuple[str, ...], tuple[DomainAssignment, ...]]:
    """(levels, domains) of a podSetAssignment's topologyAssignment, in either API form.

    v1beta1 lists domains; v1beta2 compresses them into slices (universal or prefix/roots/
    suffix values per level, universal or individual pod counts). Runs in time linear in the
    number of domains. Raises ValueError saying what is wrong when the input is malformed.
    """
    if not isinstance(ta, Mapping):
        raise ValueError(f"topologyAssignment must be an object, got {type_name(ta)}")
    levels = _levels(ta.get("levels"))
    if ta.get("slices") is not None:
        return levels, _decode_slices(ta["slices"], levels)
    if ta.get("domains") is not None:
        return levels, _decode_domains(ta["domains"], levels)
    raise ValueError("topologyAssignment has neither domains (v1beta1) nor slices (v1beta2)")


def _slice_size(value: object, where: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        size = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        problems.append(f"{where}: slice size {value!r:.40} is not a whole number (ignored)")
        return None
    if size < 1:
        problems.append(f"{where}: slice size {size} must be at least 1 (ignored)")
        return None
    return size


def topology_request(
    pod_set: Mapping[str, Any], problems: list[str] | None = None
) -> TopologyRequest:
    """What a pod set asked of the topology.

    Read from spec.podSets[].topologyRequest (Kueue fills it from the annotations) or, when it
    names no mode, from the pod template's kueue.x-k8s.io/podset-* annotations. A malformed
    slice size is noted in `problems` and ignored.
    """
    notes: list[str] = []
    request = _topology_request(pod_set, notes)
    if problems is not None:
        problems.extend(notes)
    elif notes:
        log.warning("malformed pod set topology request: %s", "; ".join(notes))
    return request


def _topology_request(pod_set: object, notes: list[str]) -> TopologyRequest:
    # Each field type-tested in line, the checked helper only for one that fails (as in
    # `parse_workload`, which this serves for every Workload event).
    body = pod_set if type(pod_set) is dict else mapping(pod_set, "podSet", notes)
    get = body.get
    request = (
        v if type(v := get("topologyRequest")) is dict else mapping(v, "topologyRequest", notes)
    )
    template = v if type(v := get("template")) is dict else mapping(v, "template", notes)
    template_meta = (
        v if type(v := template.get("metadata")) is dict else mapping(v, "template.metadata", notes)
    )
    annotations = string_map(
        template_meta.get("annotations"), "template.metadata.annotations", notes
    )

    get = request.get
    required = (
        v if type(v := get("required")) is str else text(v, "topologyRequest.required", notes)
    )
    preferred = (
        v if type(v := get("preferred")) is str else text(v, "topologyRequest.preferred", notes)
    )
    unconstrained = (
        v
        if (v := get("unconstrained")) is True or v is False
        else flag(v, "topologyRequest.unconstrained", notes, False)
    )
    slice_level = (
        v
        if type(v := get("podSetSliceRequiredTopology")) is str
        else text(v, "topologyRequest.podSetSliceRequiredTopology", notes)
    )
    slice_size = (
        None
        if (v := get("podSetSliceSize")) is None
        else _slice_size(v, "topologyRequest.podSetSliceSize", notes)
    )
    if not slice_level:  # the alpha multi-layer form: keep the outermost layer
        layers = items(
            request.get("podsetSliceRequiredTopologyConstraints"), "topologyRequest", notes
        )
        if layers and isinstance(layers[0], Mapping):
            slice_level = text(layers[0].get("topology"), "topologyRequest.layers", notes)
            slice_size = _slice_size(layers[0].get("size"), "topologyRequest.layers", notes)

    if not (required or preferred or unconstrained):
        required = annotations.get(REQUIRED_ANNOTATION, "")
        preferred = annotations.get(PREFERRED_ANNOTATION, "")
        unconstrained = annotations.get(UNCONSTRAINED_ANNOTATION, "").lower() == "true"
    if not slice_level:
        slice_level = annotations.get(SLICE_TOPOLOGY_ANNOTATION, "")
        slice_size = _slice_size(
            annotations.get(SLICE_SIZE_ANNOTATION), SLICE_SIZE_ANNOTATION, notes
        )

    mode: TopologyMode = "none"
    level: str | None = None
    if required:
        mode, level = "required", required
        if preferred:
            notes.append("both required and preferred topology set; using required")
    elif preferred:
        mode, level = "preferred", preferred
    elif unconstrained:
        mode = "unconstrained"
    if slice_level and slice_size is None:
        notes.append(f"slice topology {slice_level!r} has no valid slice size (slice ignored)")
        slice_level = ""
    return TopologyRequest(
        mode=mode,
        level=level,
        slice_level=slice_level or None,
        slice_size=slice_size if slice_level else None,
    )


# --- Workload ----------------------------------------------------------------------------


def _conditions(raw: object, problems: list[str]) -> tuple[Condition, ...]:
    result = []
    conditions = raw if type(raw) is list else items(raw, "status.conditions", problems)
    for i, cond in enumerate(conditions):
        fields = cond if type(cond) is dict else mapping(cond, f"status.conditions[{i}]", problems)
        if not fields:
            continue
        get = fields.get
        where = "status.conditions[%d].%s"  # spelled out only for a note
        result.append(
            Condition(
                v if type(v := get("type")) is str else text(v, where % (i, "type"), problems),
                v if type(v := get("status")) is str else text(v, where % (i, "status"), problems),
                v if type(v := get("reason")) is str else text(v, where % (i, "reason"), problems),
                v
                if type(v := get("message")) is str
                else text(v, where % (i, "message"), problems),
                None if (v := get("lastTransitionTime")) is None else parse_time(v),
            )
        )
    return tuple(result)


def _pod_sets(raw: object, problems: list[str]) -> tuple[PodSetRequest, ...]:
    result = []
    for i, pod_set in enumerate(raw if type(raw) is list else items(raw, "spec.podSets", problems)):
        where = f"spec.podSets[{i}]"
        fields = pod_set if type(pod_set) is dict else mapping(pod_set, where, problems)
        template = (
            v
            if type(v := fields.get("template")) is dict
            else mapping(v, where + ".template", problems)
        )
        at = where + ".template.spec"
        spec = v if type(v := template.get("spec")) is dict else mapping(v, at, problems)
        topology_notes: list[str] = []
        request = _topology_request(fields, topology_notes)
        if topology_notes:
            problems.extend(f"{where}: {note}" for note in topology_notes)
        per_pod = pod_spec_requests(spec, at, problems)
        gpus = 0
        for name, amount in per_pod:
            if name == GPU_RESOURCE:
                gpus = amount
        result.append(
            PodSetRequest(
                name=v
                if type(v := fields.get("name")) is str
                else text(v, where + ".name", problems, DEFAULT_POD_SET),
                count=v
                if type(v := fields.get("count")) is int
                else integer(v, where + ".count", problems, 1),
                gpus_per_pod=gpus,
                topology=request,
                requests=per_pod,
                # Absent in most pod sets: no parser call for what is not there.
                tolerations=()
                if spec.get("tolerations") is None
                else tolerations(spec.get("tolerations"), at + ".tolerations", problems),
                node_selector=()
                if spec.get("nodeSelector") is None
                else node_selector(spec.get("nodeSelector"), at + ".nodeSelector", problems),
                affinity=()
                if spec.get("affinity") is None
                else required_affinity(spec.get("affinity"), at + ".affinity", problems),
            )
        )
    return tuple(result)


def _placements(
    raw: object, pod_sets: tuple[PodSetRequest, ...], problems: list[str]
) -> tuple[PodSetPlacement, ...]:
    spec_counts = {p.name: p.count for p in pod_sets}
    result = []
    path = "status.admission.podSetAssignments"
    for i, assignment in enumerate(raw if type(raw) is list else items(raw, path, problems)):
        where = f"{path}[{i}]"
        fields = assignment if type(assignment) is dict else mapping(assignment, where, problems)
        name = (
            v
            if type(v := fields.get("name")) is str
            else text(v, where + ".name", problems, DEFAULT_POD_SET)
        )
        flavors = string_map(fields.get("flavors"), where + ".flavors", problems)
        levels: tuple[str, ...] = ()
        domains: tuple[DomainAssignment, ...] = ()
        ta = fields.get("topologyAssignment")
        if ta is not None:
            try:
                levels, domains = decode_topology_assignment(ta)
            except ValueError as exc:
                problems.append(f"{where}.topologyAssignment: {exc}")
        raw_count = fields.get("count")
        usage = resource_tuple(fields.get("resourceUsage"), where + ".resourceUsage", problems)
        result.append(
            PodSetPlacement(
                name=name,
                # Workloads admitted before `count` existed take the spec's count.
                count=spec_counts.get(name, 0)
                if raw_count is None
                else integer(raw_count, where + ".count", problems),
                flavors=tuple(sorted(flavors.items())),
                levels=levels,
                domains=domains,
                usage=usage,  # sorted
            )
        )
    return tuple(result)


def _priority_class(spec: Mapping[str, Any], problems: list[str]) -> str:
    ref = spec.get("priorityClassRef")  # v1beta2: {group, kind, name}
    if ref is not None:
        return text(
            mapping(ref, "spec.priorityClassRef", problems).get("name"),
            "spec.priorityClassRef.name",
            problems,
        )
    return text(spec.get("priorityClassName"), "spec.priorityClassName", problems)  # v1beta1


KNOWN_WORKLOAD_VERSIONS = frozenset({f"{KUEUE_GROUP}/v1beta1", f"{KUEUE_GROUP}/v1beta2"})


# Kueue's workload slices (pkg/controller/jobframework/reconciler.go `prepareWorkloadSlice`,
# apis/kueue/v1beta2 constants): the per-job opt-in, the origin slice's name, and the key
# ("ns/name") of the slice a new one replaces.
ELASTIC_JOB_ANNOTATION: Final = "kueue.x-k8s.io/elastic-job"
SLICE_NAME_ANNOTATION: Final = "kueue.x-k8s.io/workload-slice-name"
SLICE_REPLACEMENT_ANNOTATION: Final = "kueue.x-k8s.io/workload-slice-replacement-for"


def parse_workload(obj: Mapping[str, Any]) -> Workload:
    """A Workload of either served version; malformed fields land in `problems`."""
    problems: list[str] = []
    try:
        # Each field type-tested in line and the checked helper (which writes the note) called
        # only for one that fails: the same Workload and notes, for every Workload event.
        body, meta = object_parts(obj, problems)
        get = meta.get
        spec = v if type(v := body.get("spec")) is dict else mapping(v, "spec", problems)
        status = v if type(v := body.get("status")) is dict else mapping(v, "status", problems)
        admission = (
            v
            if type(v := status.get("admission")) is dict
            else mapping(v, "status.admission", problems)
        )
        labels = string_map(get("labels"), "metadata.labels", problems)
        annotations = string_map(get("annotations"), "metadata.annotations", problems)
        name = v if type(v := get("name")) is str else text(v, "metadata.name", problems)
        namespace = (
            v if type(v := get("namespace")) is str else text(v, "metadata.namespace", problems)
        )
        if meta and not (name and namespace):
            problems.append("metadata.name or metadata.namespace missing")
        owner, owner_uid = controlling_owner(meta, problems)
        api_version = (
            v if type(v := body.get("apiVersion")) is str else text(v, "apiVersion", problems)
        )
        if api_version and api_version not in KNOWN_WORKLOAD_VERSIONS:
            problems.append(f"unknown Kueue API version {api_version!r}: read as v1beta2")
        pod_sets = _pod_sets(spec.get("podSets"), problems)
        requeue = status.get("requeueState")
        if requeue is not None and type(requeue) is not dict:
            requeue = mapping(requeue, "status.requeueState", problems)
        return Workload(
            namespace=namespace,
            name=name,
            uid=v if type(v := get("uid")) is str else text(v, "metadata.uid", problems),
            api_version=api_version,
            created=parse_time(get("creationTimestamp")),
            queue_name=(
                v
                if type(v := spec.get("queueName")) is str
                else text(v, "spec.queueName", problems)
            )
            or labels.get(QUEUE_NAME_LABEL, ""),
            priority_class=_priority_class(spec, problems),
            priority=v
            if type(v := spec.get("priority")) is int
            else integer(v, "spec.priority", problems),
            job_uid=labels.get(JOB_UID_LABEL, ""),
            owner=owner,
            owner_uid=owner_uid,
            active=v
            if (v := spec.get("active")) is True or v is False
            else flag(v, "spec.active", problems, True),
            pod_sets=pod_sets,
            cluster_queue=v
            if type(v := admission.get("clusterQueue")) is str
            else text(v, "status.admission.clusterQueue", problems),
            placements=()
            if (v := admission.get("podSetAssignments")) is None
            else _placements(v, pod_sets, problems),
            conditions=_conditions(status.get("conditions"), problems),
            requeue_count=0
            if requeue is None
            else v
            if type(v := requeue.get("count")) is int
            else integer(v, "status.requeueState.count", problems),
            problems=tuple(problems),
            elastic=annotations.get(ELASTIC_JOB_ANNOTATION) == "true",
            slice_name=annotations.get(SLICE_NAME_ANNOTATION, ""),
            replacement_for=annotations.get(SLICE_REPLACEMENT_ANNOTATION, ""),
        )
    except Exception as exc:  # a parser bug must not take the informer down
        problems.append(f"unexpected {type(exc).__name__}: {exc}")
        return Workload(
            "", "", "", "", None, "", "", 0, "", "", "", True, (), "", (), (), 0, tuple(problems)
        )


# --- queues, flavors, topologies, priority classes ---------------------------------------


def _optional_gpus(value: object, where: str, problems: list[str]) -> int | None:
    return None if value is None else gpu_count(value, where, problems)


def _gpu_quotas(spec: Mapping[str, Any], problems: list[str]) -> tuple[FlavorQuota, ...]:
    quotas = []
    for g, group in enumerate(items(spec.get("resourceGroups"), "spec.resourceGroups", problems)):
        group_fields = mapping(group, f"spec.resourceGroups[{g}]", problems)
        flavors = items(group_fields.get("flavors"), f"spec.resourceGroups[{g}].flavors", problems)
        for f, flavor in enumerate(flavors):
            where = f"spec.resourceGroups[{g}].flavors[{f}]"
            fields = mapping(flavor, where, problems)
            for resource in items(fields.get("resources"), where + ".resources", problems):
                quota = mapping(resource, where + ".resources[]", problems)
                if quota.get("name") != GPU_RESOURCE:
                    continue
                quotas.append(
                    FlavorQuota(
                        flavor=text(fields.get("name"), where + ".name", problems),
                        nominal=gpu_count(
                            quota.get("nominalQuota"), where + ".nominalQuota", problems
                        ),
                        borrowing_limit=_optional_gpus(
                            quota.get("borrowingLimit"), where + ".borrowingLimit", problems
                        ),
                        lending_limit=_optional_gpus(
                            quota.get("lendingLimit"), where + ".lendingLimit", problems
                        ),
                    )
                )
    return tuple(quotas)


def _gpu_usage(raw: object, path: str, problems: list[str]) -> tuple[int, int]:
    """(total, borrowed) GPUs over a flavorsUsage / flavorsReservation list."""
    total = borrowed = 0
    for f, flavor in enumerate(items(raw, path, problems)):
        where = f"{path}[{f}]"
        fields = mapping(flavor, where, problems)
        for resource in items(fields.get("resources"), where + ".resources", problems):
            usage = mapping(resource, where + ".resources[]", problems)
            if usage.get("name") == GPU_RESOURCE:
                total += gpu_count(usage.get("total"), where + ".total", problems)
                borrowed += gpu_count(usage.get("borrowed"), where + ".borrowed", problems)
    return total, borrowed


def _preemption_policy(raw: object, problems: list[str]) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for key, value in mapping(raw, "spec.preemption", problems).items():
        if isinstance(value, Mapping):  # borrowWithinCohort: {policy, maxPriorityThreshold}
            pairs.extend((f"{key}.{sub}", str(inner)) for sub, inner in value.items())
        elif value is not None:
            pairs.append((str(key), str(value)))
    return tuple(sorted(pairs))


def _fair_share_weight(raw: object, notes: list[str]) -> float:
    """spec.fairSharing.weight, a quantity ("2", 2, "500m"); 1 when absent or unreadable."""
    sharing = mapping(raw, "spec.fairSharing", notes)
    weight = sharing.get("weight")
    if weight is None:
        return 1.0
    try:
        value = parse_quantity(weight)
    except (TypeError, ValueError):
        notes.append(f"spec.fairSharing.weight {weight!r} is not a quantity; using 1")
        return 1.0
    return value if value >= 0 else 1.0


def _quota_field(
    resource: str, raw: Mapping[str, Any], key: str, where: str
) -> tuple[int | None, str, str]:
    """(amount or None when unset, cause, problem) of one quota field."""
    value = raw.get(key)
    if value is None:
        if key == "nominalQuota":
            return 0, "bad_quantity", f"{where}.{key} missing"
        return None, "", ""
    try:
        amount = quota_amount(resource, value)
    except ValueError as exc:
        return 0, "bad_quantity", f"{where}.{key}: {exc}"
    if amount < 0:
        return amount, "negative_quantity", f"{where}.{key}: {value!r:.40} is negative"
    return amount, "", ""


def resource_quotas(
    spec: Mapping[str, Any],
) -> tuple[tuple[ResourceQuota, ...], tuple[str, ...]]:
    """Every (flavor, resource) quota of spec.resourceGroups (ClusterQueue or Cohort).

    Returns (quotas, structural problems). A field that cannot be read stays on its entry
    (`cause`, `problem`); a flavor or resource entry without a name, or a list that is not a
    list, is a structural problem: which quotas the object has is then not known.
    Kueue reads the same fields in createResourceQuotas (pkg/cache/scheduler/resource.go).
    """
    structure: list[str] = []
    quotas: list[ResourceQuota] = []
    groups = items(spec.get("resourceGroups"), "spec.resourceGroups", structure)
    for g, group in enumerate(groups):
        group_fields = mapping(group, f"spec.resourceGroups[{g}]", structure)
        flavors = items(group_fields.get("flavors"), f"spec.resourceGroups[{g}].flavors", structure)
        for f, flavor in enumerate(flavors):
            where = f"spec.resourceGroups[{g}].flavors[{f}]"
            before = len(structure)
            fields = mapping(flavor, where, structure)
            flavor_name = text(fields.get("name"), where + ".name", structure)
            if not flavor_name:
                if len(structure) == before:
                    structure.append(f"{where}.name missing")
                continue
            resources = items(fields.get("resources"), where + ".resources", structure)
            for r, resource in enumerate(resources):
                at = f"{where}.resources[{r}]"
                before = len(structure)
                quota = mapping(resource, at, structure)
                name = text(quota.get("name"), at + ".name", structure)
                if not name:
                    if len(structure) == before:
                        structure.append(f"{at}.name missing")
                    continue
                nominal, cause, problem = _quota_field(name, quota, "nominalQuota", at)
                borrowing, b_cause, b_problem = _quota_field(name, quota, "borrowingLimit", at)
                lending, l_cause, l_problem = _quota_field(name, quota, "lendingLimit", at)
                causes = [c for c in (cause, b_cause, l_cause) if c]
                notes = [p for p in (problem, b_problem, l_problem) if p]
                quotas.append(
                    ResourceQuota(
                        flavor=flavor_name,
                        resource=name,
                        nominal=nominal or 0,
                        borrowing_limit=borrowing,
                        lending_limit=lending,
                        cause=causes[0] if causes else "",
                        problem="; ".join(notes),
                    )
                )
    return tuple(quotas), tuple(structure)


def resource_groups(spec: Mapping[str, Any]) -> tuple[ResourceGroup, ...]:
    """spec.resourceGroups as Kueue's flavor assigner reads them: per group the resources it
    covers (coveredResources, else the resources its flavors name) and its flavors in order
    (pkg/cache/scheduler/clusterqueue.go, resourcegroups). Unreadable entries are left out:
    `resource_quotas` reports them."""
    ignored: list[str] = []
    out: list[ResourceGroup] = []
    for group in items(spec.get("resourceGroups"), "spec.resourceGroups", ignored):
        fields = mapping(group, "resourceGroups[]", ignored)
        covered = [
            r for r in items(fields.get("coveredResources"), "covered", ignored) if type(r) is str
        ]
        flavors: list[str] = []
        for flavor in items(fields.get("flavors"), "flavors", ignored):
            flavor_fields = mapping(flavor, "flavors[]", ignored)
            name = text(flavor_fields.get("name"), "name", ignored)
            if not name:
                continue
            flavors.append(name)
            if not fields.get("coveredResources"):
                for resource in items(flavor_fields.get("resources"), "resources", ignored):
                    res = text(mapping(resource, "r", ignored).get("name"), "name", ignored)
                    if res and res not in covered:
                        covered.append(res)
        out.append(ResourceGroup(tuple(covered), tuple(flavors)))
    return tuple(out)


def _fungibility(raw: object, notes: list[str]) -> tuple[str, str]:
    """spec.flavorFungibility (whenCanBorrow, whenCanPreempt), "" where unset."""
    fields = mapping(raw, "spec.flavorFungibility", notes)
    return (
        text(fields.get("whenCanBorrow"), "spec.flavorFungibility.whenCanBorrow", notes),
        text(fields.get("whenCanPreempt"), "spec.flavorFungibility.whenCanPreempt", notes),
    )


def _reservation(raw: object) -> tuple[tuple[str, str, int], ...]:
    """status.flavorsReservation as (flavor, resource, total); unreadable entries are left out."""
    ignored: list[str] = []  # the GPU totals are already noted by _gpu_usage
    result: list[tuple[str, str, int]] = []
    for f, flavor in enumerate(items(raw, "status.flavorsReservation", ignored)):
        fields = mapping(flavor, f"status.flavorsReservation[{f}]", ignored)
        flavor_name = text(fields.get("name"), "name", ignored)
        for resource in items(fields.get("resources"), "resources", ignored):
            usage = mapping(resource, "resources[]", ignored)
            name = text(usage.get("name"), "name", ignored)
            if not (flavor_name and name):
                continue
            try:
                total = quota_amount(name, usage.get("total", 0))
            except ValueError:
                continue
            result.append((flavor_name, name, total))
    return tuple(result)


def parse_cluster_queue(obj: Mapping[str, Any], problems: list[str] | None = None) -> ClusterQueue:
    """A ClusterQueue's quotas per flavor and resource, usage, workload counts and preemption.

    `gpu_quotas`, `used`, `reserved` and `borrowed` count GPUs; `quotas` and `reservation` hold
    every resource in Kueue's units (see `resource_quotas`, `quota_amount`).
    """
    notes: list[str] = []
    try:
        body, meta = object_parts(obj, notes)
        spec = mapping(body.get("spec"), "spec", notes)
        status = mapping(body.get("status"), "status", notes)
        cohort = spec.get("cohortName", spec.get("cohort"))  # v1beta2 renamed the field
        used, borrowed = _gpu_usage(status.get("flavorsUsage"), "status.flavorsUsage", notes)
        reserved, _ = _gpu_usage(
            status.get("flavorsReservation"), "status.flavorsReservation", notes
        )
        # Read again for every resource, with its own notes: the GPU entries' are noted above.
        quotas, quota_problems = resource_quotas(spec)
        queue = ClusterQueue(
            name=text(meta.get("name"), "metadata.name", notes),
            cohort=text(cohort, "spec.cohortName", notes),
            gpu_quotas=_gpu_quotas(spec, notes),
            used=used,
            reserved=reserved,
            borrowed=borrowed,
            pending_workloads=integer(status.get("pendingWorkloads"), "status.pending", notes),
            admitted_workloads=integer(status.get("admittedWorkloads"), "status.admitted", notes),
            preemption=_preemption_policy(spec.get("preemption"), notes),
            fair_share_weight=_fair_share_weight(spec.get("fairSharing"), notes),
            quotas=quotas,
            quota_problems=quota_problems,
            reservation=_reservation(status.get("flavorsReservation")),
            resource_groups=resource_groups(spec),
            flavor_fungibility=_fungibility(spec.get("flavorFungibility"), notes),
        )
    except Exception as exc:  # a parser bug must not take the informer down
        notes.append(f"unexpected {type(exc).__name__}: {exc}")
        queue = ClusterQueue("", "", (), 0, 0, 0, 0, 0, ())
    report("ClusterQueue", obj, notes, problems)
    return queue


def parse_cohort(obj: Mapping[str, Any], problems: list[str] | None = None) -> Cohort:
    """A Cohort (v1beta1 or v1beta2): its parent and the quota it adds to its cohort tree.

    Both versions spell the parent spec.parentName (the KEP's first draft said `parent`, which
    is read too). Quotas are read as a ClusterQueue's (`resource_quotas`).
    """
    notes: list[str] = []
    try:
        body, meta = object_parts(obj, notes)
        spec = mapping(body.get("spec"), "spec", notes)
        quotas, quota_problems = resource_quotas(spec)
        cohort = Cohort(
            name=text(meta.get("name"), "metadata.name", notes),
            parent=text(spec.get("parentName", spec.get("parent")), "spec.parentName", notes),
            quotas=quotas,
            quota_problems=quota_problems,
            fair_share_weight=_fair_share_weight(spec.get("fairSharing"), notes),
        )
    except Exception as exc:  # a parser bug must not take the informer down
        notes.append(f"unexpected {type(exc).__name__}: {exc}")
        cohort = Cohort("", "")
    notes.extend(f"{c.problem}" for c in cohort.quotas if c.problem)
    notes.extend(cohort.quota_problems)
    report("Cohort", obj, notes, problems)
    return cohort


def parse_local_queue(obj: Mapping[str, Any], problems: list[str] | None = None) -> LocalQueue:
    """A LocalQueue and the ClusterQueue it feeds."""
    notes: list[str] = []
    body, meta = object_parts(obj, notes)
    spec = mapping(body.get("spec"), "spec", notes)
    queue = LocalQueue(
        namespace=text(meta.get("namespace"), "metadata.namespace", notes),
        name=text(meta.get("name"), "metadata.name", notes),
        cluster_queue=text(spec.get("clusterQueue"), "spec.clusterQueue", notes),
    )
    report("LocalQueue", obj, notes, problems)
    return queue


def parse_resource_flavor(
    obj: Mapping[str, Any], problems: list[str] | None = None
) -> ResourceFlavor:
    """A ResourceFlavor: the node labels that select its nodes, the taints those nodes carry,
    the tolerations Kueue adds to pods it admits on it, and its TAS topology."""
    notes: list[str] = []
    body, meta = object_parts(obj, notes)
    spec = mapping(body.get("spec"), "spec", notes)
    flavor = ResourceFlavor(
        name=text(meta.get("name"), "metadata.name", notes),
        node_labels=tuple(
            sorted(string_map(spec.get("nodeLabels"), "spec.nodeLabels", notes).items())
        ),
        topology_name=text(spec.get("topologyName"), "spec.topologyName", notes),
        node_taints=taints(spec.get("nodeTaints"), "spec.nodeTaints", notes),
        tolerations=tolerations(spec.get("tolerations"), "spec.tolerations", notes),
    )
    report("ResourceFlavor", obj, notes, problems)
    return flavor


def parse_topology(obj: Mapping[str, Any], problems: list[str] | None = None) -> KueueTopology:
    """A Topology: its levels' node label keys, highest level first."""
    notes: list[str] = []
    body, meta = object_parts(obj, notes)
    spec = mapping(body.get("spec"), "spec", notes)
    levels = []
    for i, level in enumerate(items(spec.get("levels"), "spec.levels", notes)):
        key = text(mapping(level, f"spec.levels[{i}]", notes).get("nodeLabel"), "spec", notes)
        if key:
            levels.append(key)
        else:
            notes.append(f"spec.levels[{i}].nodeLabel missing")
    topology = KueueTopology(
        name=text(meta.get("name"), "metadata.name", notes), levels=tuple(levels)
    )
    report("Topology", obj, notes, problems)
    return topology


def parse_priority_class(
    obj: Mapping[str, Any], problems: list[str] | None = None
) -> PriorityClass:
    """A WorkloadPriorityClass or a scheduling.k8s.io PriorityClass (both keep `value` on top)."""
    notes: list[str] = []
    body, meta = object_parts(obj, notes)
    priority = PriorityClass(
        name=text(meta.get("name"), "metadata.name", notes),
        value=integer(body.get("value"), "value", notes),
    )
    report("PriorityClass", obj, notes, problems)
    return priority
