"""NodeLabelsWatcher with its real KubeApi client against a small fake API server.

The fake serves just what the watcher asks for, over loopback HTTP/1.1: GET of one Node, and
the Node list with `watch=true` as a chunked stream of newline-delimited watch events, the way
the API server streams them. Tests script changes, failures and 410s on it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from exporter.sources.interfaces import SourceError
from exporter.sources.kube import (
    NodeLabelsWatcher,
    StaticNodeLabels,
    UnreachableNodeLabels,
    failure_reason,
    node_labels_source,
)
from exporter.sources.kubeapi import ApiError, KubeApi

NODE = "ip-10-1-2-3.ec2.internal"
LAYER1 = "topology.k8s.aws/network-node-layer-1"
LAYER2 = "topology.k8s.aws/network-node-layer-2"
LABELS = {LAYER1: "nn-aaa", LAYER2: "nn-bbb", "topology.kubernetes.io/zone": "us-east-2b"}

_END = object()  # queued to a watch stream: finish it


class FakeApiServer:
    """One Node, GET-able and watchable; every behaviour a test needs is a public attribute."""

    def __init__(self, labels: dict[str, str], node: str = NODE) -> None:
        self.node = node
        self.labels = dict(labels)
        self.version = 100
        self.exists = True
        self.get_status: int | None = None  # answer GETs with this error status
        self.watch_status: int | None = None  # answer watch requests with this error status
        self.gone_next_watch = False  # the next watch gets an ERROR 410 event, as if expired
        self.gets = 0
        self.watch_requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._streams: list[queue.Queue[object]] = []
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # --- scripting ---

    def node_object(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "resourceVersion": str(self.version),
                "labels": dict(self.labels),
            },
        }

    def set_labels(self, labels: dict[str, str], *, notify: bool = True) -> None:
        """Change the Node; with `notify`, open watches get a MODIFIED event."""
        with self._lock:
            self.labels = dict(labels)
            self.version += 1
            event = {"type": "MODIFIED", "object": self.node_object()}
            if notify:
                for stream in self._streams:
                    stream.put(event)

    def push(self, event: dict[str, Any] | object) -> None:
        with self._lock:
            for stream in self._streams:
                stream.put(event)

    def expire_watches(self) -> None:
        """What the API server sends when a watch's resourceVersion was compacted away."""
        self.push({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})
        self.push(_END)

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._streams)

    # --- lifecycle ---

    def start(self) -> FakeApiServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        self._httpd = httpd
        return self

    def stop(self) -> None:
        """Become unreachable: stop listening and cut every open connection."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
        self.push(_END)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- used by the handler ---

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def open_stream(self, since: str | None) -> queue.Queue[object]:
        stream: queue.Queue[object] = queue.Queue()
        with self._lock:
            if self.gone_next_watch:
                self.gone_next_watch = False
                stream.put({"type": "ERROR", "object": _status(410, "Expired", "too old")})
                stream.put(_END)
            elif since is None or int(since) < self.version:  # replay what was missed
                kind = "ADDED" if since is None else "MODIFIED"
                stream.put({"type": kind, "object": self.node_object()})
            self._streams.append(stream)
        return stream

    def close_stream(self, stream: queue.Queue[object]) -> None:
        with self._lock:
            self._streams.remove(stream)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like the API server

        def setup(self) -> None:
            super().setup()
            api.track(self.connection, True)

        def finish(self) -> None:
            api.track(self.connection, False)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path == f"/api/v1/nodes/{api.node}" or (
                url.path.startswith("/api/v1/nodes/") and not api.exists
            ):
                self._get_node()
            elif url.path.startswith("/api/v1/nodes/"):
                self._json(404, _status(404, "NotFound", f'nodes "{url.path[14:]}" not found'))
            elif url.path == "/api/v1/nodes" and query.get("watch") == "true":
                self._watch(query)
            else:
                self._json(404, _status(404, "NotFound", "the server could not find it"))

        def _get_node(self) -> None:
            api.gets += 1
            if api.get_status is not None:
                self._json(api.get_status, _status(api.get_status, "InternalError", "injected"))
            elif not api.exists:
                self._json(404, _status(404, "NotFound", f'nodes "{api.node}" not found'))
            else:
                self._json(200, api.node_object())

        def _watch(self, query: dict[str, str]) -> None:
            api.watch_requests.append(query)
            if query.get("fieldSelector") != f"metadata.name={api.node}":
                self._json(400, _status(400, "BadRequest", "unexpected field selector"))
                return
            if api.watch_status is not None:
                self._json(api.watch_status, _status(api.watch_status, "Injected", "injected"))
                return
            deadline = time.monotonic() + float(query.get("timeoutSeconds", "1800"))
            stream = api.open_stream(query.get("resourceVersion"))
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while time.monotonic() < deadline:
                    try:
                        event = stream.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    if event is _END:
                        break
                    self._chunk(json.dumps(event).encode() + b"\n")
                self._chunk(b"")
            except OSError:
                pass  # the client went away
            finally:
                api.close_stream(stream)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def wait_for(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer(LABELS).start()
    yield fake
    fake.stop()


WatcherFactory = Callable[..., NodeLabelsWatcher]


@pytest.fixture
def make_watcher(server: FakeApiServer) -> Iterator[WatcherFactory]:
    made: list[NodeLabelsWatcher] = []

    def make(node: str = NODE, **kwargs: Any) -> NodeLabelsWatcher:
        options: dict[str, Any] = {
            "refresh_seconds": 0.3,
            "initial_backoff_seconds": 0.05,
            "max_backoff_seconds": 0.2,
            "request_timeout_seconds": 10.0,  # a loaded machine must not fail a plain GET
        }
        options.update(kwargs)
        watcher = NodeLabelsWatcher(node, api=KubeApi(host=server.host), **options)
        made.append(watcher)
        return watcher.start()

    yield make
    for watcher in made:
        watcher.close()


def test_reads_labels_then_watches_from_their_version(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    assert watcher.labels() == LABELS
    wait_for(lambda: server.open_watches == 1)
    request = server.watch_requests[0]
    assert request["resourceVersion"] == "100"
    assert request["fieldSelector"] == f"metadata.name={NODE}"
    assert int(request["timeoutSeconds"]) > 0  # ended by the server, then resumed
    assert request["watch"] == "true"
    assert request["allowWatchBookmarks"] == "true"
    assert watcher.drain_errors() == []
    assert watcher.last_error is None


def test_labels_are_copies(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    labels = watcher.labels()
    assert isinstance(labels, dict)
    labels.clear()
    assert watcher.labels() == LABELS


def test_modified_event_shows_up_through_the_watch(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher(refresh_seconds=60.0)  # only the watch can deliver it in time
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    gets = server.gets
    moved = {**LABELS, LAYER2: "nn-ccc"}
    server.set_labels(moved)
    wait_for(lambda: watcher.labels() == moved)
    assert server.gets == gets  # no GET was needed


def test_server_ending_the_watch_resumes_from_last_version(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher(watch_timeout_seconds=1)
    assert watcher.wait_ready(10.0)
    server.set_labels({**LABELS, LAYER1: "nn-new"})
    wait_for(lambda: len(server.watch_requests) >= 2)
    assert server.watch_requests[1]["resourceVersion"] == "101"
    assert server.gets == 1
    assert watcher.drain_errors() == []


def test_server_error_keeps_last_labels_and_counts(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    server.get_status = server.watch_status = 500
    server.push(_END)  # the open watch ends; re-watching and re-reading now fail
    wait_for(lambda: watcher.errors_total >= 3)
    assert watcher.labels() == LABELS
    assert watcher.last_success is not None
    errors = watcher.drain_errors()
    assert errors and set(errors) == {"server_error"}
    assert watcher.last_error is not None and "500" in watcher.last_error

    server.get_status = server.watch_status = None
    moved = {**LABELS, LAYER1: "nn-zzz"}
    server.set_labels(moved, notify=False)
    wait_for(lambda: watcher.labels() == moved)
    wait_for(lambda: watcher.last_error is None)


def test_unreachable_server_keeps_last_labels_then_recovers(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    server.stop()
    wait_for(lambda: watcher.errors_total >= 2)
    assert watcher.labels() == LABELS
    assert "unavailable" in watcher.drain_errors()

    moved = {**LABELS, LAYER1: "nn-after-restart"}
    server.set_labels(moved, notify=False)
    server.start()  # same port
    wait_for(lambda: watcher.labels() == moved)
    wait_for(lambda: server.open_watches == 1)


def test_node_not_found(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    watcher = make_watcher("no-such-node")
    assert not watcher.wait_ready(10.0)
    with pytest.raises(SourceError) as info:
        watcher.labels()
    assert info.value.reason == "not_found"
    assert "no-such-node" in str(info.value)
    assert "not_found" in watcher.drain_errors()


def test_node_deleted_keeps_labels_and_reports_not_found(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    server.exists = False
    server.push({"type": "DELETED", "object": server.node_object()})
    wait_for(lambda: "not_found" in (watcher.last_error or ""))
    assert watcher.labels() == LABELS


def test_forbidden_before_any_read(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    server.get_status = 403
    watcher = make_watcher()
    assert not watcher.wait_ready(10.0)
    with pytest.raises(SourceError) as info:
        watcher.labels()
    assert info.value.reason == "forbidden"


def test_gone_relists_and_continues(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    watcher = make_watcher(refresh_seconds=60.0)
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    moved = {**LABELS, LAYER2: "nn-missed"}
    server.set_labels(moved, notify=False)  # a change the watch never delivers
    server.expire_watches()
    wait_for(lambda: watcher.labels() == moved)
    assert server.gets == 2  # the re-list
    # and watching again, from the new version
    wait_for(lambda: len(server.watch_requests) == 2 and server.open_watches == 1)
    assert server.watch_requests[-1]["resourceVersion"] == "101"
    assert watcher.drain_errors() == []  # expiry is routine, not an error

    after = {**moved, LAYER1: "nn-later"}
    server.set_labels(after)
    wait_for(lambda: watcher.labels() == after)  # through the watch: the refresh is 60 s


def test_gone_on_a_fresh_watch(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    server.gone_next_watch = True
    watcher = make_watcher(refresh_seconds=60.0)
    assert watcher.wait_ready(10.0)
    wait_for(lambda: len(server.watch_requests) == 2 and server.open_watches == 1)
    assert server.gets == 2
    assert watcher.drain_errors() == []


def test_watch_forbidden_falls_back_to_periodic_get(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    server.watch_status = 403
    watcher = make_watcher(refresh_seconds=0.2)
    assert watcher.wait_ready(10.0)
    moved = {**LABELS, LAYER1: "nn-polled"}
    server.set_labels(moved, notify=False)
    wait_for(lambda: watcher.labels() == moved)
    assert "forbidden" in watcher.drain_errors()


def test_without_watch_polls_with_get(server: FakeApiServer, make_watcher: WatcherFactory) -> None:
    watcher = make_watcher(use_watch=False, refresh_seconds=0.1)
    assert watcher.wait_ready(10.0)
    moved = {**LABELS, LAYER1: "nn-polled"}
    server.set_labels(moved, notify=False)
    wait_for(lambda: watcher.labels() == moved)
    assert server.watch_requests == []
    assert watcher.drain_errors() == []


def test_close_is_prompt_with_an_open_watch(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher(watch_timeout_seconds=300)
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    watcher.close()
    # Cut, not waited out: left alone, the thread would read the quiet watch for 300 s.
    assert watcher._thread is not None
    watcher._thread.join(10.0)
    assert not watcher._thread.is_alive()


def test_close_is_prompt_while_backing_off(make_watcher: WatcherFactory) -> None:
    watcher = make_watcher("no-such-node", initial_backoff_seconds=30.0, max_backoff_seconds=30.0)
    assert not watcher.wait_ready(10.0)
    wait_for(lambda: watcher.errors_total >= 1)  # the 404 is in: the thread backs off 30 s
    watcher.close()
    assert watcher._thread is not None
    watcher._thread.join(10.0)  # woken from its 30 s pause, not left to sleep it out
    assert not watcher._thread.is_alive()


def test_bookmark_moves_the_resume_version(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    bookmark = {"kind": "Node", "metadata": {"resourceVersion": "150"}}
    server.push({"type": "BOOKMARK", "object": bookmark})
    server.push(_END)  # the server ends the watch: resume from the bookmark
    wait_for(lambda: len(server.watch_requests) >= 2)
    assert server.watch_requests[1]["resourceVersion"] == "150"
    assert watcher.labels() == LABELS
    assert watcher.drain_errors() == []


def test_undecodable_event_is_a_bad_response(
    server: FakeApiServer, make_watcher: WatcherFactory
) -> None:
    watcher = make_watcher()
    assert watcher.wait_ready(10.0)
    wait_for(lambda: server.open_watches == 1)
    server.push({"type": "MODIFIED", "object": {"metadata": {"labels": ["not", "a", "map"]}}})
    wait_for(lambda: watcher.errors_total >= 1)
    assert watcher.drain_errors()[0] == "bad_response"
    assert watcher.labels() == LABELS


def test_failure_reasons() -> None:
    assert failure_reason(ApiError(404, "not_found", "HTTP 404")) == "not_found"
    assert failure_reason(ApiError(None, "timeout", "read timed out")) == "timeout"
    assert failure_reason(ValueError("bad json")) == "bad_response"
    assert failure_reason(RuntimeError("boom")) == "error"


def test_without_configuration_the_source_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    source = node_labels_source(NODE)
    assert isinstance(source, UnreachableNodeLabels)
    with pytest.raises(SourceError) as info:
        source.labels()
    assert info.value.reason == "unavailable"
    assert "in-cluster" in str(info.value) and "kubeconfig" in str(info.value)


def test_default_configuration_from_kubeconfig(
    server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": {"server": server.host}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(config))
    source = node_labels_source(NODE)
    try:
        assert isinstance(source, NodeLabelsWatcher)
        assert source.wait_ready(10.0)
        assert source.labels() == LABELS
    finally:
        source.close()


def test_static_labels() -> None:
    source = StaticNodeLabels({LAYER1: "a"})
    got = source.labels()
    assert got == {LAYER1: "a"}
    source.set({LAYER1: "b"})
    assert source.labels() == {LAYER1: "b"}
    assert got == {LAYER1: "a"}
    source.close()
