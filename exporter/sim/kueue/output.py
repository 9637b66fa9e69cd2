"""What the simulated cluster writes to the API store, and how.

Objects are written only when they changed since the last write, as real controllers patch
only on change, so watchers see one event per real transition. Events are recorded the way
client-go's recorder does it: named `<object>.<hex nanoseconds>`, and a repeat of the same
reason and message on the same object bumps `count` and `lastTimestamp` instead of creating a
new Event. Events expire after the API server's default TTL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from exporter.sim.kueue import objects as ko

EVENT_TTL_S = 3600.0  # kube-apiserver --event-ttl default
Obj = dict[str, Any]


class ClusterWriter(Protocol):
    def upsert(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]: ...

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...


class ApiOutput:
    def __init__(self, writer: ClusterWriter, new_uid: Callable[[], str]) -> None:
        self._writer = writer
        self._new_uid = new_uid
        self._written: dict[tuple[str, str, str], Obj] = {}
        # (involved uid, reason, message) -> (event name, event uid, count, first seen)
        self._events: dict[tuple[str, str, str], tuple[str, str, int, float]] = {}
        self._event_seen: dict[str, tuple[str, float, tuple[str, str, str]]] = {}
        self._event_seq = 0

    def put(self, plural: str, obj: Obj) -> None:
        """Upsert `obj` unless it is unchanged since it was last written."""
        meta = obj["metadata"]
        key = (plural, meta.get("namespace", ""), meta["name"])
        if self._written.get(key) == obj:
            return
        self._written[key] = obj
        self._writer.upsert(plural, obj)

    def drop(self, plural: str, namespace: str, name: str) -> None:
        if self._written.pop((plural, namespace, name), None) is not None:
            self._writer.delete(plural, namespace, name)

    def event(
        self,
        w: ko.SimWorkload,
        reason: str,
        message: str,
        now: float,
        type_: str = "Normal",
        component: str = ko.ADMISSION,
    ) -> None:
        key = (w.uid, reason, message)
        known = self._events.get(key)
        if known is not None:
            name, uid, count, first = known
            count += 1
        else:
            self._event_seq += 1
            name = f"{w.name}.{int(now * 1e9) + self._event_seq:x}"
            uid, count, first = self._new_uid(), 1, now
        self._events[key] = (name, uid, count, first)
        self._event_seen[name] = (w.namespace, now, key)
        involved = ko.involved_workload(w)
        obj = ko.event_manifest(
            name, uid, involved, reason, message, type_, component, count, first, now
        )
        self.put("events", obj)

    def expire_events(self, now: float) -> None:
        for name, (namespace, last, key) in list(self._event_seen.items()):
            if last + EVENT_TTL_S <= now:
                self.drop("events", namespace, name)
                del self._event_seen[name]
                self._events.pop(key, None)
