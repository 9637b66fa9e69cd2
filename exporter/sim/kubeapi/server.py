"""A local kube-apiserver for list and watch: the Kubernetes API the simulation serves.

No kube-apiserver can run here, yet the cluster service must be tested with the official
`kubernetes` client against real HTTP, and the demo must feed the production informers.
`ObjectStore` (exporter.sim.kubeapi.store, re-exported here) keeps objects with one global,
monotonically increasing resourceVersion and a bounded watch history per resource;
`FakeApiServer` serves it on loopback with the documented semantics (Kubernetes API
concepts, "efficient detection of changes"):

- discovery (/api, /api/v1, /apis, /apis/{group}, /apis/{group}/{version});
- GET / POST / PUT (and .../status) / PATCH (merge, JSON and, for built-in types,
  strategic merge applied as merge) / DELETE, with metav1.Status errors;
- paged lists (`limit` + opaque `continue`) that are consistent snapshots at the first
  page's resourceVersion, rebuilt from the watch history; a token older than the history
  answers 410 Expired, like a token older than etcd's compaction;
- chunked watch streams from a resourceVersion, bookmarks, `timeoutSeconds`, and the
  ERROR event with a 410 Expired Status for a resourceVersion older than the history;
- label and field selectors on lists and watches (objects leaving a watched selector
  arrive as DELETED, objects entering it as ADDED);
- Kueue objects stored in v1beta2 and served, or written, at v1beta1 by conversion;
- coordination.k8s.io/v1 Leases, the lock of leader election: a PUT must carry the
  resourceVersion it read, and one that is no longer current answers 409 Conflict (as does a
  create of a name that exists, 409 AlreadyExists), so two candidates cannot both win; their
  acquireTime and renewTime must be MicroTimes (six fraction digits), or 400;
- metadata.managedFields kept per field manager for every create, update and patch
  (exporter.sim.kubeapi.managedfields).

Every resource request is also kept in a bounded log (`FakeApiServer.exchanges`): what was
asked (verb, resource, query) and what was served (status, a list's resourceVersion and
continue token, a watch's events), so that tests can assert the protocol exchange itself.

Deliberate simplifications: no admission or schema validation (namespaces need not exist),
no server-side apply, no graceful deletion (deletes are immediate unless the object has
finalizers), strategic merge patch replaces lists instead of merging them by key, and
`resourceVersion` on a list reads the latest state unless `resourceVersionMatch=Exact`.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import random
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from exporter.sim.kubeapi import managedfields
from exporter.sim.kubeapi.patch import PatchError, json_patch, merge_patch
from exporter.sim.kubeapi.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from exporter.sim.kubeapi.store import (
    COORDINATION_RESOURCES,
    CORE_RESOURCES,
    KUEUE_RESOURCES,
    ConflictError,
    ExpiredError,
    InvalidObjectError,
    Key,
    Match,
    NotFoundError,
    Obj,
    ObjectStore,
    Resource,
    StoredEntry,
    StoredEvent,
    TooLargeError,
)
from exporter.sim.kueue import convert as kueue_convert

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_STATUS_SUBRESOURCE = frozenset(
    {
        "pods",
        "nodes",
        "namespaces",
        "workloads",
        "clusterqueues",
        "localqueues",
        "cohorts",
        "admissionchecks",
    }
)
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_TOO_LARGE_WAIT_S = 3.0  # kube-apiserver waits this long for a future resourceVersion
_WATCH_POLL_S = 0.25
_INITIAL_BATCH = (
    500  # initial ADDED events per chunk  # how often an idle watch looks at drop/stop flags
)
_DEFAULT_WATCH_TIMEOUT_S = (1800, 3600)  # kube-apiserver's randomised --min-request-timeout
_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can"
    " start a new list without the continue parameter, or use the continue token in this"
    " response to retrieve the remainder of the results. Continuing with the provided token"
    " results in an inconsistent list - objects that were created, modified, or deleted"
    " between the time the first chunk was returned and now may show up in the list."
)
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what generateName suffixes are made of
_EXCHANGE_LOG = 4096  # resource requests kept for tests to read back, newest kept
_EXCHANGE_EVENTS = 256  # watch events kept per request, newest kept


# ---------------------------------------------------------------------------------------
# HTTP


class _ApiError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        reason: str = "",
        details: Obj | None = None,
        metadata: Obj | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.metadata = metadata or {}

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": self.metadata,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass(frozen=True, slots=True)
class _Target:
    resource: Resource
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass(frozen=True, slots=True)
class Exchange:
    """One resource request as the server answered it (a snapshot from
    `FakeApiServer.exchanges`).

    `events` are the watch events the stream served, oldest first (at most the newest
    256): (type, resourceVersion) for ADDED, MODIFIED, DELETED and BOOKMARK, and
    ("ERROR", code) for an ERROR event, e.g. ("ERROR", "410") for a resourceVersion older
    than the history.
    """

    seq: int  # order of arrival, over the server's life
    verb: str  # as counted in `requests`: LIST, WATCH, GET, CREATE, UPDATE, PATCH, DELETE...
    resource: str  # the plural, with "/status" for the subresource
    namespace: str | None
    query: dict[str, str]
    status: int  # the HTTP status sent (200 for a watch, whatever its events); 0: none yet
    reason: str  # an error answer's Status reason ("Expired", ...), "" otherwise
    resource_version: str  # a list's metadata.resourceVersion
    continue_token: str  # a list page's metadata.continue, or the one an Expired Status offers
    events: tuple[tuple[str, str], ...]


@dataclass(slots=True, eq=False)
class _Exchange:
    """The live record behind an Exchange; written by the request's thread under the
    server's lock."""

    seq: int
    verb: str
    resource: str
    namespace: str | None
    query: dict[str, str]
    status: int = 0
    reason: str = ""
    resource_version: str = ""
    continue_token: str = ""
    events: collections.deque[tuple[str, str]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_EXCHANGE_EVENTS)
    )

    def snapshot(self) -> Exchange:
        return Exchange(
            self.seq,
            self.verb,
            self.resource,
            self.namespace,
            dict(self.query),
            self.status,
            self.reason,
            self.resource_version,
            self.continue_token,
            tuple(self.events),
        )


@dataclass(slots=True, eq=False)
class _WatchConn:
    sock: socket.socket
    dropped: bool = False


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: FakeApiServer) -> None:
        self.api = api
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Client hang-ups and sockets we shut ourselves are normal; anything else is a bug.
        error = sys.exc_info()[1]
        if isinstance(error, OSError | ValueError) or self.api.stopping:
            log.debug("connection from %s ended: %r", client_address, error)
        else:
            log.exception("simulated API server failed on a request from %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _HTTPServer
    exchange: _Exchange | None = None  # this request in the server's log, once routed

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self.server.api.handle(self, "GET")

    def do_POST(self) -> None:
        self.server.api.handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.api.handle(self, "PUT")

    def do_PATCH(self) -> None:
        self.server.api.handle(self, "PATCH")

    def do_DELETE(self) -> None:
        self.server.api.handle(self, "DELETE")

    def send_body(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        # Logged before it is sent: a client acting on the answer finds it in the log.
        self.server.api.log_answer(self.exchange, code)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, obj: object) -> None:
        self.send_body(code, json.dumps(obj, separators=(",", ":")).encode())

    def read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _ApiError(400, "invalid Content-Length") from None
        return self.rfile.read(length) if length > 0 else b""


class FakeApiServer:
    """Serves an ObjectStore over HTTP on 127.0.0.1 (port 0 = pick one).

    `kueue_versions` are the Kueue API versions served: None for both (v1beta2, v1beta1),
    ("v1beta1",) for an old Kueue, () for a cluster without Kueue. `requests` counts each
    request as "VERB plural" (LIST, WATCH, GET, CREATE, UPDATE, PATCH, DELETE) or
    "DISCOVERY path", and `exchanges()` returns what each resource request asked and was
    served, for tests to assert on.
    """

    def __init__(
        self,
        store: ObjectStore,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 1.0,
        kueue_versions: tuple[str, ...] | None = None,
    ) -> None:
        if host not in _LOOPBACK:
            raise ValueError(f"the simulated API server listens on loopback only, not {host!r}")
        self.store = store
        self.host = host
        self.bookmark_interval = bookmark_interval
        self.kueue_versions = kueue_versions
        self.requests: collections.Counter[str] = collections.Counter()
        self.stopping = False
        self._exchanges: collections.deque[_Exchange] = collections.deque(maxlen=_EXCHANGE_LOG)
        self._sequence = itertools.count(1)
        self._port = port
        self._lock = threading.Lock()
        self._failures: collections.deque[int] = collections.deque()
        self._watches: set[_WatchConn] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> FakeApiServer:
        if self._httpd is not None:
            return self
        self.stopping = False
        self._httpd = _HTTPServer((self.host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-apiserver:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        self.stopping = True
        httpd.shutdown()
        httpd.server_close()
        with httpd.connections_lock:
            connections = list(httpd.connections)
        for conn in connections:
            _shutdown(conn)
        self.store.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    # ---- fault injection ----

    def drop_watches(self) -> None:
        """Cut every open watch stream abruptly, as a dying apiserver or proxy would."""
        with self._lock:
            watches = list(self._watches)
            self._watches.clear()  # open_watches counts the streams still alive
        for watch in watches:
            watch.dropped = True
            _shutdown(watch.sock)
        self.store.wake()

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next `count` requests with `status` and a metav1.Status body."""
        with self._lock:
            self._failures.extend([status] * count)

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    # ---- the exchange log ----

    def exchanges(self, resource: str | None = None) -> list[Exchange]:
        """The resource requests answered so far (the newest 4096), oldest first, as
        snapshots; only those for `resource` (a plural, "pods/status") when given."""
        with self._lock:
            return [
                e.snapshot() for e in self._exchanges if resource is None or e.resource == resource
            ]

    def _log_request(self, verb: str, target: _Target, query: dict[str, str]) -> _Exchange:
        resource = target.resource.plural + (f"/{target.subresource}" if target.subresource else "")
        with self._lock:
            exchange = _Exchange(next(self._sequence), verb, resource, target.namespace, query)
            self._exchanges.append(exchange)
        return exchange

    def log_answer(
        self,
        exchange: _Exchange | None,
        status: int,
        reason: str = "",
        resource_version: str = "",
        continue_token: str = "",
    ) -> None:
        """Record what a request was answered (called before the answer is sent)."""
        if exchange is None:
            return
        with self._lock:
            exchange.status = status
            exchange.reason = reason or exchange.reason
            exchange.resource_version = resource_version or exchange.resource_version
            exchange.continue_token = continue_token or exchange.continue_token

    def _log_events(self, exchange: _Exchange | None, events: list[tuple[str, str]]) -> None:
        if exchange is not None and events:
            with self._lock:
                exchange.events.extend(events)

    def _unlog_events(self, exchange: _Exchange | None, count: int) -> None:
        """Take back the newest `count` events: writing them failed, nobody got them."""
        if exchange is not None:
            with self._lock:
                for _ in range(min(count, len(exchange.events))):
                    exchange.events.pop()

    # ---- request handling ----

    def handle(self, handler: _Handler, method: str) -> None:
        handler.exchange = None  # one handler answers every request of a connection
        try:
            self._handle(handler, method)
        except _ApiError as error:
            self._send_error(handler, error)
        except InvalidObjectError as error:
            self._send_error(handler, _ApiError(422, str(error)))
        except OSError:
            handler.close_connection = True  # the client went away

    def _send_error(self, handler: _Handler, error: _ApiError) -> None:
        fresh = error.metadata.get("continue")
        self.log_answer(
            handler.exchange,
            error.code,
            error.reason,
            continue_token=fresh if isinstance(fresh, str) else "",
        )
        try:
            handler.send_json(error.code, error.status())
        except OSError:
            handler.close_connection = True

    def _handle(self, handler: _Handler, method: str) -> None:
        split = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        parts = [p for p in split.path.split("/") if p]
        body = handler.read_body() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
        if parts in (["healthz"], ["readyz"], ["livez"]):
            handler.send_body(200, b"ok", "text/plain; charset=utf-8")
            return
        if parts == ["version"]:
            self._count("DISCOVERY /version")
            handler.send_json(200, _VERSION_INFO)
            return
        if _is_discovery(parts):
            self._count("DISCOVERY /" + "/".join(parts))
            self._maybe_fail()
            if method != "GET":
                raise _ApiError(405, f"method {method} is not allowed here")
            handler.send_json(200, self._discovery(parts))
            return
        target = self._target(parts)
        verb = self._verb(method, target, query)
        self._count(
            f"{verb} {target.resource.plural}"
            + (f"/{target.subresource}" if target.subresource else "")
        )
        handler.exchange = self._log_request(verb, target, query)
        self._maybe_fail()
        if verb == "WATCH":
            self._watch(handler, target, query)
        elif verb == "LIST":
            handler.send_body(200, self._list(target, query, handler.exchange))
        elif verb == "GET":
            entry = self._existing(target)
            handler.send_body(200, entry.encoded(target.version))
        elif verb == "CREATE":
            manager = managedfields.manager_of(query, handler.headers.get("User-Agent", ""))
            entry = self._create(target, _json_body(body), manager)
            handler.send_body(201, entry.encoded(target.version))
        elif verb in ("UPDATE", "PATCH"):
            patch = _json_body(body, allow_list=True) if verb == "PATCH" else None
            content_type = handler.headers.get("Content-Type", "")
            manager = managedfields.manager_of(query, handler.headers.get("User-Agent", ""))
            entry, _ = self._update(
                target, _json_body(body) if patch is None else None, patch, content_type, manager
            )
            handler.send_body(200, entry.encoded(target.version))
        elif verb == "DELETE":
            options = _json_body(body) if body.strip() else {}
            entry, deleted = self._delete(target, options)
            handler.send_body(200 if deleted else 202, entry.encoded(target.version))
        elif verb == "DELETECOLLECTION":
            handler.send_body(200, self._delete_collection(target, query))

    def _count(self, key: str) -> None:
        with self._lock:
            self.requests[key] += 1

    def _maybe_fail(self) -> None:
        with self._lock:
            code = self._failures.popleft() if self._failures else None
        if code is not None:
            raise _ApiError(code, f"injected failure ({code})")

    # ---- discovery ----

    def _served(self, resource: Resource) -> tuple[str, ...]:
        if resource.group != kueue_convert.GROUP or self.kueue_versions is None:
            return resource.served_versions
        return tuple(v for v in resource.served_versions if v in self.kueue_versions)

    def _group_versions(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for resource in self.store.resources:
            versions = groups.setdefault(resource.group, [])
            for version in self._served(resource):
                if version not in versions:
                    versions.append(version)
        return {g: v for g, v in groups.items() if v}

    def _discovery(self, parts: list[str]) -> Obj:
        groups = self._group_versions()
        if parts == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": groups.get("", []),
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self._port}"}
                ],
            }
        if parts == ["api", "v1"] and "v1" in groups.get("", []):
            return self._resource_list("", "v1")
        if parts == ["apis"]:
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [_api_group(g, v) for g, v in groups.items() if g],
            }
        if len(parts) == 2 and parts[0] == "apis":
            if parts[1] not in groups or not parts[1]:
                raise _ApiError(404, "the server could not find the requested resource")
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                **_api_group(parts[1], groups[parts[1]]),
            }
        if len(parts) == 3 and parts[0] == "apis":
            if parts[2] not in groups.get(parts[1], []):
                raise _ApiError(404, "the server could not find the requested resource")
            return self._resource_list(parts[1], parts[2])
        raise _ApiError(404, "the server could not find the requested resource")

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for r in self.store.resources:
            if r.group != group or version not in self._served(r):
                continue
            resources.append(
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": _VERBS,
                }
            )
            if r.plural in _STATUS_SUBRESOURCE:
                resources.append(
                    {
                        "name": f"{r.plural}/status",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ---- routing ----

    def _target(self, parts: list[str]) -> _Target:
        not_found = _ApiError(404, "the server could not find the requested resource")
        if len(parts) >= 2 and parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise not_found
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise not_found
        resource = next(
            (r for r in self.store.resources if r.group == group and r.plural == rest[0]), None
        )
        if resource is None or version not in self._served(resource):
            raise not_found
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not resource.namespaced:
            raise not_found
        if sub is not None and (sub != "status" or resource.plural not in _STATUS_SUBRESOURCE):
            raise not_found
        if resource.namespaced and name is not None and namespace is None:
            raise not_found
        return _Target(resource, version, namespace, name, sub)

    @staticmethod
    def _verb(method: str, target: _Target, query: dict[str, str]) -> str:
        collection = target.name is None
        if method == "GET":
            if collection:
                return "WATCH" if query.get("watch") in ("true", "1") else "LIST"
            return "GET"
        verbs = {
            ("POST", True): "CREATE",
            ("PUT", False): "UPDATE",
            ("PATCH", False): "PATCH",
            ("DELETE", False): "DELETE",
            ("DELETE", True): "DELETECOLLECTION",
        }
        verb = verbs.get((method, collection))
        everywhere = target.resource.namespaced and target.namespace is None
        if (
            verb is None
            or (target.subresource and verb not in ("UPDATE", "PATCH"))
            or (everywhere and verb in ("CREATE", "DELETECOLLECTION"))
        ):
            raise _ApiError(405, f"the server does not allow {method} on this resource")
        return verb

    # ---- reads ----

    def _existing(self, target: _Target) -> StoredEntry:
        assert target.name is not None
        entry = self.store.entry(target.resource.plural, (target.namespace or "", target.name))
        if entry is None:
            raise _not_found(target)
        return entry

    def _matcher(self, target: _Target, query: dict[str, str]) -> tuple[Match, bool]:
        """The selector predicate for a list or watch, and whether it filters anything."""
        try:
            labels: LabelSelector = parse_label_selector(query.get("labelSelector", ""))
            fields: FieldSelector = parse_field_selector(
                query.get("fieldSelector", ""), target.resource.plural
            )
        except SelectorError as error:
            raise _ApiError(400, str(error)) from None
        namespace = target.namespace

        def match(entry: StoredEntry) -> bool:
            if namespace is not None and entry.key[0] != namespace:
                return False
            return labels.matches(entry.labels) and fields.matches(entry.obj)

        return match, not (labels.empty and fields.empty)

    def _list(
        self, target: _Target, query: dict[str, str], exchange: _Exchange | None = None
    ) -> bytes:
        match, filtered = self._matcher(target, query)
        limit = _int_param(query, "limit")
        token = query.get("continue", "")
        rv_param = query.get("resourceVersion", "")
        at_rv: int | None = None
        after: Key | None = None
        if token:
            if rv_param:
                raise _ApiError(
                    400, "specifying resource version is not allowed when using continue"
                )
            at_rv, after = _decode_continue(token, target.resource)
        elif rv_param and query.get("resourceVersionMatch") == "Exact":
            at_rv = _rv_param(rv_param)
        elif rv_param:
            _rv_param(rv_param)  # "0" and exact values read the latest state, as the cache may
        try:
            page = self.store.list_page(
                target.resource.plural,
                target.namespace,
                at_rv,
                after,
                limit,
                match,
                counted=not filtered,
            )
        except ExpiredError:
            fresh = _encode_continue(0, after, target.resource) if after else ""
            raise _ApiError(
                410, _CONTINUE_EXPIRED, "Expired", metadata={"continue": fresh}
            ) from None
        except TooLargeError:
            raise _ApiError(
                504,
                f"Too large resource version: {at_rv}, current: {self.store.resource_version}",
                "Timeout",
            ) from None
        meta: Obj = {"resourceVersion": str(page.rv)}
        if page.next_key is not None:
            meta["continue"] = _encode_continue(page.rv, page.next_key, target.resource)
            if page.remaining is not None:
                meta["remainingItemCount"] = page.remaining
        self.log_answer(exchange, 200, "", meta["resourceVersion"], meta.get("continue", ""))
        head = json.dumps(
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version(target.version),
                "metadata": meta,
            },
            separators=(",", ":"),
        ).encode()
        items = b",".join(entry.list_item(target.version) for entry in page.entries)
        return head[:-1] + b',"items":[' + items + b"]}"

    # ---- watch ----

    def _watch(self, handler: _Handler, target: _Target, query: dict[str, str]) -> None:
        match, _ = self._matcher(target, query)
        resource = target.resource
        rv_param = query.get("resourceVersion", "")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial_param = query.get("sendInitialEvents")
        if initial_param in ("true", "1") and (
            query.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks
        ):
            raise _ApiError(
                422,
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan "
                "and allowWatchBookmarks=true",
            )
        send_initial = initial_param in ("true", "1") or (
            initial_param is None and rv_param in ("", "0")
        )
        from_rv: int | None = None  # None: begin with the current state as ADDED events
        if not send_initial:
            # "" and "0" without initial events start at the most recent state.
            from_rv = _rv_param(rv_param) if rv_param not in ("", "0") else None
            if from_rv is None:
                from_rv = self.store.resource_version
        timeout = _int_param(query, "timeoutSeconds")
        duration = timeout if timeout > 0 else random.uniform(*_DEFAULT_WATCH_TIMEOUT_S)
        deadline = time.monotonic() + duration
        error: _ApiError | None = None
        cursor, initial, start_rv = 0, list[StoredEntry](), 0
        try:
            cursor, initial, start_rv = self.store.open_watch(
                resource.plural, from_rv, _TOO_LARGE_WAIT_S
            )
        except ExpiredError:
            current = self.store.resource_version
            error = _ApiError(410, f"too old resource version: {from_rv} ({current})", "Expired")
        except TooLargeError:
            error = _ApiError(
                504,
                f"Too large resource version: {from_rv}, current: {self.store.resource_version}",
                "Timeout",
                details={
                    "causes": [
                        {
                            "reason": "ResourceVersionTooLarge",
                            "message": "Too large resource version",
                        }
                    ],
                    "retryAfterSeconds": 1,
                },
            )
        self.log_answer(handler.exchange, 200)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Cache-Control", "no-cache, private")
        handler.end_headers()
        conn = _WatchConn(handler.connection)
        with self._lock:
            self._watches.add(conn)
        try:
            if error is not None:
                self._send_events(
                    handler,
                    b'{"type":"ERROR","object":%s}\n' % json.dumps(error.status()).encode(),
                    [("ERROR", str(error.code))],
                )
            else:
                self._stream(
                    handler,
                    conn,
                    target,
                    match,
                    cursor,
                    initial,
                    bookmarks,
                    deadline,
                    start_rv if send_initial and initial_param in ("true", "1") else None,
                )
            if not conn.dropped:
                handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            handler.close_connection = True
        finally:
            with self._lock:
                self._watches.discard(conn)
        if conn.dropped or self.stopping:
            handler.close_connection = True

    def _stream(
        self,
        handler: _Handler,
        conn: _WatchConn,
        target: _Target,
        match: Match,
        cursor: int,
        initial: list[StoredEntry],
        bookmarks: bool,
        deadline: float,
        initial_end_rv: int | None,
    ) -> None:
        plural, version = target.resource.plural, target.version
        bookmark_head = json.dumps(
            {"kind": target.resource.kind, "apiVersion": target.resource.api_version(version)}
        )[:-1]
        shown = [e for e in initial if match(e)]
        lines = [_event_line("ADDED", e.encoded(version)) for e in shown]
        for start in range(0, len(lines), _INITIAL_BATCH):
            batch = shown[start : start + _INITIAL_BATCH]
            self._send_events(
                handler,
                b"".join(lines[start : start + _INITIAL_BATCH]),
                [("ADDED", str(e.meta.get("resourceVersion", ""))) for e in batch],
            )
        if initial_end_rv is not None:  # sendInitialEvents: say where the initial state ends
            end_marker = '"annotations":{"k8s.io/initial-events-end":"true"}'
            annotated = f',"metadata":{{"resourceVersion":"{initial_end_rv}",{end_marker}}}}}'
            self._send_events(
                handler,
                _event_line("BOOKMARK", (bookmark_head + annotated).encode()),
                [("BOOKMARK", str(initial_end_rv))],
            )
        next_bookmark = time.monotonic() + self.bookmark_interval
        while not conn.dropped and not self.stopping:
            if _peer_closed(conn.sock):
                conn.dropped = True  # nobody to finish the stream for
                return
            now = time.monotonic()
            if now >= deadline:
                return
            wait = min(deadline - now, _WATCH_POLL_S)
            if bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            got = self.store.next_events(plural, cursor, wait)
            if got is None:
                return  # fell behind the history: end the stream, the client re-watches
            events, cursor, store_rv = got
            lines = []
            served: list[tuple[str, str]] = []
            for ev in events:
                line = _filtered(ev, match, version)
                if line:
                    lines.append(line)
                    served.append((_event_type(line), str(ev.rv)))
            if bookmarks and time.monotonic() >= next_bookmark:
                rv_meta = f',"metadata":{{"resourceVersion":"{store_rv}"}}}}'
                lines.append(_event_line("BOOKMARK", (bookmark_head + rv_meta).encode()))
                served.append(("BOOKMARK", str(store_rv)))
                next_bookmark = time.monotonic() + self.bookmark_interval
            if lines and not conn.dropped:
                self._send_events(handler, b"".join(lines), served)

    def _send_events(self, handler: _Handler, data: bytes, served: list[tuple[str, str]]) -> None:
        """One chunk of watch events, logged first: a client acting on them finds them in the
        log; taken back out when the write fails."""
        self._log_events(handler.exchange, served)
        try:
            _chunk(handler, data)
        except OSError:
            self._unlog_events(handler.exchange, len(served))
            raise

    # ---- writes ----

    def _incoming(self, target: _Target, obj: Obj) -> Obj:
        """A request body checked against the URL, converted to the storage version."""
        resource = target.resource
        api_version = obj.get("apiVersion")
        if api_version is not None and api_version != resource.api_version(target.version):
            raise _ApiError(
                400,
                f"the API version in the data ({api_version}) does not match the "
                f"expected API version ({resource.api_version(target.version)})",
            )
        kind = obj.get("kind")
        if kind is not None and kind != resource.kind:
            raise _ApiError(400, f"the object provided is unrecognized (kind {kind!r})")
        if resource.plural == "leases":
            _check_micro_times(resource, obj)
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise _ApiError(400, "metadata must be an object")
        namespace = meta.get("namespace")
        if target.namespace is not None:
            if namespace not in (None, "", target.namespace):
                raise _ApiError(
                    400,
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request",
                )
            meta["namespace"] = target.namespace
        obj = {**obj, "apiVersion": resource.api_version(target.version), "kind": resource.kind}
        if resource.group == kueue_convert.GROUP:
            obj = kueue_convert.convert(obj, resource.version)
        return obj

    def _create(self, target: _Target, body: Obj, manager: str = "unknown") -> StoredEntry:
        resource = target.resource
        obj = self._incoming(target, body)
        meta = obj["metadata"] = dict(obj["metadata"])
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not isinstance(prefix, str) or not prefix:
                raise _ApiError(
                    422, "metadata.name: Required value: name or generateName is required"
                )
            meta["name"] = prefix + "".join(random.choices(_NAME_CHARS, k=5))
        for server_field in (
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
        ):
            meta.pop(server_field, None)
        if resource.plural in _STATUS_SUBRESOURCE:
            obj.pop("status", None)
        obj = managedfields.track(None, obj, manager, None, self.store.timestamp())
        try:
            stored = self.store.prepare(resource, obj)
        except ValueError as error:
            raise _ApiError(422, str(error)) from None
        key = ObjectStore.key_of(resource, stored)

        def build(current: StoredEntry | None) -> Obj:
            if current is not None:
                raise ConflictError
            return stored

        try:
            entry, _ = self.store.write(resource, key, build)
        except ConflictError:
            raise _ApiError(
                409,
                f'{_qualified(resource)} "{key[1]}" already exists',
                "AlreadyExists",
                _details(resource, key[1]),
            ) from None
        return entry

    def _update(
        self,
        target: _Target,
        body: Obj | None,
        patch: Any,
        content_type: str,
        manager: str = "unknown",
    ) -> tuple[StoredEntry, bool]:
        resource = target.resource
        assert target.name is not None
        key = (target.namespace or "", target.name)
        media = content_type.split(";")[0].strip().lower()
        if patch is not None:
            allowed = ["application/json-patch+json", "application/merge-patch+json"]
            if resource.builtin:
                allowed.append("application/strategic-merge-patch+json")
            if media not in allowed:
                raise _ApiError(
                    415,
                    "the body of the request was in an unknown format - accepted "
                    "media types include: " + ", ".join(allowed),
                )

        def build(current: StoredEntry | None) -> Obj | None:
            if current is None:
                raise NotFoundError
            if patch is not None:
                served = json.loads(current.encoded(target.version))
                try:
                    if media == "application/json-patch+json":
                        patched = json_patch(served, patch)
                    else:
                        patched = merge_patch(served, patch)
                except PatchError as error:
                    raise _ApiError(422, str(error)) from None
                if not isinstance(patched, dict):
                    raise _ApiError(422, "the patched object is not a JSON object")
                incoming = self._incoming(target, patched)
                expected_rv = str(patched.get("metadata", {}).get("resourceVersion") or "")
            else:
                assert body is not None
                incoming = self._incoming(target, body)
                expected_rv = str(incoming["metadata"].get("resourceVersion") or "")
                if not expected_rv and resource.group:
                    raise _ApiError(
                        422,
                        "metadata.resourceVersion: Invalid value: 0x0: must be "
                        "specified for an update",
                    )
            meta = incoming["metadata"]
            if meta.get("name") not in (None, target.name):
                raise _ApiError(400, "the name of the object does not match the name on the URL")
            if expected_rv and expected_rv != current.meta.get("resourceVersion"):
                raise ConflictError
            new = _merge_update(current, incoming, target.subresource)
            if new is None:
                return None
            now = self.store.timestamp()
            return managedfields.track(current.obj, new, manager, target.subresource, now)

        try:
            return self.store.write(resource, key, build)
        except NotFoundError:
            raise _not_found(target) from None
        except ConflictError:
            raise _ApiError(
                409,
                f'Operation cannot be fulfilled on {_qualified(resource)} "{target.name}": the '
                "object has been modified; please apply your changes to the latest version and "
                "try again",
                "Conflict",
                _details(resource, target.name),
            ) from None

    def _delete(self, target: _Target, options: Obj) -> tuple[StoredEntry, bool]:
        resource = target.resource
        assert target.name is not None
        key = (target.namespace or "", target.name)
        preconditions = options.get("preconditions") if isinstance(options, dict) else None
        preconditions = preconditions if isinstance(preconditions, dict) else {}

        def build(current: StoredEntry | None) -> Obj | None:
            if current is None:
                raise NotFoundError
            for field in ("uid", "resourceVersion"):
                wanted = preconditions.get(field)
                if wanted and wanted != current.meta.get(field):
                    raise ConflictError
            if not current.meta.get("finalizers"):
                return None
            if current.meta.get("deletionTimestamp"):
                raise _Unchanged(current)
            updated = json.loads(current.encoded(resource.version))
            updated["metadata"]["deletionTimestamp"] = self.store.timestamp()
            updated["metadata"]["deletionGracePeriodSeconds"] = 0
            return dict(updated)

        try:
            return self.store.write(resource, key, build)
        except _Unchanged as unchanged:
            return unchanged.entry, False
        except NotFoundError:
            raise _not_found(target) from None
        except ConflictError:
            raise _ApiError(
                409,
                f'Precondition failed for {_qualified(resource)} "{target.name}"',
                "Conflict",
                _details(resource, target.name),
            ) from None

    def _delete_collection(self, target: _Target, query: dict[str, str]) -> bytes:
        match, _ = self._matcher(target, query)
        page = self.store.list_page(
            target.resource.plural, target.namespace, None, None, 0, match, counted=False
        )
        deleted: list[bytes] = []
        for entry in page.entries:
            sub = _Target(target.resource, target.version, entry.key[0] or None, entry.key[1], None)
            try:
                result, _ = self._delete(sub, {})
            except _ApiError:
                continue  # deleted meanwhile
            deleted.append(result.list_item(target.version))
        head = json.dumps(
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version(target.version),
                "metadata": {"resourceVersion": str(self.store.resource_version)},
            },
            separators=(",", ":"),
        ).encode()
        return head[:-1] + b',"items":[' + b",".join(deleted) + b"]}"


class _Unchanged(Exception):
    def __init__(self, entry: StoredEntry) -> None:
        super().__init__("unchanged")
        self.entry = entry


def _merge_update(current: StoredEntry, incoming: Obj, subresource: str | None) -> Obj | None:
    """The object an update stores: server-owned metadata kept, status or spec split by the
    subresource; None when the update removed the last finalizer of a deleting object."""
    resource = current.resource
    old = current.obj
    if subresource == "status":
        new = dict(old)
        if "status" in incoming:
            new["status"] = incoming["status"]
        else:
            new.pop("status", None)
    else:
        new = dict(incoming)
        if resource.plural in _STATUS_SUBRESOURCE:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
    meta = dict(new.get("metadata") or {}) if subresource != "status" else dict(old["metadata"])
    for kept in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
    ):
        if kept in current.meta:
            meta[kept] = current.meta[kept]
        else:
            meta.pop(kept, None)
    new["metadata"] = meta
    new["apiVersion"] = resource.api_version()
    new["kind"] = resource.kind
    if meta.get("deletionTimestamp") and not meta.get("finalizers"):
        return None
    return new


# ---------------------------------------------------------------------------------------
# helpers


_VERSION_INFO = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-topowatch-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _is_discovery(parts: list[str]) -> bool:
    return parts in (["api"], ["api", "v1"], ["apis"]) or (
        parts[:1] == ["apis"] and len(parts) in (2, 3)
    )


def _api_group(group: str, versions: list[str]) -> Obj:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def _qualified(resource: Resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def _details(resource: Resource, name: str) -> Obj:
    details: Obj = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details


def _not_found(target: _Target) -> _ApiError:
    resource = target.resource
    name = target.name or ""
    return _ApiError(
        404, f'{_qualified(resource)} "{name}" not found', "NotFound", _details(resource, name)
    )


# metav1.MicroTime decodes with time.Parse(RFC3339Micro): exactly six fraction digits and a
# zone, so "2026-11-25T01:00:00+00:00" (Python's isoformat() of a whole second) is refused.
_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")


def _check_micro_times(resource: Resource, obj: Obj) -> None:
    """A Lease's acquireTime and renewTime must be MicroTimes, as kube-apiserver decodes them."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for field in ("acquireTime", "renewTime"):
        value = spec.get(field)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            raise _ApiError(
                400,
                f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f"{resource.kind}: spec.{field}: parsing time {json.dumps(value)} as "
                '"2006-01-02T15:04:05.000000Z07:00": cannot parse',
            )


def _json_body(body: bytes, *, allow_list: bool = False) -> Any:
    try:
        parsed = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as error:
        raise _ApiError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(parsed, dict) and not (allow_list and isinstance(parsed, list)):
        raise _ApiError(400, "the request body must be a JSON object")
    return parsed


def _int_param(query: dict[str, str], name: str) -> int:
    raw = query.get(name, "")
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise _ApiError(400, f"{name}: invalid value {raw!r}: not an integer") from None


def _rv_param(raw: str) -> int:
    try:
        rv = int(raw)
    except ValueError:
        rv = -1
    if rv < 0:
        raise _ApiError(
            400, f"resourceVersion: Invalid value: {raw!r}: must be a non-negative integer"
        )
    return rv


def _encode_continue(rv: int, key: Key, resource: Resource) -> str:
    start = f"{key[0]}/{key[1]}" if resource.namespaced else key[1]
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str, resource: Resource) -> tuple[int | None, Key]:
    """(snapshot RV or None for "latest", last key served) from a continue token."""
    invalid = _ApiError(400, "continue key is not valid: " + token[:64])
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error):
        raise invalid from None
    if (
        not isinstance(raw, dict)
        or raw.get("v") != "meta.k8s.io/v1"
        or not isinstance(raw.get("rv"), int)
        or not isinstance(raw.get("start"), str)
        or not raw["start"].endswith("\x00")
    ):
        raise invalid
    start = raw["start"][:-1]
    if resource.namespaced:
        namespace, sep, name = start.partition("/")
        if not sep:
            raise invalid
        key = (namespace, name)
    else:
        key = ("", start)
    rv = raw["rv"]
    return (rv if rv > 0 else None), key


def _event_line(event_type: str, encoded: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (event_type.encode(), encoded)


def _event_type(line: bytes) -> str:
    """The type of an event line made by _event_line."""
    start = len(b'{"type":"')
    return line[start : line.index(b'"', start)].decode()


def _filtered(event: StoredEvent, match: Match, version: str) -> bytes | None:
    """The event a selector-filtered watcher sees, as a line (None: nothing to see)."""
    now = match(event.entry)
    if event.type == "DELETED":
        return _event_line("DELETED", event.entry.encoded(version)) if now else None
    before = event.prev is not None and match(event.prev)
    if now:
        return _event_line("MODIFIED" if before else "ADDED", event.entry.encoded(version))
    if before:
        return _event_line("DELETED", event.entry.encoded(version))
    return None


def _chunk(handler: _Handler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client hung up: a watch that nobody reads must not linger for an hour."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


__all__ = [
    "COORDINATION_RESOURCES",
    "CORE_RESOURCES",
    "KUEUE_RESOURCES",
    "Exchange",
    "FakeApiServer",
    "InvalidObjectError",
    "ObjectStore",
    "Resource",
]
