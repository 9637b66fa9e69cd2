"""Alertmanager webhook (payload version 4) → per-node remediation signals.

A payload is accepted whole or refused whole: bad JSON or a wrong shape raises AlertPayloadError
(the HTTP layer answers 400 and nothing changes). Individual alerts that name no node or no
action are not errors — they are returned as `ignored` with the reason, for the audit log.

An alert is over when its status is `resolved` or its `endsAt` has passed: Alertmanager zeroes
`endsAt` on firing alerts and sets it on resolved ones; other senders may set a future `endsAt`
on a firing alert, a lease that ends it unless sent again (`AlertSignal.resolved`).

Notifications are at-least-once and unordered: in HA mode every Alertmanager peer notifies on its
own, deduplicating only through the notification log it gossips, so a peer can deliver an older
*firing* notification after another peer's *resolved* one (Alertmanager docs, "High
Availability": "Alertmanager ... provides at-least-once delivery"; the webhook receiver gets each
alert's `startsAt`, which stays the same for one firing episode, and `fingerprint`). The resolve
is remembered per fingerprint (`ResolvedAlert`, kept on the Node in `ALERTS_ANNOTATION`, bounded
by count and age), and a firing whose `startsAt` is not newer than the resolve's is a replay
(`replayed`); a firing with a later `startsAt` is a new episode of the alert and counts as usual.
A firing without `startsAt` cannot be told apart and counts as new (Alertmanager always sets it).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from healthcheck.remediation.state import ACTIONS, Action

AlertStatus = Literal["firing", "resolved"]
MAX_ALERTS = 10_000
ALERTS_ANNOTATION = "topowatch.io/remediation-alerts"  # the resolves the controller remembers
MAX_RESOLVED = 32  # per node: bounds the annotation whatever the alert rules do
# Alertmanager keeps an alert, and so may still notify about it, for its --data.retention
# (120 h by default); a resolve older than that cannot be replayed any more.
RESOLVED_KEEP_S = 120 * 3600.0


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
class ResolvedAlert:
    """A resolve the controller saw: which alert (fingerprint), the firing episode it ended
    (its startsAt) and when it ended (its endsAt, else when the resolve arrived)."""

    fingerprint: str
    name: str
    starts_at: float | None
    ended_at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "alertname": self.name,
            "startsAt": self.starts_at,
            "endedAt": self.ended_at,
        }


def resolve_of(signal: AlertSignal, now: float) -> ResolvedAlert:
    ended = signal.ends_at if signal.ends_at is not None else now
    return ResolvedAlert(signal.fingerprint, signal.name, signal.starts_at, ended)


def replayed(signal: AlertSignal, resolved: ResolvedAlert | None) -> bool:
    """A firing notification for an episode already resolved: its startsAt is not newer than
    the resolve's (or than the resolve's end, when the resolve carried no startsAt)."""
    if resolved is None or signal.status != "firing" or signal.starts_at is None:
        return False
    bound = resolved.starts_at if resolved.starts_at is not None else resolved.ended_at
    return signal.starts_at <= bound


def older_episode(signal: AlertSignal, held: AlertSignal) -> bool:
    """A resolve for an earlier firing episode than the one held (both startsAt known)."""
    return (
        signal.starts_at is not None
        and held.starts_at is not None
        and signal.starts_at < held.starts_at
    )


def remember_resolve(memory: dict[str, ResolvedAlert], resolved: ResolvedAlert, now: float) -> bool:
    """Keep `resolved` in `memory` (fingerprint -> the latest episode's resolve), dropping
    what is older than RESOLVED_KEEP_S and beyond MAX_RESOLVED. Whether memory changed."""
    before = dict(memory)
    known = memory.get(resolved.fingerprint)
    if known is None or _episode(resolved) >= _episode(known):
        memory[resolved.fingerprint] = resolved
    prune_resolves(memory, now)
    return memory != before


def prune_resolves(memory: dict[str, ResolvedAlert], now: float) -> None:
    for fingerprint, item in list(memory.items()):
        if now - item.ended_at > RESOLVED_KEEP_S:
            del memory[fingerprint]
    if len(memory) > MAX_RESOLVED:
        newest = sorted(memory.values(), key=lambda r: r.ended_at)[-MAX_RESOLVED:]
        memory.clear()
        memory.update((r.fingerprint, r) for r in newest)


def _episode(item: ResolvedAlert) -> float:
    return item.starts_at if item.starts_at is not None else item.ended_at


def dump_resolves(items: Iterable[ResolvedAlert]) -> str:
    """The annotation's value: compact JSON, oldest first."""
    ordered = sorted(items, key=lambda r: (r.ended_at, r.fingerprint))
    return json.dumps([r.as_dict() for r in ordered], separators=(",", ":"), sort_keys=True)


def parse_resolves(text: str | None) -> tuple[tuple[ResolvedAlert, ...], str | None]:
    """(resolves, problem): what can be read of the annotation, and why the rest cannot."""
    if not text:
        return (), None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return (), f"{ALERTS_ANNOTATION} is not JSON: {exc}"
    if not isinstance(raw, list):
        return (), f"{ALERTS_ANNOTATION} is not a JSON list"
    out: list[ResolvedAlert] = []
    bad = 0
    for entry in raw[: MAX_RESOLVED * 2]:
        item = _resolved(entry)
        if item is None:
            bad += 1
        else:
            out.append(item)
    problem = f"{ALERTS_ANNOTATION}: {bad} malformed entries skipped" if bad else None
    return tuple(out), problem


def _resolved(entry: Any) -> ResolvedAlert | None:
    if not isinstance(entry, dict):
        return None
    fingerprint, name = entry.get("fingerprint"), entry.get("alertname", "")
    starts, ended = entry.get("startsAt"), entry.get("endedAt")
    if not isinstance(fingerprint, str) or not fingerprint or not isinstance(name, str):
        return None
    end, start = _finite(ended), _finite(starts)
    if end is None or (starts is not None and start is None):
        return None
    return ResolvedAlert(fingerprint, name, start, end)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


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
