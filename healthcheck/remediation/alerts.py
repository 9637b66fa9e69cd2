"""Alertmanager webhook (payload version 4) → per-node remediation signals.

A payload is accepted whole or refused whole: bad JSON or a wrong shape raises AlertPayloadError
(the HTTP layer answers 400 and nothing changes). Individual alerts that name no node or no
action are not errors — they are returned as `ignored` with the reason, for the audit log.

An alert is over when its status is `resolved` or its `endsAt` has passed: Alertmanager zeroes
`endsAt` on firing alerts and sets it on resolved ones; other senders may set a future `endsAt`
on a firing alert, a lease that ends it unless sent again (`AlertSignal.resolved`).
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from healthcheck.remediation.state import ACTIONS, Action

AlertStatus = Literal["firing", "resolved"]
MAX_ALERTS = 10_000


class AlertPayloadError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class AlertSignal:
    node: str
    status: AlertStatus
    action: Action | None
    name: str  # labels.alertname
    starts_at: float | None
    fingerprint: str
    ends_at: float | None = None

    def resolved(self, now: float) -> bool:
        """Over: resolved by Alertmanager, or its endsAt is not in the future."""
        return self.status == "resolved" or (self.ends_at is not None and self.ends_at <= now)


@dataclass(frozen=True, slots=True)
class ParsedAlerts:
    signals: tuple[AlertSignal, ...]
    ignored: tuple[str, ...]  # why each skipped alert was skipped


class TokenFileError(ValueError):
    """A bearer token file that cannot be read or is empty; the message names the file."""


def read_token_file(path: Path) -> str:
    """A bearer token from a file (stripped); never logs or returns it in an error."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from exc
    if not token:
        raise TokenFileError(f"token file {path} is empty")
    return token


def bearer_ok(authorization: str | None, expected: str | None) -> bool:
    """Constant-time bearer check; with no token configured nothing is accepted."""
    if not expected or not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), expected.encode())


def parse_alertmanager(body: bytes) -> ParsedAlerts:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AlertPayloadError(f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise AlertPayloadError("payload is not a JSON object")
    version = payload.get("version", "4")
    if str(version) != "4":
        raise AlertPayloadError(f"payload version {version!r}: only Alertmanager's v4 is read")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise AlertPayloadError("payload has no alerts list")
    if len(alerts) > MAX_ALERTS:
        raise AlertPayloadError(f"{len(alerts)} alerts in one payload (max {MAX_ALERTS})")
    group_status = payload.get("status")
    signals: list[AlertSignal] = []
    ignored: list[str] = []
    for index, alert in enumerate(alerts):
        signal, why = _signal(alert, group_status)
        if signal is None:
            ignored.append(f"alert {index}: {why}")
        else:
            signals.append(signal)
    return ParsedAlerts(tuple(signals), tuple(ignored))


def _signal(alert: Any, group_status: Any) -> tuple[AlertSignal | None, str]:
    if not isinstance(alert, dict):
        return None, "not an object"
    labels = alert.get("labels")
    annotations = alert.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        return None, "labels/annotations are not objects"
    name = str(labels.get("alertname", ""))
    node = _node_of(labels)
    if not node:
        return None, f"{name or 'alert'} names no node (labels.node or labels.instance)"
    status = alert.get("status", group_status)
    if status not in ("firing", "resolved"):
        return None, f"{name} on {node}: status {status!r} is not firing|resolved"
    raw_action = labels.get("action", annotations.get("action"))
    action: Action | None = next((a for a in ACTIONS if a == raw_action), None)
    if action is None and raw_action not in (None, "", "none"):
        return None, f"{name} on {node}: action {raw_action!r} is not none|{'|'.join(ACTIONS)}"
    fingerprint = str(alert.get("fingerprint") or f"{name}/{node}")
    starts, ends = _time(alert.get("startsAt")), _time(alert.get("endsAt"))
    return AlertSignal(node, status, action, name, starts, fingerprint, ends), ""


def _node_of(labels: dict[str, Any]) -> str:
    node = labels.get("node")
    if isinstance(node, str) and node:
        return node
    instance = labels.get("instance")
    if not isinstance(instance, str) or not instance:
        return ""
    if instance.startswith("["):  # [v6]:port
        return instance[1:].split("]", 1)[0]
    host, _, port = instance.rpartition(":")
    return host if host and port.isdigit() else instance


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value or value.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
