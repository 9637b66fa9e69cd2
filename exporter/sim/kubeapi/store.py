"""The object store behind the simulated Kubernetes API server.

One global resourceVersion, like etcd's revision; every object keeps its JSON encoding,
made once and shared by every list and watch that serves it; every resource keeps a
bounded history of events from which watches resume and paged lists are rebuilt as they
stood at their first page's resourceVersion (a consistent snapshot). Forgetting history
(compact, or trimming to the bound) is what makes old resourceVersions answer 410 Gone.

The methods below the public ones are the API server's: they run under the store's lock,
so a list page, a watch start and a conditional write each see one consistent state.
"""

from __future__ import annotations

import bisect
import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exporter.sim.kueue import convert as kueue_convert

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass(frozen=True)
class Resource:
    """One API resource: where it lives, what it is called, which versions are served."""

    group: str  # "" for core
    version: str  # storage / preferred version
    plural: str
    kind: str
    namespaced: bool
    served_versions: tuple[str, ...] = ()  # defaults to (version,)
    # A type compiled into kube-apiserver (core and the *.k8s.io groups, not CRDs): its list
    # items leave out kind and apiVersion, and it takes strategic merge patches. None: core only.
    builtin: bool | None = None

    def __post_init__(self) -> None:
        if not self.served_versions:
            object.__setattr__(self, "served_versions", (self.version,))
        if self.builtin is None:
            object.__setattr__(self, "builtin", not self.group)

    def api_version(self, version: str | None = None) -> str:
        version = version or self.version
        return f"{self.group}/{version}" if self.group else version


CORE_RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "nodes", "Node", False),
    Resource("", "v1", "pods", "Pod", True),
    Resource("", "v1", "events", "Event", True),
    Resource("", "v1", "namespaces", "Namespace", False),
)

KUEUE_RESOURCES: tuple[Resource, ...] = tuple(
    Resource(
        kueue_convert.GROUP,
        kueue_convert.STORAGE_VERSION,
        plural,
        kind,
        namespaced,
        kueue_convert.VERSIONS,
    )
    for plural, kind, namespaced in (
        ("workloads", "Workload", True),
        ("clusterqueues", "ClusterQueue", False),
        ("localqueues", "LocalQueue", True),
        ("cohorts", "Cohort", False),  # the CRD serves v1beta1 and v1beta2 too
        ("resourceflavors", "ResourceFlavor", False),
        ("topologies", "Topology", False),
        ("workloadpriorityclasses", "WorkloadPriorityClass", False),
        # Cluster-scoped, with a status subresource (its Active condition, set by the check's
        # own controller): config/components/crd/bases/kueue.x-k8s.io_admissionchecks.yaml
        ("admissionchecks", "AdmissionCheck", False),
    )
)

# The SageMaker HyperPod training operator's job CRD (group, version, plural: the reference's
# hyperpod/elastic-training-and-deep-health.md section 1.1). A plain single-version group:
# no conversion, served and stored at v1.
HYPERPOD_RESOURCES: tuple[Resource, ...] = (
    Resource("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs", "HyperPodPyTorchJob", True),
)

# Leases (coordination.k8s.io/v1): the lock of leader election. A built-in type, namespaced, with
# no status subresource; like every type whose strategy refuses unconditional updates, a PUT
# must carry metadata.resourceVersion, and a stale one answers 409 Conflict.
COORDINATION_RESOURCES: tuple[Resource, ...] = (
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True, builtin=True),
)


# ---------------------------------------------------------------------------------------
# The store


class StoredEntry:
    """One stored object with its JSON encoding, made once and shared by every reader."""

    __slots__ = ("_alt", "body", "key", "labels", "obj", "resource")

    def __init__(self, resource: Resource, obj: Obj) -> None:
        rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        self.body = json.dumps(rest, separators=(",", ":"), allow_nan=False).encode()
        self.obj: Obj = {"apiVersion": resource.api_version(), "kind": resource.kind}
        self.obj.update(json.loads(self.body))  # a private copy the caller cannot touch
        self.resource = resource
        meta = self.obj["metadata"]
        self.key: Key = (meta.get("namespace", ""), meta["name"])
        labels = meta.get("labels")
        self.labels: dict[str, str] = (
            {k: v for k, v in labels.items() if isinstance(v, str)}
            if isinstance(labels, dict)
            else {}
        )
        self._alt: dict[str, bytes] = {}

    @property
    def meta(self) -> Obj:
        meta: Obj = self.obj["metadata"]
        return meta

    def encoded(self, version: str) -> bytes:
        """The whole object, with kind and apiVersion, at `version`."""
        if version == self.resource.version:
            return _type_prefix(self.resource.api_version(), self.resource.kind) + self.body[1:]
        cached = self._alt.get(version)
        if cached is None:
            converted = kueue_convert.convert(self.obj, version)
            cached = json.dumps(converted, separators=(",", ":")).encode()
            self._alt[version] = cached
        return cached

    def list_item(self, version: str) -> bytes:
        """The object as a list item: built-in types leave out kind and apiVersion there."""
        if self.resource.builtin:
            return self.body
        return self.encoded(version)

    def copy(self) -> Obj:
        copied: Obj = json.loads(self.encoded(self.resource.version))
        return copied


@functools.cache
def _type_prefix(api_version: str, kind: str) -> bytes:
    return f'{{"apiVersion":{json.dumps(api_version)},"kind":{json.dumps(kind)},'.encode()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    entry: StoredEntry  # the new state; for DELETED the last state, at the deletion's RV
    prev: StoredEntry | None


class History:
    """A resource's recent events; a watch or list from RV >= `floor` can be served."""

    __slots__ = ("events", "floor", "offset", "rvs")

    def __init__(self) -> None:
        self.events: list[StoredEvent] = []
        self.rvs: list[int] = []
        self.offset = 0  # absolute index of events[0]
        self.floor = 0

    @property
    def end(self) -> int:
        return self.offset + len(self.events)

    def append(self, event: StoredEvent, limit: int) -> None:
        self.events.append(event)
        self.rvs.append(event.rv)
        if len(self.events) > limit + max(limit // 4, 1):  # trim in batches, not per event
            drop = len(self.events) - limit
            self.floor = self.rvs[drop - 1]
            del self.events[:drop]
            del self.rvs[:drop]
            self.offset += drop

    def clear(self, rv: int) -> None:
        self.offset = self.end
        self.events.clear()
        self.rvs.clear()
        self.floor = rv

    def index_after(self, rv: int) -> int:
        return self.offset + bisect.bisect_right(self.rvs, rv)

    def since(self, index: int) -> list[StoredEvent]:
        return self.events[index - self.offset :]


class ExpiredError(Exception):
    """The requested resourceVersion is older than the retained history."""


class TooLargeError(Exception):
    """The requested resourceVersion is newer than the store's."""


class InvalidObjectError(ValueError):
    """An object the store cannot keep: not a JSON object, unnamed, or not plain JSON."""


class ConflictError(Exception):
    pass


class NotFoundError(Exception):
    pass


Match = Callable[[StoredEntry], bool]


@dataclass(frozen=True, slots=True)
class ListPage:
    entries: list[StoredEntry]
    rv: int
    next_key: Key | None
    remaining: int | None


class ObjectStore:
    """Thread-safe object store with a single, monotonically increasing resourceVersion.

    Every resource keeps at least `history` recent events (compact() forgets them all);
    watches and paged lists that need older ones answer 410 Expired. Objects may be given
    at any served version; they are kept at the resource's storage version.
    """

    def __init__(
        self,
        resources: Iterable[Resource] = (
            CORE_RESOURCES + KUEUE_RESOURCES + HYPERPOD_RESOURCES + COORDINATION_RESOURCES
        ),
        history: int = 10_000,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._resources = {r.plural: r for r in resources}
        self._history_limit = max(1, history)
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rv = 1
        self._objects: dict[str, dict[Key, StoredEntry]] = {p: {} for p in self._resources}
        self._keys: dict[str, list[Key]] = {p: [] for p in self._resources}
        self._history: dict[str, History] = {p: History() for p in self._resources}

    @property
    def resources(self) -> tuple[Resource, ...]:
        return tuple(self._resources.values())

    def resource(self, plural: str) -> Resource:
        try:
            return self._resources[plural]
        except KeyError:
            raise ValueError(f"unknown resource {plural!r}") from None

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def upsert(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace `obj` by (namespace, name); emit ADDED or MODIFIED.

        Fills metadata.uid (kept across updates; a uid given on create is kept),
        creationTimestamp (on create, unless given), resourceVersion and generation.
        Raises ValueError for an unknown resource, and InvalidObjectError (a ValueError) for
        an object without metadata.name or with values that are not plain JSON.
        """
        resource = self.resource(plural)
        stored = self.prepare(resource, obj)
        with self._lock:
            prev = self._objects[plural].get(self.key_of(resource, stored))
            return self._commit(resource, stored, prev).copy()

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete an object now (finalizers are not waited for); emit DELETED."""
        resource = self.resource(plural)
        key = (namespace if resource.namespaced else "", name)
        with self._lock:
            entry = self._objects[plural].get(key)
            if entry is None:
                return None
            return self._remove(resource, entry).copy()

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        resource = self.resource(plural)
        with self._lock:
            entry = self._objects[plural].get((namespace if resource.namespaced else "", name))
        return None if entry is None else entry.copy()

    def items(self, plural: str) -> list[dict[str, Any]]:
        """Copies of every object of a resource, ordered by namespace and name."""
        self.resource(plural)
        with self._lock:
            entries = [self._objects[plural][k] for k in self._keys[plural]]
        return [entry.copy() for entry in entries]

    def entry(self, plural: str, key: Key) -> StoredEntry | None:
        """The stored entry (shared, never to be changed) for a key, for the API server."""
        with self._lock:
            return self._objects[plural].get(key)

    def compact(self) -> None:
        """Forget all watch history: watches and continue tokens from older RVs get 410."""
        with self._lock:
            for history in self._history.values():
                history.clear(self._rv)

    # ---- internals shared with the server (all run under or take the lock) ----

    def prepare(self, resource: Resource, obj: Obj) -> Obj:
        if not isinstance(obj, dict):
            raise InvalidObjectError(f"a {resource.kind} must be a JSON object")
        if resource.group == kueue_convert.GROUP:
            obj = kueue_convert.convert(obj, resource.version)
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise InvalidObjectError(f"a {resource.kind} needs metadata.name")
        obj = dict(obj)
        meta = dict(meta)
        obj["metadata"] = meta
        namespace = meta.get("namespace")
        if resource.namespaced:
            meta["namespace"] = namespace if isinstance(namespace, str) and namespace else "default"
        else:
            meta.pop("namespace", None)
        return obj

    @staticmethod
    def key_of(resource: Resource, obj: Obj) -> Key:
        meta = obj["metadata"]
        return (meta.get("namespace", "") if resource.namespaced else "", meta["name"])

    def timestamp(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock()))

    def _commit(self, resource: Resource, obj: Obj, prev: StoredEntry | None) -> StoredEntry:
        """Store `obj` (already in storage form) as the new state; caller holds the lock."""
        meta = obj["metadata"]
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        if prev is None:
            if not isinstance(meta.get("uid"), str) or not meta["uid"]:
                meta["uid"] = str(uuid.uuid4())
            if not isinstance(meta.get("creationTimestamp"), str):
                meta["creationTimestamp"] = self.timestamp()
            meta["generation"] = 1
        else:
            old = prev.meta
            meta["uid"] = old.get("uid")
            meta["creationTimestamp"] = old.get("creationTimestamp")
            generation = old.get("generation", 1)
            generation = generation if isinstance(generation, int) else 1
            meta["generation"] = generation + (1 if _spec_changed(prev.obj, obj) else 0)
        try:
            entry = StoredEntry(resource, obj)
        except (TypeError, ValueError) as error:
            self._rv -= 1  # nothing was stored: the version was never seen
            raise InvalidObjectError(f"a {resource.kind} must be plain JSON: {error}") from None
        objects = self._objects[resource.plural]
        objects[entry.key] = entry
        if prev is None:
            bisect.insort(self._keys[resource.plural], entry.key)
        event = StoredEvent(self._rv, "MODIFIED" if prev else "ADDED", entry, prev)
        self._history[resource.plural].append(event, self._history_limit)
        self._changed.notify_all()
        return entry

    def _remove(self, resource: Resource, entry: StoredEntry) -> StoredEntry:
        plural = resource.plural
        del self._objects[plural][entry.key]
        keys = self._keys[plural]
        del keys[bisect.bisect_left(keys, entry.key)]
        self._rv += 1
        final = dict(entry.obj)
        final["metadata"] = {**entry.meta, "resourceVersion": str(self._rv)}
        last = StoredEntry(resource, final)
        self._history[plural].append(
            StoredEvent(self._rv, "DELETED", last, entry), self._history_limit
        )
        self._changed.notify_all()
        return last

    def wake(self) -> None:
        with self._lock:
            self._changed.notify_all()

    def list_page(
        self,
        plural: str,
        namespace: str | None,
        at_rv: int | None,
        after: Key | None,
        limit: int,
        match: Match,
        counted: bool,
    ) -> ListPage:
        """One page of a list as it stood at `at_rv` (None: now), after key `after`."""
        with self._lock:
            objects = self._objects[plural]
            keys = self._keys[plural]
            rv = self._rv if at_rv is None else at_rv
            if rv > self._rv:
                raise TooLargeError
            # The state at `rv`: the current one, with every later change undone.
            history = self._history[plural]
            past: dict[Key, StoredEntry | None] = {}
            if rv < self._rv:
                if rv < history.floor:
                    raise ExpiredError
                for event in history.since(history.index_after(rv)):
                    past.setdefault(event.entry.key, event.prev)
            lo, hi = 0, len(keys)
            if namespace is not None:
                lo = bisect.bisect_left(keys, (namespace, ""))
                hi = bisect.bisect_left(keys, (namespace + "\x00", ""))
            i = bisect.bisect_right(keys, after, lo, hi) if after is not None else lo

            def in_range(key: Key) -> bool:
                return (namespace is None or key[0] == namespace) and (after is None or key > after)

            gone = sorted(k for k, e in past.items() if e is not None and k not in objects)
            gone = [k for k in gone if in_range(k)]
            j = 0

            def at(key: Key) -> StoredEntry | None:
                return past[key] if key in past else objects[key]

            def next_key() -> Key | None:
                nonlocal i, j
                if i < hi and (j >= len(gone) or keys[i] < gone[j]):
                    i += 1
                    return keys[i - 1]
                if j < len(gone):
                    j += 1
                    return gone[j - 1]
                return None

            out: list[StoredEntry] = []
            last: Key | None = after
            while limit <= 0 or len(out) < limit:
                key = next_key()
                if key is None:
                    break
                last = key
                entry = at(key)
                if entry is not None and match(entry):
                    out.append(entry)
            # Skip keys that did not exist at `rv`, so "more" means objects truly remain.
            while (
                i < hi
                and keys[i] in past
                and past[keys[i]] is None
                and (j >= len(gone) or keys[i] < gone[j])
            ):
                i += 1
            more = i < hi or j < len(gone)
            remaining: int | None = None
            if counted and more:
                first = keys[i] if i < hi else None
                born_later = sum(
                    1
                    for k, e in past.items()
                    if e is None
                    and k in objects
                    and first is not None
                    and k >= first
                    and (namespace is None or k[0] == namespace)
                )
                remaining = (hi - i) + (len(gone) - j) - born_later
            return ListPage(out, rv, last if more else None, remaining)

    def open_watch(
        self, plural: str, from_rv: int | None, wait: float
    ) -> tuple[int, list[StoredEntry], int]:
        """Where a watch starts: (history cursor, the objects then when from_rv is None,
        and the store's resourceVersion at that cursor)."""
        with self._lock:
            history = self._history[plural]
            if from_rv is None:
                entries = [self._objects[plural][k] for k in self._keys[plural]]
                return history.end, entries, self._rv
            deadline = time.monotonic() + wait
            while from_rv > self._rv:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TooLargeError
                self._changed.wait(left)
            if from_rv < history.floor:
                raise ExpiredError
            return history.index_after(from_rv), [], self._rv

    def next_events(
        self, plural: str, cursor: int, timeout: float
    ) -> tuple[list[StoredEvent], int, int] | None:
        """Events after `cursor` (waiting up to `timeout`), the new cursor and the store RV;
        None when the watcher fell so far behind that its events were trimmed."""
        with self._lock:
            history = self._history[plural]
            if history.end == cursor and timeout > 0:
                self._changed.wait(timeout)
            if cursor < history.offset:
                return None
            return history.since(cursor), history.end, self._rv

    def write(
        self,
        resource: Resource,
        key: Key,
        build: Callable[[StoredEntry | None], Obj | None],
    ) -> tuple[StoredEntry, bool]:
        """Atomically read the current entry, build the new object and commit it.

        `build` raises ConflictError / NotFoundError, or returns None to delete the object (the
        last finalizer went away). Returns the resulting entry and whether it was deleted.
        """
        with self._lock:
            current = self._objects[resource.plural].get(key)
            obj = build(current)
            if obj is None:
                assert current is not None
                return self._remove(resource, current), True
            return self._commit(resource, obj, current), False


def _spec_changed(old: Obj, new: Obj) -> bool:
    skip = ("metadata", "status", "apiVersion", "kind")
    return {k: v for k, v in old.items() if k not in skip} != {
        k: v for k, v in new.items() if k not in skip
    }
