"""Recommendations as changes an admin can apply: SageMaker UpdateComputeQuota requests for
HyperPod task governance, or merge patches for Kueue ClusterQueues.

Both targets replace lists wholesale (UpdateComputeQuota takes the whole ComputeQuotaConfig; a
JSON merge patch replaces spec.resourceGroups entirely), so each change is written into a full
copy of the current configuration, never sent alone: what the advice does not touch is kept.
Advice about jobs (topology_fit, topology_mode) changes no quota and is not emitted.

HyperPod compute quota ids and versions are not in any Kueue object. They come from a
`QuotaRef` per team: read from a file (`load_quota_refs`: the JSON of `aws sagemaker
list-compute-quotas`, or a plain team -> {ComputeQuotaId, TargetVersion} map) or looked up
live with ListComputeQuotas (`refs_from_summaries`), which also brings the current config.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import yaml

from exporter.cluster.capacity.quota import kueue_quantity
from exporter.cluster.objects import GPU_RESOURCE, ClusterQueue
from exporter.cluster.quota.advisor import Recommendation, parse_quantity

if TYPE_CHECKING:
    from botocore.model import StructureShape

QUOTA_KINDS = frozenset({"nominal", "borrowing_limit", "lending_limit"})
# ComputeQuotaResourceConfig's fields for Kueue's resources, and Kueue's units per field unit:
# VCpu in cores (Kueue counts millicores), MemoryInGiB in GiB (Kueue counts bytes).
_HYPERPOD_FIELDS = {"cpu": ("VCpu", 1000), "memory": ("MemoryInGiB", 2**30)}
_UPDATE_OPERATION = "UpdateComputeQuota"


@dataclass(frozen=True, slots=True)
class QuotaRef:
    """Which HyperPod compute quota holds a team's allocation, and its current version."""

    compute_quota_id: str
    target_version: int
    config: Mapping[str, Any] | None = None  # the current ComputeQuotaConfig, when known


@dataclass(slots=True)
class Emitted:
    """Requests or patches ready to apply, and a note for each thing left out and why."""

    items: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class QuotaRefError(Exception):
    """A quota-id file that cannot be read or understood."""


# --- HyperPod ---------------------------------------------------------------------------------


@cache
def update_input_shape() -> StructureShape:
    # Loaded here, not at import: `topowatch` builds every subcommand's parser on start, and
    # botocore's session would cost each node agent memory it never uses.
    from botocore.session import get_session

    shape = (
        get_session().get_service_model("sagemaker").operation_model(_UPDATE_OPERATION).input_shape
    )
    if shape is None:  # pragma: no cover - botocore always models the input
        raise RuntimeError(f"botocore has no input shape for {_UPDATE_OPERATION}")
    return shape


def instance_types() -> frozenset[str]:
    """The instance types UpdateComputeQuota accepts (botocore does not check enums itself)."""
    from botocore.model import ListShape, Shape, StringShape, StructureShape

    shape: Shape = update_input_shape()
    for name in ("ComputeQuotaConfig", "ComputeQuotaResources", "member", "InstanceType"):
        if isinstance(shape, ListShape) and name == "member":
            shape = shape.member
        elif isinstance(shape, StructureShape) and name in shape.members:
            shape = shape.members[name]
        else:
            return frozenset()
    return frozenset(shape.enum) if isinstance(shape, StringShape) else frozenset()


def validate_update(request: Mapping[str, Any]) -> str:
    """'' when the request is valid against botocore's model, else botocore's complaint."""
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    try:
        validate_parameters(dict(request), update_input_shape())
    except ParamValidationError as exc:
        return str(exc)
    return ""


def hyperpod_requests(
    recs: Iterable[Recommendation],
    refs: Mapping[str, QuotaRef],
    queues: Mapping[str, ClusterQueue] | None = None,
) -> Emitted:
    """One UpdateComputeQuota request per team with quota advice, valid against botocore.

    The config to change is the ref's current config when known, else rebuilt from the team's
    ClusterQueue (which HyperPod generates from the compute quota); a team with neither, or no
    ref, is left out with a note."""
    out = Emitted()
    allowed = instance_types()
    by_team: dict[str, list[Recommendation]] = {}
    for rec in recs:
        if rec.kind in QUOTA_KINDS:
            by_team.setdefault(rec.team, []).append(rec)
    for team, team_recs in sorted(by_team.items()):
        ref = refs.get(team)
        if ref is None:
            out.notes.append(
                f"{team}: no HyperPod compute quota id known; pass --quota-ids (the output of "
                "`aws sagemaker list-compute-quotas`) or use --apply to look it up"
            )
            continue
        queue = (queues or {}).get(team_recs[0].cluster_queue)
        if ref.config is not None:
            config = copy.deepcopy(dict(ref.config))
        elif queue is not None:
            config = config_from_queue(queue)
        else:
            out.notes.append(
                f"{team}: current compute quota config unknown (UpdateComputeQuota replaces it "
                "whole); give the list-compute-quotas output or a dump with the ClusterQueue"
            )
            continue
        skipped = [r for r in team_recs if r.flavor not in allowed]
        for rec in skipped:
            out.notes.append(
                f"{team}: {rec.kind} for flavor {rec.flavor!r} left out: not a HyperPod "
                "instance type"
            )
        unsupported = [
            r
            for r in team_recs
            if r not in skipped
            and r.resource != GPU_RESOURCE
            and (r.kind != "nominal" or r.resource not in _HYPERPOD_FIELDS)
        ]
        for rec in unsupported:
            out.notes.append(
                f"{team}: {rec.kind} of {rec.resource} for {rec.flavor!r} left out: HyperPod's"
                " ComputeQuotaResources set accelerators, vCPU and memory (GiB) only"
            )
        skipped += unsupported
        for rec in team_recs:
            if rec not in skipped:
                _apply_to_config(config, rec)
        if len(skipped) == len(team_recs):
            continue
        request = {
            "ComputeQuotaId": ref.compute_quota_id,
            "TargetVersion": ref.target_version,
            "ComputeQuotaConfig": config,
        }
        problem = validate_update(request)
        if problem:
            out.notes.append(f"{team}: request left out, invalid for UpdateComputeQuota: {problem}")
            continue
        out.items.append(request)
    return out


def config_from_queue(queue: ClusterQueue) -> dict[str, Any]:
    """The ComputeQuotaConfig a HyperPod-generated ClusterQueue mirrors: accelerators per
    instance type, lending and borrowing as a sharing strategy plus absolute borrow limits."""
    resources = [{"InstanceType": q.flavor, "Accelerators": q.nominal} for q in queue.gpu_quotas]
    lends = not queue.gpu_quotas or any(q.lending_limit != 0 for q in queue.gpu_quotas)
    borrows = any(q.borrowing_limit != 0 for q in queue.gpu_quotas)
    sharing: dict[str, Any] = {
        "Strategy": ("LendAndBorrow" if borrows else "Lend") if lends else "DontLend"
    }
    limits = [
        {"InstanceType": q.flavor, "Accelerators": q.borrowing_limit}
        for q in queue.gpu_quotas
        if q.borrowing_limit is not None and q.borrowing_limit > 0
    ]
    if limits and sharing["Strategy"] == "LendAndBorrow":
        sharing["AbsoluteBorrowLimits"] = limits
    return {"ComputeQuotaResources": resources, "ResourceSharingConfig": sharing}


def _apply_to_config(config: dict[str, Any], rec: Recommendation) -> None:
    sharing = config.setdefault("ResourceSharingConfig", {"Strategy": "LendAndBorrow"})
    if rec.kind == "nominal" and rec.resource != GPU_RESOURCE:
        entries = config.setdefault("ComputeQuotaResources", [])
        entry = _entry_for(entries, rec.flavor)
        entry.pop("Count", None)  # whole instances would override the per-resource amounts
        field_name, scale = _HYPERPOD_FIELDS[rec.resource]
        entry[field_name] = rec.recommended / scale
    elif rec.kind == "nominal":
        entries = config.setdefault("ComputeQuotaResources", [])
        entry = _entry_for(entries, rec.flavor)
        entry.pop("Count", None)  # whole instances would override the accelerator count
        entry["Accelerators"] = rec.recommended
    elif rec.kind == "borrowing_limit":
        sharing["Strategy"] = "LendAndBorrow"  # only this strategy borrows at all
        limits = sharing.setdefault("AbsoluteBorrowLimits", [])
        _entry_for(limits, rec.flavor)["Accelerators"] = rec.recommended
    elif rec.kind == "lending_limit" and rec.recommended > 0 and sharing["Strategy"] == "DontLend":
        # HyperPod lends all idle quota or none: the nearest it has to a lending limit.
        sharing["Strategy"] = "Lend"


def _entry_for(entries: list[dict[str, Any]], instance_type: str) -> dict[str, Any]:
    for entry in entries:
        if entry.get("InstanceType") == instance_type:
            return entry
    entry = {"InstanceType": instance_type}
    entries.append(entry)
    return entry


def refs_from_summaries(
    summaries: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, QuotaRef], list[str]]:
    """Team -> ref from ListComputeQuotas' ComputeQuotaSummaries; a team with more than one
    enabled compute quota is left out (which one to change is the admin's call)."""
    found: dict[str, list[QuotaRef]] = {}
    for item in summaries:
        if not isinstance(item, Mapping) or item.get("ActivationState") == "Disabled":
            continue
        target = item.get("ComputeQuotaTarget")
        team = target.get("TeamName") if isinstance(target, Mapping) else None
        quota_id, version = item.get("ComputeQuotaId"), item.get("ComputeQuotaVersion")
        if not isinstance(team, str) or not isinstance(quota_id, str):
            continue
        if not isinstance(version, int) or isinstance(version, bool):
            continue
        config = item.get("ComputeQuotaConfig")
        found.setdefault(team, []).append(
            QuotaRef(quota_id, version, config if isinstance(config, Mapping) else None)
        )
    refs: dict[str, QuotaRef] = {}
    notes: list[str] = []
    for team, candidates in sorted(found.items()):
        if len(candidates) == 1:
            refs[team] = candidates[0]
        else:
            ids = ", ".join(c.compute_quota_id for c in candidates)
            notes.append(f"{team}: several enabled compute quotas ({ids}); none changed")
    return refs, notes


def load_quota_refs(text: str) -> tuple[dict[str, QuotaRef], list[str]]:
    """A quota-id file: `aws sagemaker list-compute-quotas` output (JSON), or YAML/JSON
    mapping team -> {ComputeQuotaId, TargetVersion}. Raises QuotaRefError when unreadable."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise QuotaRefError(f"not valid JSON or YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise QuotaRefError("expected a mapping of team to {ComputeQuotaId, TargetVersion}")
    summaries = data.get("ComputeQuotaSummaries")
    if isinstance(summaries, list):
        return refs_from_summaries(summaries)
    refs: dict[str, QuotaRef] = {}
    notes: list[str] = []
    for team, entry in data.items():
        quota_id = entry.get("ComputeQuotaId") if isinstance(entry, Mapping) else None
        version = entry.get("TargetVersion") if isinstance(entry, Mapping) else None
        if not isinstance(quota_id, str) or not isinstance(version, int):
            notes.append(f"{team}: needs ComputeQuotaId (string) and TargetVersion (integer)")
            continue
        refs[str(team)] = QuotaRef(quota_id, version)
    return refs, notes


# --- Kueue ------------------------------------------------------------------------------------


def kueue_patches(
    recs: Iterable[Recommendation], cluster_queues: Mapping[str, Mapping[str, Any]]
) -> Emitted:
    """A JSON merge patch per ClusterQueue with quota advice: its whole spec.resourceGroups
    (a merge patch replaces lists) with the advised nominalQuota / borrowingLimit /
    lendingLimit of the advised resource (nvidia.com/gpu, cpu, memory, ...) in the advised
    flavor. `cluster_queues` are the current raw
    objects by name; each item is {cluster_queue, patch, command}."""
    out = Emitted()
    by_queue: dict[str, list[Recommendation]] = {}
    for rec in recs:
        if rec.kind in QUOTA_KINDS:
            by_queue.setdefault(rec.cluster_queue, []).append(rec)
    for name, queue_recs in sorted(by_queue.items()):
        obj = cluster_queues.get(name)
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        groups = spec.get("resourceGroups") if isinstance(spec, Mapping) else None
        if not isinstance(groups, list):
            out.notes.append(f"{name}: no ClusterQueue object with spec.resourceGroups to patch")
            continue
        groups = copy.deepcopy(groups)
        for rec in queue_recs:
            resource = _resource_entry(groups, rec.flavor, rec.resource)
            if resource is None:
                out.notes.append(f"{name}: {rec.kind} left out: no {rec.resource} in {rec.flavor}")
                continue
            field_name = {
                "nominal": "nominalQuota",
                "borrowing_limit": "borrowingLimit",
                "lending_limit": "lendingLimit",
            }[rec.kind]
            value: int | str = rec.recommended
            if rec.resource != GPU_RESOURCE:  # a quantity as Kueue writes it: "96", "2Ti"
                value = kueue_quantity(rec.resource, rec.recommended)
            resource[field_name] = value
        for group in groups:
            for flavor in _list(group, "flavors"):
                for resource in _list(flavor, "resources"):
                    _keep_lending_within_nominal(resource)
        patch = {"spec": {"resourceGroups": groups}}
        command = (
            f"kubectl patch clusterqueue {name} --type=merge -p "
            f"'{json.dumps(patch, separators=(',', ':'))}'"
        )
        out.items.append({"cluster_queue": name, "patch": patch, "command": command})
    return out


def _resource_entry(groups: list[Any], flavor: str, name: str) -> dict[str, Any] | None:
    for group in groups:
        for item in _list(group, "flavors"):
            if item.get("name") != flavor:
                continue
            for resource in _list(item, "resources"):
                if resource.get("name") == name:
                    return resource
    return None


def _list(obj: Any, key: str) -> list[dict[str, Any]]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _keep_lending_within_nominal(resource: dict[str, Any]) -> None:
    """Kueue refuses a lendingLimit above nominalQuota; a cut nominal takes the limit along."""
    nominal = parse_quantity(resource.get("nominalQuota"))
    lending = parse_quantity(resource.get("lendingLimit"))
    if nominal is not None and lending is not None and lending > nominal:
        resource["lendingLimit"] = resource["nominalQuota"]
