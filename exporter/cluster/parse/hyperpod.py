"""HyperPodPyTorchJob (sagemaker.amazonaws.com/v1), the HyperPod training operator's job kind.

The operator is closed source; its CRD's fields are known from the SageMaker HyperPod CLI's
pydantic mirror (`hyperpod_pytorch_job_unified_config.py`) and AWS's elastic-training page
(reference/hyperpod/elastic-training-and-deep-health.md, 1.1 to 1.3). Only what topowatch
needs is read: the elastic bounds, the replica specs, and the operator's scaling status.

Two kinds of trouble are told apart. A malformed field (a string where an integer belongs) is
a note: the rest of the job is read. A job whose elastic size cannot be judged (minReplicas
above maxReplicas, a step and a discrete list both set, a scaling status naming replica specs
the job does not have) is a problem: views show "unknown: <why>" for that job alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from exporter.cluster.objects import ElasticJob, ReplicaSpec
from exporter.cluster.parse.core import (
    QUEUE_NAME_LABEL,
    flag,
    integer,
    items,
    mapping,
    object_parts,
    parse_time,
    pod_spec_gpus,
    report,
    string_map,
    text,
)

GROUP: Final = "sagemaker.amazonaws.com"
KIND: Final = "HyperPodPyTorchJob"
PLURAL: Final = "hyperpodpytorchjobs"


@dataclass(frozen=True, slots=True)
class AdmissionEvidence:
    """What a Workload's status keeps of admissions it no longer holds, for elastic jobs'
    scale events (a preempted scale-up Workload lingers until its owner deletes it):

    - `admitted_s`: `status.accumulatedPastExecutionTimeSeconds` (v1beta1 spells it
      `accumulatedPastExexcutionTimeSeconds`): Kueue adds the seconds since the Admitted
      condition's lastTransitionTime every time Admitted goes True -> False
      (pkg/workload/admissionchecks.go `SyncAdmittedCondition`), so it is set only on a Workload
      that was admitted, and with one admission the admission began that many seconds before
      the Admitted=False transition;
    - `evictions`: the sum of `status.schedulingStats.evictions[].count` (Kueue v0.14+), the
      number of admit/evict cycles when present; None when the field is absent.
    """

    admitted_s: int | None
    evictions: int | None


def admission_evidence(obj: Mapping[str, Any]) -> AdmissionEvidence | None:
    """The Workload's admission evidence, None when it carries none (never raises)."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    if not isinstance(status, Mapping):
        return None
    admitted = status.get("accumulatedPastExecutionTimeSeconds")
    if admitted is None:
        admitted = status.get("accumulatedPastExexcutionTimeSeconds")
    seconds = admitted if isinstance(admitted, int) and not isinstance(admitted, bool) else None
    evictions: int | None = None
    stats = status.get("schedulingStats")
    entries = stats.get("evictions") if isinstance(stats, Mapping) else None
    if isinstance(entries, list):
        counts = [e.get("count") for e in entries if isinstance(e, Mapping)]
        evictions = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
    if seconds is None and evictions is None:
        return None
    return AdmissionEvidence(seconds if seconds is None or seconds >= 0 else None, evictions)


def _optional_int(raw: Mapping[str, Any], key: str, path: str, notes: list[str]) -> int | None:
    value = raw.get(key)
    return None if value is None else integer(value, f"{path}.{key}", notes)


def _replica_specs(raw: object, notes: list[str]) -> tuple[ReplicaSpec, ...]:
    out: list[ReplicaSpec] = []
    for i, entry in enumerate(items(raw, "spec.replicaSpecs", notes)):
        path = f"spec.replicaSpecs[{i}]"
        spec = mapping(entry, path, notes)
        template = mapping(spec.get("template"), path + ".template", notes)
        pod_spec = mapping(template.get("spec"), path + ".template.spec", notes)
        out.append(
            ReplicaSpec(
                name=text(spec.get("name"), path + ".name", notes),
                replicas=integer(spec.get("replicas"), path + ".replicas", notes),
                max_replicas=_optional_int(spec, "maxReplicas", path, notes),
                gpus_per_replica=pod_spec_gpus(pod_spec, path + ".template.spec", notes),
            )
        )
    return tuple(out)


def _targets(raw: object, notes: list[str]) -> tuple[tuple[str, int], ...]:
    path = "status.elasticScalingStatus.targetReplicas"
    return tuple(
        sorted(
            (name, integer(v, f"{path}.{name}", notes))
            for name, v in mapping(raw, path, notes).items()
        )
    )


def _bound_problems(
    low: int | None,
    high: int | None,
    step: int | None,
    discrete: tuple[int, ...],
    specs: tuple[ReplicaSpec, ...],
    targets: tuple[tuple[str, int], ...],
) -> list[str]:
    """What makes the job's elastic size unknowable, in the words an admin would fix it by."""
    problems: list[str] = []
    if low is not None and high is not None and low > high:
        problems.append(f"minReplicas {low} > maxReplicas {high}")
    if low is not None and low < 0:
        problems.append(f"minReplicas {low} is negative")
    if step is not None and discrete:
        problems.append("replicaIncrementStep and replicaDiscreteValues are both set")
    if step is not None and step <= 0:
        problems.append(f"replicaIncrementStep {step} is not positive")
    names = {s.name for s in specs}
    unknown = sorted(name for name, _ in targets if name not in names)
    if unknown:
        problems.append(
            f"elasticScalingStatus.targetReplicas names replica specs {', '.join(unknown)}"
            f" the job does not have ({', '.join(sorted(names)) or 'none'})"
        )
    if any(n < 0 for _, n in targets):
        problems.append("elasticScalingStatus.targetReplicas has a negative count")
    return problems


def parse_hyperpod_job(obj: Mapping[str, Any], problems: list[str] | None = None) -> ElasticJob:
    """A HyperPodPyTorchJob; malformed fields are noted, contradictions make it unknown."""
    notes: list[str] = []
    try:
        body, meta = object_parts(obj, notes)
        spec = mapping(body.get("spec"), "spec", notes)
        status = mapping(body.get("status"), "status", notes)
        labels = string_map(meta.get("labels"), "metadata.labels", notes)
        policy_raw = spec.get("elasticPolicy")
        policy = mapping(policy_raw, "spec.elasticPolicy", notes)
        path = "spec.elasticPolicy"
        low = _optional_int(policy, "minReplicas", path, notes)
        high = _optional_int(policy, "maxReplicas", path, notes)
        step = _optional_int(policy, "replicaIncrementStep", path, notes)
        discrete = tuple(
            sorted(
                integer(v, f"{path}.replicaDiscreteValues[]", notes)
                for v in items(policy.get("replicaDiscreteValues"), path, notes)
            )
        )
        run_policy = mapping(spec.get("runPolicy"), "spec.runPolicy", notes)
        restart = mapping(run_policy.get("restartPolicy"), "spec.runPolicy.restartPolicy", notes)
        scaling = mapping(status.get("elasticScalingStatus"), "status.elasticScalingStatus", notes)
        specs = _replica_specs(spec.get("replicaSpecs"), notes)
        targets = _targets(scaling.get("targetReplicas"), notes)
        job = ElasticJob(
            namespace=text(meta.get("namespace"), "metadata.namespace", notes),
            name=text(meta.get("name"), "metadata.name", notes),
            uid=text(meta.get("uid"), "metadata.uid", notes),
            created=parse_time(meta.get("creationTimestamp")),
            generation=integer(meta.get("generation"), "metadata.generation", notes),
            queue_name=labels.get(QUEUE_NAME_LABEL, ""),
            elastic=isinstance(policy_raw, Mapping),
            min_replicas=low,
            max_replicas=high,
            increment_step=step,
            discrete_values=discrete,
            scaling_timeout_s=_optional_int(policy, "scalingTimeoutInSeconds", path, notes),
            snooze_s=_optional_int(
                restart, "scaleUpSnoozeTimeInSeconds", "spec.runPolicy.restartPolicy", notes
            ),
            replica_specs=specs,
            target_replicas=targets,
            last_scaling=parse_time(scaling.get("lastScalingTime")),
            last_restart=parse_time(scaling.get("lastRestartTime")),
            faulty_scale_down=flag(
                scaling.get("isFaultyPodScaleDown"), "isFaultyPodScaleDown", notes, False
            ),
            consecutive_failures=integer(
                scaling.get("consecutiveScalingFailures"), "consecutiveScalingFailures", notes
            ),
            problems=tuple(_bound_problems(low, high, step, discrete, specs, targets)),
            notes=tuple(notes),
        )
    except Exception as exc:  # a parser bug must not take the informer down
        why = f"unexpected {type(exc).__name__}: {exc}"
        notes.append(why)
        job = ElasticJob(
            "", "", "", None, 0, "", False, None, None, None, (), None, None, (), (), None,
            None, False, 0, (why,), tuple(notes),
        )  # fmt: skip
    report(KIND, obj, notes, problems)
    return job
