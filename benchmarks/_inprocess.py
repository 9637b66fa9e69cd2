"""The cluster service's informers and the admission check's status writer, in-process, over
the simulated API server's object store: what judgment_accuracy.py, admission_day.py and
goodput.py feed the service with, so it sees the cluster only through the API objects, as it
would in a cluster, while everything runs on one simulated clock.
"""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

from exporter.cluster.admission.parse import AdmissionCheckInfo, WorkloadChecks
from exporter.cluster.informers import WATCHED
from exporter.cluster.service import ClusterService
from exporter.sim.kubeapi.store import ObjectStore, StoredEntry
from exporter.sim.kueue.convert import GROUP as KUEUE_GROUP

PLURAL_KIND = {w.plural: w.kind for w in WATCHED}


class Informers:
    """Each kind's events since the last delivery from the store's watch history, handed over
    one at a time with the kinds interleaved at random (each kind's own order kept, as one
    watch stream keeps it). Kueue objects are served at `kueue_version`; with `shuffle_lists`
    a re-list takes the kinds in random order too (one informer per kind: no order between
    their first lists)."""

    def __init__(
        self,
        store: ObjectStore,
        rng: random.Random,
        kueue_version: str = "v1beta2",
        shuffle_lists: bool = False,
    ) -> None:
        self.store = store
        self.rng = rng
        self.kueue_version = kueue_version
        self.shuffle_lists = shuffle_lists
        self.plurals = [p for p in PLURAL_KIND if p in {r.plural for r in store.resources}]
        self.cursors: dict[str, int] = {}

    def _obj(self, plural: str, entry: StoredEntry) -> dict[str, Any]:
        resource = self.store.resource(plural)
        version = self.kueue_version if resource.group == KUEUE_GROUP else resource.version
        obj: dict[str, Any] = json.loads(entry.encoded(version))
        return obj

    def _list(self, service: ClusterService, plural: str) -> None:
        cursor, entries, _ = self.store.open_watch(plural, None, 0.0)
        self.cursors[plural] = cursor
        service.replace(PLURAL_KIND[plural], [self._obj(plural, e) for e in entries])

    def relist(self, service: ClusterService) -> None:
        order = list(self.plurals)
        if self.shuffle_lists:
            self.rng.shuffle(order)
        for plural in order:
            self._list(service, plural)

    def deliver(self, service: ClusterService) -> int:
        streams: list[deque[tuple[str, Any]]] = []
        for plural in self.plurals:
            got = self.store.next_events(plural, self.cursors[plural], 0.0)
            if got is None:  # fell behind the history: 410 Gone, a re-list
                self._list(service, plural)
                continue
            events, cursor, _ = got
            self.cursors[plural] = cursor
            if events:
                streams.append(deque((plural, e) for e in events))
        delivered = 0
        while streams:
            i = self.rng.randrange(len(streams))
            plural, event = streams[i].popleft()
            service.apply(PLURAL_KIND[plural], event.type, self._obj(plural, event.entry))
            delivered += 1
            if not streams[i]:
                streams.pop(i)
        return delivered


class StoreWriter:
    """The admission controller's StatusWriter onto the store: a merge patch of status (lists
    replaced, as JSON merge patch does), refused on a resourceVersion conflict (counted)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.conflicts = 0

    def _patch(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> str:
        obj = self.store.get(plural, namespace, name)
        if obj is None:
            return "not_found"
        want = patch.get("metadata", {}).get("resourceVersion")
        if want is not None and str(want) != str(obj["metadata"].get("resourceVersion")):
            self.conflicts += 1
            return "conflict"
        status = obj.setdefault("status", {})
        for key, value in patch.get("status", {}).items():
            status[key] = value
        self.store.upsert(plural, obj)
        return "written"

    def write(self, checks: WorkloadChecks, patch: dict[str, Any]) -> str:
        return self._patch("workloads", checks.namespace, checks.name, patch)

    def activate(self, check: AdmissionCheckInfo, patch: dict[str, Any]) -> str:
        return self._patch("admissionchecks", "", check.name, patch)

    def list_checks(self) -> list[dict[str, Any]] | None:
        return self.store.items("admissionchecks")
