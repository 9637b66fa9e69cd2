"""KubeApi against small local API servers: configuration, TLS, errors, watch streams.

The servers are real HTTP/1.1 (and, where a test is about credentials, real TLS with
certificates made by the openssl CLI), so what is checked is what goes over the wire.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.sources.kubeapi import ApiError, KubeApi, KubeConfigError

TOKEN = "s3cr3t-token-never-logged"
NODE = {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"}}}

Respond = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        with contextlib.suppress(OSError):  # the client went away
            self.server.respond(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_json(self, code: int, body: object) -> None:
        self.send_bytes(code, json.dumps(body).encode())

    def send_bytes(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class FakeServer(ThreadingHTTPServer):
    """Answers every GET with `respond`; records (path, Authorization) of each request."""

    daemon_threads = True

    def __init__(self, respond: Respond, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.respond = respond
        self.seen: list[tuple[str, str | None]] = []
        self.release = threading.Event()  # blocked handlers wait on it; set at shutdown
        if tls is not None:  # handshake in the handler thread, not in the accept loop
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self.server_address[1]

    def __enter__(self) -> FakeServer:
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


def status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "status": "Failure", "message": message, "code": code}


def ok(body: object = NODE) -> Respond:
    return lambda h: h.send_json(200, body)


def bearer(expected: str, body: object = NODE) -> Respond:
    """200 for the expected token, 401 for any other, as the API server does."""

    def respond(h: Handler) -> None:
        if h.headers.get("Authorization") == f"Bearer {expected}":
            h.send_json(200, body)
        else:
            h.send_json(401, status(401, "Unauthorized"))

    return respond


# --- certificates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.ca)
        return ctx


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.crt", "-days", "2",
             "-subj", "/CN=topowatch-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, usage, san in (
        ("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"),
        ("client", "clientAuth", ""),
    ):
        ext = d / f"{name}.ext"
        ext.write_text(
            f"{san}basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        )
        _openssl("req", *ec, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr",
                 "-subj", f"/CN=topowatch-test-{name}")  # fmt: skip
        _openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.crt",
                 "-CAkey", d / "ca.key", "-set_serial", str(len(name)), "-days", "2",
                 "-out", d / f"{name}.crt", "-extfile", ext)  # fmt: skip
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


# --- in-cluster ----------------------------------------------------------------------------------


def service_account(tmp_path: Path, pki: Pki, token: str) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    shutil.copy(pki.ca, sa / "ca.crt")
    return sa


def test_in_cluster_uses_service_account_token_and_ca(tmp_path: Path, pki: Pki) -> None:
    sa = service_account(tmp_path, pki, TOKEN + "\n")
    with FakeServer(bearer(TOKEN), pki.server_context()) as srv:
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(srv.port)}
        with KubeApi.in_cluster(env=env, sa_dir=str(sa)) as api:
            assert api.host == f"https://127.0.0.1:{srv.port}"
            assert api.get("/api/v1/nodes/n1") == NODE
    assert srv.seen == [("/api/v1/nodes/n1", f"Bearer {TOKEN}")]


def test_in_cluster_picks_up_a_rotated_token_on_401(tmp_path: Path, pki: Pki) -> None:
    sa = service_account(tmp_path, pki, "token-1")
    with FakeServer(bearer("token-1"), pki.server_context()) as srv:
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(srv.port)}
        with KubeApi.in_cluster(env=env, sa_dir=str(sa)) as api:
            api.get("/api/v1/nodes/n1")
            (sa / "token").write_text("token-2")  # the kubelet rotated it; the old one expired
            srv.respond = bearer("token-2")
            assert api.get("/api/v1/nodes/n1") == NODE  # 401, re-read, retried once
    assert [auth for _, auth in srv.seen] == ["Bearer token-1", "Bearer token-1", "Bearer token-2"]


def test_token_file_is_re_read_periodically(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    with FakeServer(ok()) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}", token_file=str(token_file))
        fresh = KubeApi(
            f"http://127.0.0.1:{srv.port}", token_file=str(token_file), token_refresh_seconds=0
        )
        token_file.write_text("token-2")
        api.get("/x")  # within the minute: the token read at start
        fresh.get("/x")  # refresh period over: read again, no 401 needed
        token_file.unlink()  # a failed re-read keeps the token it had
        fresh.get("/x")
    assert [auth for _, auth in srv.seen] == ["Bearer token-1", "Bearer token-2", "Bearer token-2"]


def test_unchanged_token_401_is_unauthorized(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    with FakeServer(bearer("other")) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}", token_file=str(token_file))
        with pytest.raises(ApiError) as info:
            api.get("/api/v1/nodes/n1")
    assert (info.value.status, info.value.reason) == (401, "unauthorized")
    assert len(srv.seen) == 1  # no retry with the same token


def test_in_cluster_needs_the_environment_and_files(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubeApi.in_cluster(env={}, sa_dir=str(tmp_path))
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match=r"ca\.crt"):
        KubeApi.in_cluster(env=env, sa_dir=str(tmp_path))
    shutil.copy(pki.ca, tmp_path / "ca.crt")
    with pytest.raises(KubeConfigError, match="token"):
        KubeApi.in_cluster(env=env, sa_dir=str(tmp_path))
    (tmp_path / "token").write_text("t")
    assert KubeApi.in_cluster(env=env, sa_dir=str(tmp_path)).host == "https://[fd00::1]:443"


# --- kubeconfig ----------------------------------------------------------------------------------


def kubeconfig(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], name: str = "config"
) -> Path:
    path = tmp_path / name
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere", "user": "nobody"}},
            {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
        ],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_kubeconfig_token_and_ca_data(tmp_path: Path, pki: Pki) -> None:
    with FakeServer(bearer(TOKEN), pki.server_context()) as srv:
        server = f"https://127.0.0.1:{srv.port}"
        cluster = {"server": server, "certificate-authority-data": b64(pki.ca)}
        path = kubeconfig(tmp_path, cluster, {"token": TOKEN})
        with KubeApi.from_kubeconfig(path) as api:
            assert api.get("/api/v1/nodes/n1") == NODE
    assert srv.seen[0][1] == f"Bearer {TOKEN}"


def test_kubeconfig_client_certificate_data(tmp_path: Path, pki: Pki) -> None:
    cluster = {"certificate-authority-data": b64(pki.ca)}
    user = {"client-certificate-data": b64(pki.client_cert), "client-key-data": b64(pki.client_key)}
    with FakeServer(ok(), pki.server_context(require_client_cert=True)) as srv:
        path = kubeconfig(tmp_path, {**cluster, "server": f"https://127.0.0.1:{srv.port}"}, user)
        api = KubeApi.from_kubeconfig(path)
        temp = list(api._temp_files)
        assert len(temp) == 3  # CA, certificate, key
        for file in temp:
            assert stat.S_IMODE(os.stat(file).st_mode) == 0o600
        assert api.get("/api/v1/nodes/n1") == NODE  # the server checked our certificate
        api.close()
    assert srv.seen[0][1] is None  # no token was configured
    assert not any(os.path.exists(file) for file in temp)


def test_kubeconfig_relative_files_and_kubeconfig_env(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(pki.ca, tmp_path / "ca.crt")
    shutil.copy(pki.client_cert, tmp_path / "me.crt")
    shutil.copy(pki.client_key, tmp_path / "me.key")
    user = {"client-certificate": "me.crt", "client-key": "me.key"}
    with FakeServer(ok(), pki.server_context(require_client_cert=True)) as srv:
        cluster = {"server": f"https://127.0.0.1:{srv.port}", "certificate-authority": "ca.crt"}
        path = kubeconfig(tmp_path, cluster, user)
        monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), str(path)]))
        monkeypatch.chdir("/")
        with KubeApi.from_kubeconfig() as api:
            assert api.get("/api/v1/nodes/n1") == NODE


def test_kubeconfig_insecure_skip_tls_verify(tmp_path: Path, pki: Pki) -> None:
    with FakeServer(ok(), pki.server_context()) as srv:
        server = f"https://127.0.0.1:{srv.port}"
        verified = kubeconfig(tmp_path, {"server": server}, {}, "verified")
        with KubeApi.from_kubeconfig(verified) as api, pytest.raises(ApiError) as info:
            api.get("/api/v1/nodes/n1")  # our test CA is not a system CA
        assert (info.value.status, info.value.reason) == (None, "unavailable")
        assert "certificate" in info.value.message.lower()
        path = kubeconfig(tmp_path, {"server": server, "insecure-skip-tls-verify": True}, {})
        with KubeApi.from_kubeconfig(path) as api:
            assert api.get("/api/v1/nodes/n1") == NODE


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (
            {"exec": {"command": "aws", "args": ["eks", "get-token"], "apiVersion": "v1beta1"}},
            "exec plugin (aws)",
        ),
        ({"auth-provider": {"name": "oidc", "config": {}}}, "'oidc' auth-provider"),
        ({"username": "admin", "password": "pw"}, "basic auth"),
    ],
)
def test_kubeconfig_plugins_are_refused_clearly(
    tmp_path: Path, user: dict[str, Any], expected: str
) -> None:
    path = kubeconfig(tmp_path, {"server": "https://example.invalid"}, user)
    with pytest.raises(KubeConfigError) as info:
        KubeApi.from_kubeconfig(path)
    message = str(info.value)
    assert expected in message and "'u'" in message and str(path) in message


def test_kubeconfig_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        KubeApi.from_kubeconfig(tmp_path / "absent")
    bad = tmp_path / "bad"
    bad.write_text("{ not: yaml: at all")
    with pytest.raises(KubeConfigError, match="not valid YAML"):
        KubeApi.from_kubeconfig(bad)
    no_server = kubeconfig(tmp_path, {}, {"token": "t"}, "no-server")
    with pytest.raises(KubeConfigError, match="no server"):
        KubeApi.from_kubeconfig(no_server)
    with pytest.raises(KubeConfigError, match="no context named 'nope'"):
        KubeApi.from_kubeconfig(no_server, context="nope")
    bad_data = kubeconfig(
        tmp_path, {"server": "https://x", "certificate-authority-data": "%%%"}, {}, "bad-data"
    )
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("topowatch-kube-*"))
    with pytest.raises(KubeConfigError, match="base64"):
        KubeApi.from_kubeconfig(bad_data)
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("topowatch-kube-*")) == before


def test_default_says_what_it_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(KubeConfigError) as info:
        KubeApi.default()
    assert "in-cluster: KUBERNETES_SERVICE_HOST" in str(info.value)
    assert f"kubeconfig: none of the files in KUBECONFIG exist: {tmp_path / 'absent'}" in str(
        info.value
    )


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (400, "http_error"),
        (401, "unauthorized"),
        (403, "forbidden"),
        (404, "not_found"),
        (410, "gone"),
        (418, "http_error"),
        (429, "throttled"),
        (500, "server_error"),
        (503, "server_error"),
    ],
)
def test_http_errors_map_to_reasons(code: int, reason: str) -> None:
    with FakeServer(lambda h: h.send_json(code, status(code, 'nodes "n1" says no'))) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}")
        with pytest.raises(ApiError) as info:
            api.get("/api/v1/nodes/n1")
        assert (info.value.status, info.value.reason) == (code, reason)
        assert f"HTTP {code}" in str(info.value) and 'nodes "n1" says no' in str(info.value)
        with pytest.raises(ApiError) as streamed:  # a watch fails before its first event
            api.stream("/api/v1/nodes", {"watch": True}, timeout=5)
        assert (streamed.value.status, streamed.value.reason) == (code, reason)


def test_non_json_error_body_is_quoted_briefly() -> None:
    html = b"<html>" + b"proxy says no " * 100 + b"</html>"
    with FakeServer(lambda h: h.send_bytes(502, html)) as srv, pytest.raises(ApiError) as info:
        KubeApi(f"http://127.0.0.1:{srv.port}").get("/x")
    assert info.value.reason == "server_error"
    assert "proxy says no" in info.value.message and len(info.value.message) < 300


def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with pytest.raises(ApiError) as info:
        KubeApi(f"http://127.0.0.1:{port}").get("/api/v1/nodes/n1", timeout=1)
    assert (info.value.status, info.value.reason) == (None, "unavailable")


def test_slow_answer_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(h: Handler) -> None:
        h.server.release.wait(5)  # and no answer

    with FakeServer(slow) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}")
        timeouts: list[Any] = []
        request = api._pool.request

        def recording(*args: Any, **kwargs: Any) -> Any:
            timeouts.append(kwargs["timeout"])
            return request(*args, **kwargs)

        monkeypatch.setattr(api._pool, "request", recording)
        with pytest.raises(ApiError) as info:
            api.get("/x", timeout=0.2)
    # The client gave up by itself, on the caller's deadline for the connect and for each wait
    # for data: checked as what it asked urllib3 for, not by timing the call.
    assert (info.value.status, info.value.reason) == (None, "timeout")
    assert [(t.connect_timeout, t.read_timeout) for t in timeouts] == [(0.2, 0.2)]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_bad_json_is_a_bad_response(body: bytes) -> None:
    with FakeServer(lambda h: h.send_bytes(200, body)) as srv, pytest.raises(ApiError) as info:
        KubeApi(f"http://127.0.0.1:{srv.port}").get("/x")
    assert (info.value.status, info.value.reason) == (200, "bad_response")


def test_query_parameters_are_encoded() -> None:
    with FakeServer(ok()) as srv:
        KubeApi(f"http://127.0.0.1:{srv.port}/").get(
            "/api/v1/nodes",
            {"fieldSelector": "metadata.name=n1", "watch": True, "resourceVersion": None, "n": 3},
        )
    assert srv.seen[0][0] == "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&watch=true&n=3"


def test_bad_hosts_are_refused() -> None:
    with pytest.raises(ValueError):
        KubeApi("ftp://example.com")
    with pytest.raises(ValueError):
        KubeApi("http://x", token="a", token_file="/b")


# --- watch streams -------------------------------------------------------------------------------


def events(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "MODIFIED", "object": {"metadata": {"resourceVersion": str(i), "note": "é" * i}}}
        for i in range(n)
    ]


def test_watch_events_split_across_chunks() -> None:
    wanted = events(5)
    data = b"".join(json.dumps(e, ensure_ascii=False).encode() + b"\n" for e in wanted)
    data = data.replace(b"\n", b"\n\n", 1)  # a blank line is skipped
    cuts = [0, 3, 4, 60, 61, len(data) - 30, len(data) - 1, len(data)]  # mid-line, mid-UTF-8
    go_on = threading.Event()
    rest_sent = threading.Event()

    def respond(h: Handler) -> None:
        h.start_chunked()
        h.chunk(data[: data.index(b"\n") + 1])  # the first event alone, then wait
        go_on.wait(30)
        rest = data[data.index(b"\n") + 1 :]
        for a, b in itertools.pairwise(cuts):
            if rest[a:b]:
                h.chunk(rest[a:b])
        h.chunk(b"")
        rest_sent.set()

    with FakeServer(respond) as srv:
        stream = KubeApi(f"http://127.0.0.1:{srv.port}").stream("/w", {"watch": True}, timeout=9)
        assert next(stream) == wanted[0]
        assert not rest_sent.is_set()  # read as it arrived, not when the response ended
        go_on.set()
        assert list(stream) == wanted[1:]
        stream.close()


def test_watch_without_chunked_encoding() -> None:
    """An HTTP/1.0-style proxy answer: no chunks, the body ends with the connection."""

    def respond(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b"".join(json.dumps(e).encode() + b"\n" for e in events(3)))
        h.close_connection = True

    with (
        FakeServer(respond) as srv,
        KubeApi(f"http://127.0.0.1:{srv.port}").stream("/w", timeout=5) as stream,
    ):
        assert list(stream) == events(3)


def test_bad_event_in_a_stream_is_a_bad_response() -> None:
    def respond(h: Handler) -> None:
        h.start_chunked()
        h.chunk(json.dumps(events(1)[0]).encode() + b"\n{torn\n")
        h.chunk(b"")

    with FakeServer(respond) as srv:
        stream = KubeApi(f"http://127.0.0.1:{srv.port}").stream("/w", timeout=5)
        assert next(stream) == events(1)[0]
        with pytest.raises(ApiError) as info:
            next(stream)
        assert (info.value.status, info.value.reason) == (200, "bad_response")


def test_silent_stream_times_out() -> None:
    def respond(h: Handler) -> None:
        h.start_chunked()
        h.server.release.wait(5)

    with FakeServer(respond) as srv:
        stream = KubeApi(f"http://127.0.0.1:{srv.port}").stream("/w", timeout=0.2)
        with pytest.raises(ApiError) as info:
            list(stream)
    assert (info.value.status, info.value.reason) == (None, "timeout")


def test_close_interrupts_a_blocked_stream_promptly() -> None:
    def respond(h: Handler) -> None:
        h.start_chunked()
        h.chunk(json.dumps(events(1)[0]).encode() + b"\n")
        h.server.release.wait(10)  # then nothing: a quiet watch

    with FakeServer(respond) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}")
        stream = api.stream("/w", timeout=60)
        got: list[dict[str, Any]] = []
        failed: list[BaseException] = []

        def read() -> None:
            try:
                got.extend(stream)
            except BaseException as e:
                failed.append(e)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the reader is now blocked waiting for the next event
        stream.close()
        # Without close() the reader stays blocked until the 60 s read timeout: the server sends
        # nothing more and keeps the connection open.
        reader.join(10.0)
        assert not reader.is_alive()
        assert got == events(1) and failed == []  # ended quietly, as asked
        stream.close()  # twice is fine
        srv.respond = ok()
        assert api.get("/x") == NODE  # and the client still works


def test_close_before_reading() -> None:
    def respond(h: Handler) -> None:
        h.start_chunked()
        h.server.release.wait(10)

    with FakeServer(respond) as srv:
        stream = KubeApi(f"http://127.0.0.1:{srv.port}").stream("/w", timeout=60)
        stream.close()
        assert list(stream) == []


# --- secrets -------------------------------------------------------------------------------------


def test_token_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # urllib3's own debug lines included
    seen: list[str] = []

    def respond(h: Handler) -> None:
        if h.path.startswith("/w"):
            h.start_chunked()
            h.chunk(b'{"type": "ADDED", "object": {}}\n{oops\n')
            h.chunk(b"")
        else:
            code = int(h.path.strip("/"))
            h.send_json(code, status(code, "no"))

    with FakeServer(respond) as srv:
        api = KubeApi(f"http://127.0.0.1:{srv.port}", token=TOKEN)
        seen.append(repr(api))
        for code in (401, 403, 500):
            with pytest.raises(ApiError) as info:
                api.get(f"/{code}")
            seen += [str(info.value), repr(info.value)]
        with pytest.raises(ApiError) as info:
            list(api.stream("/w", timeout=5))
        seen.append(str(info.value))
    with pytest.raises(ApiError) as info:  # the server is gone
        api.get("/x", timeout=0.5)
    seen.append(str(info.value))
    assert caplog.text  # something was logged, and it held no secret
    for text in [caplog.text, *seen]:
        assert TOKEN not in text
        assert "Bearer" not in text


def test_the_node_agent_does_not_import_the_kubernetes_package() -> None:
    """The point of this client: `kubernetes.client` alone costs the agent ~25 MiB of RSS."""
    code = (
        "import sys, exporter.sources.kube\n"
        "print([m for m in sys.modules if m.split('.')[0] == 'kubernetes'])"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=root
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
