"""Informers: list + watch through the official `kubernetes` client, delivering plain dicts.

One daemon thread per kind keeps a sink in step with the API server, as client-go's
reflector does: a paged list (limit/continue) delivered whole through `sink.replace`, then
a watch from the list's resourceVersion with bookmarks, resumed from the newest
resourceVersion seen whenever the stream ends; a 410 Gone (an ERROR event or an HTTP 410)
means the history is gone, so the informer lists again. Every other failure backs off
exponentially with jitter, is counted under a bounded reason and logged once per change of
condition, and never ends the thread: an API server that is down at start, a dropped
stream or an absent Kueue leave the informer retrying and `synced()` saying so.

Requests go through the client's own call path (`ApiClient.param_serialize` + `call_api`,
so configuration, TLS and credentials are the client's) with the body left unread, and are
decoded with `json` into dicts: building the client's model objects for 50,000 Pods would
cost seconds per list. Only get, list and watch are used, plus discovery, which every
authenticated client may read.

The sink is called from one informer thread at a time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import kubernetes.client
import urllib3
from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError

from exporter.cluster.parse import hyperpod

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
HYPERPOD_GROUP = hyperpod.GROUP
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
MAX_EVENT_BYTES = 64 * 1024 * 1024  # one watch event; a line without end must not eat memory
_CONNECT_TIMEOUT_S = 10.0
_LIST_READ_TIMEOUT_S = 60.0
_WATCH_READ_SLACK_S = 30.0  # beyond timeoutSeconds, before a silent stream counts as dead
_KNOWN_HTTP = frozenset({400, 401, 403, 404, 405, 406, 409, 410, 415, 422, 429, 500, 502, 503, 504})
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})


class InformerSink(Protocol):
    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        """The complete current set after a (re)list; the sink reconciles deletions."""

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One change: event_type is ADDED, MODIFIED or DELETED."""


@dataclass(frozen=True)
class Watched:
    kind: str
    group: str
    plural: str
    namespaced: bool
    versions: tuple[str, ...]  # preference order, e.g. ("v1beta2", "v1beta1"); ("v1",) for core
    # A kind whose CRD may not be installed (HyperPod's training operator): while it is not
    # served the informer counts as synced and reports itself absent, and keeps looking.
    optional: bool = False


WATCHED: tuple[Watched, ...] = (
    Watched("Node", "", "nodes", False, ("v1",)),
    Watched("Pod", "", "pods", True, ("v1",)),
    Watched("Event", "", "events", True, ("v1",)),
    Watched("Workload", KUEUE_GROUP, "workloads", True, KUEUE_VERSIONS),
    Watched("ClusterQueue", KUEUE_GROUP, "clusterqueues", False, KUEUE_VERSIONS),
    Watched("LocalQueue", KUEUE_GROUP, "localqueues", True, KUEUE_VERSIONS),
    Watched("Cohort", KUEUE_GROUP, "cohorts", False, KUEUE_VERSIONS),
    Watched("ResourceFlavor", KUEUE_GROUP, "resourceflavors", False, KUEUE_VERSIONS),
    Watched("Topology", KUEUE_GROUP, "topologies", False, KUEUE_VERSIONS),
    Watched("WorkloadPriorityClass", KUEUE_GROUP, "workloadpriorityclasses", False, KUEUE_VERSIONS),
    Watched("HyperPodPyTorchJob", HYPERPOD_GROUP, "hyperpodpytorchjobs", True, ("v1",), True),
)


@dataclass
class InformerStatus:
    kind: str
    version: str | None
    synced: bool
    last_error: str  # "" while healthy
    lists: int  # complete lists delivered
    relists_gone: int  # lists forced by 410 Gone
    watch_restarts: int  # watches opened again after one ended, cleanly or not
    events: int  # ADDED/MODIFIED/DELETED delivered
    errors: dict[str, int] = field(default_factory=dict)  # bounded reason -> count
    absent: bool = False  # an optional kind the server does not serve (yet)


class _Failure(Exception):
    """A failed step: a bounded reason, a message for the log, and what must be redone."""

    def __init__(
        self, reason: str, message: str, *, relist: bool = False, rediscover: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.relist = relist
        self.rediscover = rediscover


class _Gone(Exception):
    """410: the resourceVersion (or continue token) is older than the server's history."""


class InformerSet:
    """List+watch informers for `watched` kinds, each on its own daemon thread."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        sink: InformerSink,
        watched: Sequence[Watched] = WATCHED,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self._api = api_client
        self._sink = sink
        self._sink_lock = threading.Lock()
        self._stop = threading.Event()
        _widen_connection_pool(api_client, len(watched) + 4)
        self._informers = [
            _Informer(
                api_client,
                w,
                self._deliver_replace,
                self._deliver_apply,
                self._stop,
                page_size=page_size,
                watch_timeout_s=watch_timeout_s,
                backoff_initial=backoff_initial,
                backoff_max=backoff_max,
            )
            for w in watched
        ]
        self._started = False
        self.kinds: tuple[str, ...] = tuple(w.kind for w in watched)
        # The kinds whose first list the model must wait for: an optional kind may never list.
        self.required_kinds: tuple[str, ...] = tuple(w.kind for w in watched if not w.optional)

    def start(self) -> InformerSet:
        """Start every informer; never raises because the server is down."""
        if not self._started:
            self._started = True
            for informer in self._informers:
                informer.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for informer in self._informers:
            informer.interrupt()
        deadline = time.monotonic() + timeout
        for informer in self._informers:
            informer.join(max(0.0, deadline - time.monotonic()))

    def synced(self) -> bool:
        """Every informer has delivered its first complete list."""
        return all(informer.synced.is_set() for informer in self._informers)

    def wait_synced(self, timeout: float) -> bool:
        """Wait until synced(); False after `timeout`, or at once when stopped."""
        deadline = time.monotonic() + timeout
        for informer in self._informers:
            while not informer.synced.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                informer.synced.wait(min(left, 0.1))
        return True

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def status(self) -> list[InformerStatus]:
        return [informer.status() for informer in self._informers]

    def _deliver_replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self._sink_lock:
            self._sink.replace(kind, items)

    def _deliver_apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        with self._sink_lock:
            self._sink.apply(kind, event_type, obj)


class _Informer:
    """One kind: discovery, paged list, watch, and the retry policy around them."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        watched: Watched,
        replace: Callable[[str, list[dict[str, Any]]], None],
        apply: Callable[[str, str, dict[str, Any]], None],
        stop: threading.Event,
        *,
        page_size: int,
        watch_timeout_s: int,
        backoff_initial: float,
        backoff_max: float,
    ) -> None:
        self.watched = watched
        self.synced = threading.Event()
        self._api = api
        self._replace = replace
        self._apply = apply
        self._stop = stop
        self._page_size = page_size
        self._watch_timeout_s = max(1, watch_timeout_s)
        self._backoff_initial = backoff_initial
        self._backoff_max = max(backoff_initial, backoff_max)
        self._lock = threading.Lock()
        self._status = InformerStatus(watched.kind, None, False, "", 0, 0, 0, 0, {})
        self._condition = ""  # the reason last logged, "" while healthy
        self._sink_error = ""
        self._response: urllib3.BaseHTTPResponse | None = None
        self._rv = ""
        self._watched_since_list = False
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{watched.kind}", daemon=True
        )

    # ---- thread control ----

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def interrupt(self) -> None:
        """Unblock a read in progress (stop() was called)."""
        with self._lock:
            response = self._response
        if response is not None:
            # It may have finished or gone back to the pool meanwhile.
            with contextlib.suppress(OSError, ValueError, RuntimeError, NotImplementedError):
                response.shutdown()

    def status(self) -> InformerStatus:
        with self._lock:
            s = self._status
            return InformerStatus(
                s.kind,
                s.version,
                self.synced.is_set(),
                s.last_error,
                s.lists,
                s.relists_gone,
                s.watch_restarts,
                s.events,
                dict(s.errors),
                s.absent,
            )

    # ---- the loop ----

    def _run(self) -> None:
        attempt = 0  # consecutive failures, for the backoff
        need_list = True
        gone_in_a_row = 0
        while not self._stop.is_set():
            try:
                if self._status.version is None:
                    version = self._discover()
                    with self._lock:
                        self._status.version = version
                        self._status.absent = False
                if need_list:
                    self._list()
                    need_list = False
                    attempt = 0
                    self._healthy()
                productive = self._watch()
                gone_in_a_row = 0
                if productive:
                    attempt = 0
                    self._healthy()
                else:  # a server that ends every watch at once must not make us spin
                    self._sleep(self._backoff(attempt))
                    attempt += 1
            except _Gone:
                need_list = True
                gone_in_a_row += 1
                self._count("gone")
                with self._lock:
                    self._status.relists_gone += 1
                self._note("gone", "resourceVersion too old (410 Gone): listing again")
                if gone_in_a_row > 1:
                    self._sleep(self._backoff(attempt))
                    attempt += 1
            except _Failure as failure:
                if self._stop.is_set():
                    break
                self._count(failure.reason)
                if failure.reason == "not_served" and self.watched.optional:
                    with self._lock:
                        self._status.absent = True
                    self.synced.set()  # nothing to wait for; found once it is installed
                self._note(failure.reason, failure.message)
                need_list = need_list or failure.relist or failure.rediscover
                if failure.rediscover:
                    with self._lock:
                        self._status.version = None
                self._sleep(self._backoff(attempt))
                attempt += 1
            except Exception as error:  # a bug must not end the informer silently
                if self._stop.is_set():
                    break
                log.exception("informer %s failed unexpectedly", self.watched.kind)
                self._count("internal")
                self._note("internal", f"unexpected {type(error).__name__}: {error}")
                need_list = True
                self._sleep(self._backoff(attempt))
                attempt += 1

    def _backoff(self, attempt: int) -> float:
        delay = min(self._backoff_max, self._backoff_initial * (2 ** min(attempt, 30)))
        return random.uniform(delay / 2, delay)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    # ---- discovery, list, watch ----

    def _discover(self) -> str:
        """The first preferred version the server serves this resource at."""
        w = self.watched
        if not w.group:
            return w.versions[0]  # the core group is always there
        try:
            group = _json(self._get(f"/apis/{w.group}", [], _LIST_READ_TIMEOUT_S))
        except _Failure as failure:
            if failure.reason != "http_404":
                raise
            raise _Failure(
                "not_served", f"API group {w.group} is not served", rediscover=True
            ) from None
        served = [
            v.get("version")
            for v in group.get("versions", [])
            if isinstance(v, dict) and isinstance(v.get("version"), str)
        ]
        for version in w.versions:
            if version not in served:
                continue
            resources = _json(self._get(f"/apis/{w.group}/{version}", [], _LIST_READ_TIMEOUT_S))
            names = {r.get("name") for r in resources.get("resources", []) if isinstance(r, dict)}
            if w.plural in names:
                return version
        raise _Failure(
            "not_served",
            f"{w.plural}.{w.group} is not served at {'/'.join(w.versions)}"
            f" (the server offers {', '.join(map(str, served)) or 'no version'})",
            rediscover=True,
        )

    def _path(self) -> str:
        w = self.watched
        version = self._status.version
        if not w.group:
            return f"/api/{version}/{w.plural}"
        return f"/apis/{w.group}/{version}/{w.plural}"

    def _list(self) -> None:
        """A complete list, delivered whole through the sink.

        Paged (limit/continue); when a continue token expires before the last page, the
        list starts over unpaged, as client-go's pager does, so that churn faster than the
        pages cannot keep it from ever finishing.
        """
        try:
            items, rv = self._collect(self._page_size)
        except _Gone:
            self._count("expired_continue")
            self._note("expired_continue", "list continue token expired: listing unpaged")
            try:
                items, rv = self._collect(0)
            except _Gone:
                raise _Failure("gone", "unpaged list answered 410", relist=True) from None
        self._rv = rv
        try:
            self._replace(self.watched.kind, items)
        except Exception as error:
            self._sink_failed(error)
        with self._lock:
            self._status.lists += 1
        self._watched_since_list = False
        self.synced.set()

    def _collect(self, page_size: int) -> tuple[list[dict[str, Any]], str]:
        """Every item (pages of `page_size`, 0 for one page) and the list's resourceVersion."""
        path = self._path()
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = [("resourceVersion", "")] if not token else [("continue", token)]
            if page_size > 0:
                query.append(("limit", str(page_size)))
            page = _json(self._get(path, query, _LIST_READ_TIMEOUT_S, not_found=True))
            meta = page.get("metadata")
            page_items = page.get("items")
            if not isinstance(page_items, list) or not isinstance(meta, dict):
                raise _Failure("decode", f"the list of {path} is not a list", relist=True)
            api_version = page.get("apiVersion")
            for item in page_items:
                if isinstance(item, dict):
                    # Built-in types leave kind and apiVersion out of list items; add them so
                    # the sink sees the same shape as in watch events.
                    item.setdefault("kind", self.watched.kind)
                    if isinstance(api_version, str):
                        item.setdefault("apiVersion", api_version)
                    items.append(item)
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _watch(self) -> bool:
        """Watch from the newest resourceVersion; True when the watch was worth having.

        Returns when the stream ends cleanly; raises _Gone for 410, _Failure otherwise.
        """
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._watch_timeout_s)),
            ("resourceVersion", self._rv),
        ]
        with self._lock:
            if self._watched_since_list:
                self._status.watch_restarts += 1
        self._watched_since_list = True
        started = time.monotonic()
        response = self._get(
            self._path(),
            query,
            self._watch_timeout_s + _WATCH_READ_SLACK_S,
            not_found=True,
            watch=True,
        )
        with self._lock:
            # stop() sets the event before it interrupts under this lock: one of us sees the other.
            if self._stop.is_set():
                response.close()
                return True
            self._response = response
        self._healthy()
        delivered = 0
        clean = False
        try:
            for line in _lines(response):
                delivered += self._on_event(line)
            clean = True
        except (ProtocolError, ReadTimeoutError, OSError, HTTPError) as error:
            if self._stop.is_set():
                return True
            reason = "timeout" if isinstance(error, ReadTimeoutError) else "dropped"
            raise _Failure(reason, f"watch stream broke: {_brief(error)}") from None
        finally:
            with self._lock:
                self._response = None
            if clean:
                response.release_conn()  # the connection can serve the next watch
            else:
                response.close()
        lasted = time.monotonic() - started
        return delivered > 0 or lasted >= min(1.0, self._watch_timeout_s / 2)

    def _on_event(self, line: bytes) -> int:
        """Handle one watch event line; return 1 when progress was made (event or bookmark)."""
        try:
            event = json.loads(line)
        except ValueError:
            raise _Failure(
                "decode", "undecodable watch event: listing again", relist=True
            ) from None
        event_type = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict) or not isinstance(event_type, str):
            raise _Failure("decode", "malformed watch event: listing again", relist=True)
        if event_type == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Gone
            reason = _http_reason(code) if isinstance(code, int) else "watch_error"
            raise _Failure(reason, f"watch error: {obj.get('message', obj)}", relist=True)
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(rv, str) and rv:
            self._rv = rv
        if event_type == "BOOKMARK":
            return 1
        if event_type not in _EVENT_TYPES:
            self._count("decode")
            return 0
        try:
            self._apply(self.watched.kind, event_type, obj)
        except Exception as error:
            self._sink_failed(error)
        with self._lock:
            self._status.events += 1
        return 1

    # ---- HTTP through the official client ----

    def _get(
        self,
        path: str,
        query: list[tuple[str, str]],
        read_timeout: float,
        *,
        not_found: bool = False,
        watch: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """GET through the client's call path, body unread; non-2xx become exceptions."""
        try:
            request = self._api.param_serialize(
                "GET",
                path,
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            result = self._api.call_api(
                *request, _request_timeout=(_CONNECT_TIMEOUT_S, read_timeout)
            )
        except (HTTPError, OSError) as error:
            if isinstance(error, ReadTimeoutError) or isinstance(
                getattr(error, "reason", None), ReadTimeoutError
            ):
                raise _Failure("timeout", f"GET {path}: {_brief(error)}") from None
            host = self._api.configuration.host
            raise _Failure("unreachable", f"GET {host}{path}: {_brief(error)}") from None
        except kubernetes.client.ApiException as error:  # the client's own TLS failures
            raise _Failure("unreachable", f"GET {path}: {error.reason}") from None
        response: urllib3.BaseHTTPResponse = result.response
        if 200 <= response.status < 300:
            return response
        try:
            body = response.read()
        except (HTTPError, OSError):
            body = b""
        finally:
            response.release_conn()
        status = response.status
        if status == 410:
            raise _Gone
        message = f"GET {path}: HTTP {status}: {_status_message(body)}"
        if status == 404 and not_found:
            raise _Failure("http_404", message, rediscover=True)
        # Like client-go: a refused or throttled watch is retried, anything else re-lists.
        relist = not watch or status != 429
        raise _Failure(_http_reason(status), message, relist=relist)

    # ---- bookkeeping ----

    def _count(self, reason: str) -> None:
        with self._lock:
            self._status.errors[reason] = self._status.errors.get(reason, 0) + 1

    def _note(self, reason: str, message: str) -> None:
        """Record a problem; log it when the condition changes, not on every retry."""
        with self._lock:
            self._status.last_error = message
        if reason != self._condition:
            log.warning("informer %s: %s", self.watched.kind, message)
            self._condition = reason
        else:
            log.debug("informer %s: %s", self.watched.kind, message)

    def _healthy(self) -> None:
        # Log before clearing: whoever sees last_error == "" also finds the recovery logged.
        if self._condition:
            log.info("informer %s: recovered (%s)", self.watched.kind, self._condition)
            self._condition = ""
        with self._lock:
            self._status.last_error = ""

    def _sink_failed(self, error: Exception) -> None:
        self._count("sink")
        described = f"{type(error).__name__}: {error}"
        if described != self._sink_error:
            log.exception("informer %s: the sink failed (%s)", self.watched.kind, described)
            self._sink_error = described
        else:
            log.debug("informer %s: the sink failed again (%s)", self.watched.kind, described)


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """Newline-delimited watch events, as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        if not chunk:
            continue
        parts = (pending + chunk).split(b"\n")
        pending = parts.pop()
        if len(pending) > MAX_EVENT_BYTES:
            raise _Failure("decode", "watch event larger than the limit", relist=True)
        for part in parts:
            if part.strip():
                yield part
    if pending.strip():
        yield pending


def _json(response: urllib3.BaseHTTPResponse) -> dict[str, Any]:
    try:
        data = response.read()
    except (HTTPError, OSError) as error:
        raise _Failure("dropped", f"response broke: {_brief(error)}") from None
    finally:
        response.release_conn()
    try:
        parsed = json.loads(data)
    except ValueError:
        raise _Failure("decode", f"response is not JSON: {data[:80]!r}", relist=True) from None
    if not isinstance(parsed, dict):
        raise _Failure("decode", "response is not a JSON object", relist=True)
    return parsed


def _http_reason(status: int) -> str:
    if status in _KNOWN_HTTP:
        return f"http_{status}"
    return "http_5xx" if status >= 500 else "http_4xx" if status >= 400 else "http_other"


def _status_message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body[:120].decode("utf-8", "replace") or "(no body)"
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])[:300]
    return "(no message)"


def _brief(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    text = str(reason if reason is not None else error) or type(error).__name__
    return text[:300]


def _widen_connection_pool(api: kubernetes.client.ApiClient, size: int) -> None:
    """Each informer holds a watch connection: with the default pool (5 per CPU), urllib3
    would drop and re-open connections, warning each time. Pools are made per host on
    first use, so raising the size the pool manager hands them suffices."""
    manager = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    settings = getattr(manager, "connection_pool_kw", None)
    if isinstance(settings, dict) and int(settings.get("maxsize") or 1) < size:
        settings["maxsize"] = size
