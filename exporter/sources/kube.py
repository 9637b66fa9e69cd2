"""The labels of this node's own Node object, kept fresh in the background, and a static peer.

Topology labels (network-node layers, ultraserver id, zone) are set by the cloud provider or an
operator and change rarely, but when they do the metrics should follow at once. So the watcher
GETs the Node, then watches it (one object, by field selector) from that resourceVersion. When
the watch itself fails it still GETs the Node every `refresh_seconds`, so labels stay fresh
where watching is not allowed. The poller never waits on the API server: `labels()` only reads
what the background thread last stored.

It talks to the API server through the small `KubeApi` client rather than `kubernetes.client`,
whose import alone would cost the agent about 25 MiB of RSS.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from exporter.sources.interfaces import SourceError
from exporter.sources.kubeapi import (
    ApiError,
    KubeApi,
    KubeConfigError,
    WatchStream,
    reason_for_status,
)

log = logging.getLogger(__name__)

_NODES = "/api/v1/nodes"

_MAX_PENDING_ERRORS = 1000  # drain_errors() backlog kept when nobody drains
_GONE_IN_A_ROW_LIMIT = 3  # 410 right after a fresh GET this often: a broken server, back off


def failure_reason(exc: BaseException) -> str:
    """A short, bounded label for a failed API call (the agent's error metric label)."""
    if isinstance(exc, ApiError):
        return exc.reason
    if isinstance(exc, ValueError | KeyError | TypeError | AttributeError):
        return "bad_response"  # a Node or an event not shaped as expected
    return "error"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return exc.message  # says the status and the API server's Status message
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Gone(Exception):
    """The watch's resourceVersion expired (HTTP 410): list again, then watch from there."""


class NodeLabelsWatcher:
    """`NodeLabelsSource` that follows Node `node_name` from a daemon thread.

    Failures never clear known labels. Each failed GET or watch is recorded once, by reason,
    for `drain_errors()`; a 410 Gone on the watch is routine expiry and is not a failure.
    Retries back off exponentially from `initial_backoff_seconds`, capped at
    `refresh_seconds` while GET still works (the plain-GET fallback) and at
    `max_backoff_seconds` while it does not.
    """

    def __init__(
        self,
        node_name: str,
        api: KubeApi | None = None,
        refresh_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        *,
        use_watch: bool = True,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 10.0,
        initial_backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 60.0,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is empty")
        if refresh_seconds <= 0 or initial_backoff_seconds <= 0 or watch_timeout_seconds < 1:
            raise ValueError("refresh, backoff and watch timeout must be positive")
        self.node_name = node_name
        self._own_api = api is None
        self._api = KubeApi.default() if api is None else api
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._use_watch = use_watch
        self._watch_timeout = int(watch_timeout_seconds)
        self._request_timeout = request_timeout_seconds
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max(max_backoff_seconds, initial_backoff_seconds)

        self._lock = threading.Lock()
        self._labels: dict[str, str] | None = None
        self._resource_version: str | None = None
        self._last_reason: str | None = None
        self._pending: deque[str] = deque(maxlen=_MAX_PENDING_ERRORS)
        self.last_error: str | None = None  # the latest failure, None once a refresh succeeds
        self.errors_total = 0
        self.last_success: float | None = None  # clock() of the last successful GET or event

        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._active_stream: WatchStream | None = None  # the open watch, for close() to cut

    # --- NodeLabelsSource -------------------------------------------------------------------

    def labels(self) -> Mapping[str, str]:
        """The labels last read; `SourceError` only while none were ever read."""
        with self._lock:
            if self._labels is not None:
                return dict(self._labels)
            reason = self._last_reason or "unavailable"
            detail = self.last_error or "not read yet"
        raise SourceError(reason, f"labels of node {self.node_name}: {detail}")

    def close(self) -> None:
        """Stop the thread promptly: the open watch connection is cut, not waited out.

        Waits at most about two seconds (a GET in flight is not interrupted); the thread is a
        daemon either way.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            deadline = time.monotonic() + 2.0
            while thread.is_alive() and time.monotonic() < deadline:
                with self._lock:  # retried: the stream may open just after the first look
                    stream = self._active_stream
                if stream is not None:
                    stream.close()
                thread.join(0.02)
        if self._own_api and (thread is None or not thread.is_alive()):
            self._api.close()

    # --- agent side -------------------------------------------------------------------------

    def start(self) -> NodeLabelsWatcher:
        if self._stop.is_set():
            raise RuntimeError("watcher is closed")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"node-labels-{self.node_name}", daemon=True
            )
            self._thread.start()
        return self

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first GET has answered, either way; True if labels are known."""
        self._ready.wait(timeout)
        with self._lock:
            return self._labels is not None

    def drain_errors(self) -> list[str]:
        """Failure reasons recorded since the previous call, oldest first, one per failure."""
        with self._lock:
            reasons = list(self._pending)
            self._pending.clear()
        return reasons

    # --- background thread ------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0  # consecutive; reset by a watch that ran (or by a GET, when not watching)
        gone_in_a_row = 0
        while not self._stop.is_set():
            try:
                self._get()
            except Exception as exc:  # every failure is retried; the thread must not die
                self._record_failure(exc, "get")
                failures += 1
                self._stop.wait(self._backoff(failures, self._max_backoff))
                continue
            if not self._use_watch:
                failures = 0
                self._stop.wait(self.refresh_seconds)
                continue
            started = time.monotonic()
            try:
                short = 0
                while not self._stop.is_set():  # one watch per server-side timeout
                    started = time.monotonic()
                    events = self._watch_once()
                    failures = 0
                    gone_in_a_row = 0
                    # A watch that a proxy ends at once, empty, must not become a busy loop.
                    short = short + 1 if events == 0 and time.monotonic() - started < 1 else 0
                    if short:
                        self._stop.wait(self._backoff(short, self.refresh_seconds))
            except _Gone:
                # Routine after a long watch; only a 410 straight after a fresh GET repeats.
                gone_in_a_row = gone_in_a_row + 1 if time.monotonic() - started < 1 else 1
                if gone_in_a_row < _GONE_IN_A_ROW_LIMIT:
                    continue  # list again at once
                message = f"watch {_NODES}: HTTP 410 Gone {gone_in_a_row} times after a GET"
                self._record_failure(ApiError(410, "gone", message), "watch")
                gone_in_a_row = 0
                failures += 1
                self._stop.wait(self._backoff(failures, self._max_backoff))
            except Exception as exc:
                if self._stop.is_set():
                    break  # close() shut the connection down under us
                self._record_failure(exc, "watch")
                failures += 1
                self._stop.wait(self._backoff(failures, self.refresh_seconds))

    def _backoff(self, failures: int, cap: float) -> float:
        delay = min(cap, self._initial_backoff * 2.0 ** min(failures - 1, 30))
        return delay * random.uniform(0.9, 1.1)  # spread a fleet's retries apart

    def _get(self) -> None:
        try:
            node = self._api.get(
                f"{_NODES}/{quote(self.node_name, safe='')}", timeout=self._request_timeout
            )
            metadata = node.get("metadata")
            if not isinstance(metadata, Mapping):
                raise ValueError("Node without metadata")
            labels = _labels_of(metadata, "Node")
            version = metadata.get("resourceVersion")
        finally:
            self._ready.set()
        self._store(labels, str(version) if version else None)

    def _watch_once(self) -> int:
        """Follow the Node until the server ends the watch; the number of events seen.

        Raises `_Gone` on 410 (and on the Node's deletion) so that the caller lists again.
        """
        with self._lock:
            version = self._resource_version
        try:
            stream = self._api.stream(
                _NODES,
                {
                    "fieldSelector": f"metadata.name={self.node_name}",
                    "watch": True,
                    "resourceVersion": version,
                    "allowWatchBookmarks": True,
                    "timeoutSeconds": self._watch_timeout,
                },
                # Bounds the wait between two reads, should the connection die silently.
                timeout=self._watch_timeout + 30,
                connect_timeout=self._request_timeout,
            )
        except ApiError as exc:
            if exc.status == 410:  # expiry as an HTTP status rather than an ERROR event
                raise _Gone from exc
            raise
        with self._lock:
            self._active_stream = stream
        events = 0
        try:
            for event in stream:
                if self._stop.is_set():
                    break
                events += 1
                self._on_event(event)
        finally:
            with self._lock:
                self._active_stream = None
            stream.close()
        return events

    def _on_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise ValueError(f"{kind} watch event without an object")
        if kind == "ERROR":  # a Status; 410 when our resourceVersion is too old
            code = obj.get("code")
            if code == 410:
                raise _Gone
            status = code if isinstance(code, int) else None
            raise ApiError(
                status,
                reason_for_status(status) if status else "bad_response",
                f"watch {_NODES}: ERROR event {code} {obj.get('reason')}: {obj.get('message')}",
            )
        metadata = obj.get("metadata")
        if not isinstance(metadata, Mapping):
            raise ValueError(f"{kind} watch event without metadata")
        version = str(metadata.get("resourceVersion") or "") or None
        if kind == "BOOKMARK":
            if version:
                with self._lock:
                    self._resource_version = version
            return
        if metadata.get("name") not in (None, self.node_name):
            return
        if kind in ("ADDED", "MODIFIED"):
            self._store(_labels_of(metadata, f"{kind} event"), version)
        elif kind == "DELETED":
            # Keep the labels; the next GET reports not_found until the Node is back.
            raise _Gone

    def _store(self, labels: dict[str, str], version: str | None) -> None:
        with self._lock:
            changed = self._labels is not None and self._labels != labels
            recovered = self.last_error is not None
            self._labels = labels
            if version:
                self._resource_version = version
            self.last_error = None
            self._last_reason = None
            self.last_success = self._clock()
        if recovered:
            log.info("labels of node %s readable again", self.node_name)
        elif changed:
            log.debug("labels of node %s changed", self.node_name)

    def _record_failure(self, exc: BaseException, what: str) -> None:
        reason = failure_reason(exc)
        message = f"{what} node {self.node_name}: {reason}: {_describe(exc)}"
        with self._lock:
            first = self.last_error is None
            self.last_error = message
            self._last_reason = reason
            self.errors_total += 1
            self._pending.append(reason)
        # One warning when things go wrong, not one per retry.
        log.log(logging.WARNING if first else logging.DEBUG, "%s", message)


def _labels_of(metadata: Mapping[str, Any], what: str) -> dict[str, str]:
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise ValueError(f"labels of a {what} are not a mapping")
    return {str(k): str(v) for k, v in labels.items()}


class StaticNodeLabels:
    """`NodeLabelsSource` for the simulation: fixed labels, replaceable with `set`."""

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        self._labels = dict(labels or {})

    def set(self, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)

    def labels(self) -> Mapping[str, str]:
        return dict(self._labels)

    def drain_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class UnreachableNodeLabels:
    """`NodeLabelsSource` when no Kubernetes API can be configured at all (no in-cluster service
    account, no kubeconfig): every read fails with the reason, so the agent counts it and serves
    its other collectors instead of dying at start-up."""

    def __init__(self, message: str) -> None:
        self._message = message

    def labels(self) -> Mapping[str, str]:
        raise SourceError("unavailable", self._message)

    def drain_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def node_labels_source(node_name: str) -> NodeLabelsWatcher | UnreachableNodeLabels:
    """The production labels source, started; degraded to `UnreachableNodeLabels` without config."""
    try:
        watcher = NodeLabelsWatcher(node_name)
    except KubeConfigError as e:
        log.warning("no Kubernetes API configuration (%s); topology labels unavailable", e)
        return UnreachableNodeLabels(f"no Kubernetes API configuration: {e}")
    return watcher.start()
