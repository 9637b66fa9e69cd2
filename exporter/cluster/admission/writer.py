"""The edge that answers Kueue: JSON merge patches of status subresources.

Kueue's own check controllers write their entry with server-side apply or a status update
(pkg/workload/patching `SetAdmissionCheckState`, then `ApplyAdmissionStatus`). A merge patch
replaces a list whole, so ours carries every entry as it was read, ours changed in place, and
the resourceVersion it was read at: a Workload changed since (Kueue reset the checks, another
controller answered) is refused with 409 Conflict and judged again from the fresh object next
cycle. So no other controller's entry is ever overwritten with a stale copy, and a restart that
missed its own write cannot write twice: the stale resourceVersion is refused.

`lastTransitionTime` moves only when the state changes, as SetAdmissionCheckState does it.

A Retry carries `requeueAfterSeconds`: without it Kueue requeues at once (the field's own
documentation: "If nil when State=Retry, Kueue will retry immediately"), TAS places the
workload again on the same domains while the node is still bad, and the check answers Retry
again every cycle (a simulated day at high fault rates made 25 Retries per admission). The
delay doubles with the entry's `retryCount`, which Kueue increments on each Retry, as Kueue's
own provisioning check backs off (ProvisioningRequestConfig retryStrategy: a base doubled per
attempt, capped); ours is shorter because a bad node is taken out of scheduling by remediation
within minutes, and a workload that could run elsewhere should not wait half an hour.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from exporter.cluster.admission.decide import Decision
from exporter.cluster.admission.parse import AdmissionCheckInfo, WorkloadChecks

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "topowatch-admission"
ACTIVE_MESSAGE = "The admission check is active"
_REASONS = {403: "forbidden", 404: "not_found", 409: "conflict", 422: "invalid"}
RETRY_BASE_S = 30
RETRY_MAX_S = 600


def retry_delay(retry_count: object) -> int:
    """requeueAfterSeconds for a Retry after `retry_count` earlier ones (0 when unreadable)."""
    count = retry_count if isinstance(retry_count, int) and retry_count > 0 else 0
    return RETRY_MAX_S if count >= 5 else min(RETRY_MAX_S, RETRY_BASE_S * 2**count)


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(int(at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(checks: WorkloadChecks, decision: Decision, now: float) -> dict[str, Any] | None:
    """The merge patch that sets our entry to the decision; None when the entry already says
    the same (state and message), or is gone."""
    entries: list[dict[str, Any]] = []
    found = False
    for raw in checks.raw_entries:
        entry = dict(raw)
        if entry.get("name") == decision.check:
            found = True
            if entry.get("state") == decision.state and entry.get("message") == decision.message:
                return None
            if entry.get("state") != decision.state or not entry.get("lastTransitionTime"):
                entry["lastTransitionTime"] = rfc3339(now)
            entry["state"] = decision.state
            entry["message"] = decision.message
            if decision.state == "Retry":
                entry["requeueAfterSeconds"] = retry_delay(entry.get("retryCount"))
            else:
                entry.pop("requeueAfterSeconds", None)
        entries.append(entry)
    if not found:
        return None
    return {
        "metadata": {"resourceVersion": checks.resource_version},
        "status": {"admissionChecks": entries},
    }


def active_patch(check: AdmissionCheckInfo, now: float) -> dict[str, Any] | None:
    """The merge patch that marks our AdmissionCheck Active (None when it is): Kueue's core
    never sets the condition, each check's controller does, and a ClusterQueue listing a check
    that is not Active admits nothing. Parameters we do not use are said in the message, not
    turned into Active=False: a check that stops a whole queue is what fail-open avoids."""
    if check.active:
        return None
    message = ACTIVE_MESSAGE + "".join(f"; {p}" for p in check.problems)
    condition = {
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": message[:32768],
        "lastTransitionTime": rfc3339(now),
        "observedGeneration": check.generation,
    }
    kept = [dict(c) for c in check.conditions if c.get("type") != "Active"]
    return {
        "metadata": {"resourceVersion": check.resource_version},
        "status": {"conditions": [*kept, condition]},
    }


class StatusWriter(Protocol):
    """What the controller writes through; "written", or why not (audit.WRITE_ERROR_REASONS)."""

    def write(self, checks: WorkloadChecks, patch: dict[str, Any]) -> str: ...

    def activate(self, check: AdmissionCheckInfo, patch: dict[str, Any]) -> str: ...

    def list_checks(self) -> list[dict[str, Any]] | None:
        """Every AdmissionCheck object; None when they cannot be listed."""
        ...


class KubeStatusWriter:
    """Through the official client's CustomObjectsApi, at the version the object was read at
    (the API server converts)."""

    def __init__(self, api_client: Any) -> None:
        import kubernetes

        self._api = kubernetes.client.CustomObjectsApi(api_client)

    def write(self, checks: WorkloadChecks, patch: dict[str, Any]) -> str:
        version = checks.api_version.rpartition("/")[2] or "v1beta2"
        return _call(
            f"Workload {checks.namespace}/{checks.name}",
            lambda: self._api.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                version,
                checks.namespace,
                "workloads",
                checks.name,
                patch,
                _content_type=MERGE_PATCH,
                field_manager=FIELD_MANAGER,
            ),
        )

    def activate(self, check: AdmissionCheckInfo, patch: dict[str, Any]) -> str:
        version = check.api_version.rpartition("/")[2] or "v1beta2"
        return _call(
            f"AdmissionCheck {check.name}",
            lambda: self._api.patch_cluster_custom_object_status(
                KUEUE_GROUP,
                version,
                "admissionchecks",
                check.name,
                patch,
                _content_type=MERGE_PATCH,
                field_manager=FIELD_MANAGER,
            ),
        )

    def list_checks(self) -> list[dict[str, Any]] | None:
        for version in ("v1beta2", "v1beta1"):  # storage first; older Kueue serves v1beta1
            try:
                answer = self._api.list_cluster_custom_object(
                    KUEUE_GROUP, version, "admissionchecks"
                )
            except Exception as exc:  # 404 at this version, 403, the API away
                log.debug("admission: listing AdmissionChecks at %s: %s", version, exc)
                continue
            items = answer.get("items") if isinstance(answer, dict) else None
            return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        log.warning("admission: AdmissionChecks cannot be listed; using the configured names")
        return None


def _call(what: str, call: Callable[[], object]) -> str:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        status = int(exc.status or 0)
        reason = _REASONS.get(status, "unavailable" if status >= 500 or not status else "other")
        log.warning(
            "admission: patch of %s refused (%s %s); retried next cycle", what, status, exc.reason
        )
        return reason
    except Exception as exc:  # a connection error: the API is away
        log.warning("admission: patch of %s failed: %s; retried next cycle", what, exc)
        return "unavailable"
    return "written"
