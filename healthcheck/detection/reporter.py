"""Tell Kubernetes what the node's health checks found: a Node condition, an annotation with the
actionable findings, and an Event when the verdict changes.

The annotation also carries the findings other nodes' findings are judged with
(`SHARED_CHECKS`): rising EFA remote-error counters are a warning with no action on one node
(a dead peer raises them on every healthy node talking to it), and the cluster service reads
them off many nodes to name the peer they share (exporter/cluster/efa_remotes.py). They never
turn the condition False and never post an Event; the controller acts only on actionable ones.

This is the I/O edge of the node side. It writes on change, not on every poll (2,000 nodes
polling every 5 s must not mean 400 writes a second), plus a refresh every `refresh_seconds`
so a condition overwritten by someone else heals. Order matters to the controller reading it:
`TopowatchHealthy=False` is never seen without the findings that explain it, so a node turning
bad gets the annotation first, then the condition, and a node healing the condition first
(a node rebooted by remediation heals this way on its fresh agent's first report).

The condition is written through the status subresource with a JSON merge patch carrying the
full conditions list and the Node's resourceVersion: a merge patch replaces lists, so the
kubelet's conditions are read and written back, and the resourceVersion makes a concurrent
kubelet update a 409 to retry rather than a lost write.

Both writes carry the field manager `topowatch-node-agent` (`exporter/core/provenance.py`): the
API server records it in the Node's managedFields as the owner of the annotation, and the
controller acts only on findings that manager owns. The server moves ownership only when a
write changes a value, so an identical annotation written earlier by someone else (an agent of
an older version, `kubectl annotate`) stays theirs: when the patched Node says so, the reporter
removes the annotation and writes it again
(`topowatch_health_report_writes_total{kind="annotation_reclaimed"}`).

All API calls happen on the reporter's own thread (`start`/`submit`): a slow or absent API
server delays the report, never the poll loop or a scrape. Failures are counted by reason.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from exporter.core.findings import (
    FINDINGS_ANNOTATION,
    HEALTH_CONDITION,
    Finding,
    findings_to_json,
    format_time,
    worst_first,
)
from exporter.core.provenance import AGENT_FIELD_MANAGER, owners
from exporter.core.ultraserver import FABRIC_ANNOTATION
from exporter.sources.kubeapi import ApiError, KubeApi
from healthcheck.detection.monitor import HealthMonitor, HealthReport

log = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"  # where the kubelet records Node events too
COMPONENT = "topowatch-node"
REFRESH_SECONDS = 300.0
MAX_MESSAGE_CHARS = 1024
FIELD_MANAGER = f"?fieldManager={AGENT_FIELD_MANAGER}"  # on every write to the Node

Signature = tuple[tuple[str, str, str, str], ...]
HEALTHY: Signature = ()


# Warnings published for the cluster service to correlate across nodes, actionable or not.
SHARED_CHECKS = frozenset({"efa_remote_errors"})


def signature(report: HealthReport) -> Signature:
    """What a change is: the set of actionable findings, without their changing evidence."""
    return _signature(report.actionable)


def published(report: HealthReport) -> tuple[Finding, ...]:
    """What the annotation carries: the actionable findings and the shared warnings."""
    return tuple(f for f in report.findings if f.actionable or f.check in SHARED_CHECKS)


def fabric_value(report: HealthReport) -> str | None:
    """The `topowatch.io/nvlink-fabric` annotation's value (exporter/core/ultraserver.py):
    the GPUs' fabric summary the cluster judges the node's UltraServer with; None removes it
    (no GPU with a fabric). Written with the findings, in the same patch."""
    return report.fabric.to_json() if report.fabric is not None else None


def _signature(findings: Iterable[Finding]) -> Signature:
    return tuple(sorted((f.check, f.component, f.severity, f.action) for f in findings))


def condition_reason(findings: Iterable[Finding]) -> str:
    """CamelCase of the worst finding's check (`rootfs_read_only` -> `RootfsReadOnly`)."""
    ordered = worst_first(findings)
    if not ordered:
        return "NoActionableFindings"
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", ordered[0].check))


def condition_message(findings: Iterable[Finding]) -> str:
    """The actionable findings, worst first, bounded."""
    ordered = worst_first(findings)
    if not ordered:
        return "topowatch health checks found nothing to act on"
    text = "; ".join(f"{f.component} {f.check} ({f.action}): {f.evidence}" for f in ordered)
    return text[:MAX_MESSAGE_CHARS]


class NodeReporter:
    """Writes one node's health to the API server. `report` is synchronous (tests, `--once`);
    `start` + `submit` run it on a background thread that always reports the latest verdict."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        monitor: HealthMonitor | None = None,
        *,
        clock: Callable[[], float] = time.time,
        refresh_seconds: float = REFRESH_SECONDS,
        timeout: float = 5.0,
    ) -> None:
        self.api = api
        self.node = node
        self.monitor = monitor
        self._clock = clock
        self._refresh = refresh_seconds
        self._timeout = timeout
        self._written: Signature | None = None  # last verdict fully written
        self._fabric_written: str | None = None  # and the fabric summary written with it
        self._written_at = 0.0
        self._evented: Signature = HEALTHY  # last verdict announced by an Event
        self._last_error: str | None = None
        self._uid = ""  # the Node's uid, for the Event's involvedObject
        self._pending: HealthReport | None = None
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # --- synchronous ------------------------------------------------------------------------

    def report(self, report: HealthReport) -> bool:
        """Write `report` if it changed or a refresh is due. True when the API server has it."""
        now = self._clock()
        current = signature(report)
        written = _signature(published(report))
        fabric = fabric_value(report)
        if (
            written == self._written
            and fabric == self._fabric_written
            and now - self._written_at < self._refresh
        ):
            return True
        try:
            if report.actionable:  # the findings first: False never comes without them
                self._write_annotation(report)
                self._write_condition(report, now)
            else:  # healing: True first, then the findings go
                self._write_condition(report, now)
                self._write_annotation(report)
            if current != self._evented:
                self._post_event(report, now)
                self._evented = current
        except ApiError as e:
            return self._failed(e.reason, e.message)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # a malformed Node
            return self._failed("bad_response", f"{type(e).__name__}: {e}")
        self._written, self._written_at = written, now
        self._fabric_written = fabric
        if self._last_error is not None:
            log.info("reporting node health to the API server works again")
            self._last_error = None
        return True

    # --- background -------------------------------------------------------------------------

    def start(self) -> NodeReporter:
        self._thread = threading.Thread(target=self._run, name="topowatch-report", daemon=True)
        self._thread.start()
        return self

    def submit(self, report: HealthReport | None) -> None:
        """Hand over the latest verdict; never blocks. Older unsent verdicts are superseded."""
        if report is None:
            return
        with self._wake:
            self._pending = report
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout * 4)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._stop:
                    self._wake.wait()
                report, self._pending = self._pending, None
                if self._stop or report is None:
                    return
            try:
                self.report(report)
            except Exception:  # a bug here must not end reporting for good
                log.exception("health reporter failed")

    # --- the three writes -------------------------------------------------------------------

    def _node_path(self) -> str:
        return f"/api/v1/nodes/{quote(self.node, safe='')}"

    def _write_annotation(self, report: HealthReport) -> None:
        value = findings_to_json(published(report))
        path = self._node_path() + FIELD_MANAGER
        annotations = {FINDINGS_ANNOTATION: value, FABRIC_ANNOTATION: fabric_value(report)}
        body = {"metadata": {"annotations": annotations}}
        written = self.api.patch(path, body, timeout=self._timeout)
        if _owned_by_another(written):
            removal = {"metadata": {"annotations": {FINDINGS_ANNOTATION: None}}}
            self.api.patch(path, removal, timeout=self._timeout)
            self.api.patch(path, body, timeout=self._timeout)
            self._count("written", "annotation_reclaimed")
        self._count("written", "annotation")

    def _write_condition(self, report: HealthReport, now: float) -> None:
        for attempt in (1, 2):
            node = self.api.get(self._node_path(), timeout=self._timeout)
            self._uid = str(node.get("metadata", {}).get("uid") or "")
            status = node.get("status") or {}
            conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
            ours = next((c for c in conditions if c.get("type") == HEALTH_CONDITION), None)
            value = "True" if report.healthy else "False"
            stamp = format_time(now)
            transition = (
                ours.get("lastTransitionTime") if ours and ours.get("status") == value else None
            )
            condition = {
                "type": HEALTH_CONDITION,
                "status": value,
                "reason": condition_reason(report.actionable),
                "message": condition_message(report.actionable),
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": transition or stamp,
            }
            others = [c for c in conditions if c.get("type") != HEALTH_CONDITION]
            body = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "status": {"conditions": [*others, condition]},
            }
            try:
                path = self._node_path() + "/status" + FIELD_MANAGER
                self.api.patch(path, body, timeout=self._timeout)
            except ApiError as e:
                if e.status == 409 and attempt == 1:  # the kubelet wrote in between: re-read
                    continue
                raise
            self._count("written", "condition")
            return

    def _post_event(self, report: HealthReport, now: float) -> None:
        healthy = report.healthy
        stamp = format_time(now)
        if healthy:
            cleared = ", ".join(f"{component} {check}" for check, component, _, _ in self._evented)
            message = f"no actionable findings (cleared: {cleared})"[:MAX_MESSAGE_CHARS]
        else:
            message = condition_message(report.actionable)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{self.node}.topowatch.{int(now * 1e6):x}",
                "namespace": EVENT_NAMESPACE,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": self._uid or self.node,
            },
            "reason": "TopowatchHealthy" if healthy else "TopowatchUnhealthy",
            "message": message,
            "type": "Normal" if healthy else "Warning",
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "topowatch.io/node-agent",
            "reportingInstance": self.node,
        }
        self.api.post(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body, timeout=self._timeout)
        self._count("written", "event")

    # --- bookkeeping ------------------------------------------------------------------------

    def _failed(self, reason: str, message: str) -> bool:
        self._count("error", reason)
        if self._last_error != reason:
            log.warning("cannot report node health (%s): %s; will retry", reason, message)
            self._last_error = reason
        return False

    def _count(self, outcome: str, label: str) -> None:
        if self.monitor is not None:
            self.monitor.count_report(outcome, label)


def _owned_by_another(node: dict[str, Any]) -> bool:
    """The patched Node records an owner of the findings annotation other than this agent's
    field manager (False when the server returned no managedFields: nothing to go by)."""
    meta = node.get("metadata")
    if not isinstance(meta, dict) or not meta.get("managedFields"):
        return False
    return owners(node) != (AGENT_FIELD_MANAGER,)
