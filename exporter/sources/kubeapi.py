"""A minimal Kubernetes API client over urllib3 that returns plain dicts.

The node agent reads one thing from the API server, its own Node, and writes its health report
there (a condition, an annotation, an Event). `kubernetes.client` costs about 25 MiB of RSS
just to import (its package imports every generated model), which is too much for an agent on
every GPU node. This client does only what the agent needs: GET and watch (newline-delimited
JSON over a chunked response), PATCH and POST, with the credentials of a pod's service
account or of a kubeconfig, and errors mapped to short, bounded reasons for the error metric.

Retries are the caller's business (urllib3's are off), and tokens never reach a log line or an
exception message.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlencode

import urllib3
from urllib3.response import BaseHTTPResponse
from urllib3.util import parse_url

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REFRESH_SECONDS = 60.0  # bound service-account tokens rotate; client-go re-reads each minute
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one watch event; a line without end must not eat the node
_ERROR_BODY_CHARS = 200

_STATUS_REASONS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    410: "gone",
    429: "throttled",
}

Params = Mapping[str, str | int | bool | None]


class KubeConfigError(Exception):
    """No usable API configuration: not in a cluster, no kubeconfig, or one we cannot use."""


class ApiError(Exception):
    """A failed API call.

    `status` is the HTTP status, None when no answer came (connection failure, timeout);
    `reason` is a short, bounded label (`reason_for_status`, or unavailable / timeout /
    bad_response) fit for a metric label; `message` says what happened, for a log line.
    """

    def __init__(self, status: int | None, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def reason_for_status(status: int) -> str:
    """The bounded failure label for an HTTP error status."""
    if status in _STATUS_REASONS:
        return _STATUS_REASONS[status]
    return "server_error" if status >= 500 else "http_error"


class KubeApi:
    """GET, watch, PATCH and POST against one API server.

    Give at most one of `token` and `token_file`; a token file is re-read every
    `token_refresh_seconds` and on a 401 (then the request is retried once if it changed),
    because bound service-account tokens rotate under a running pod. `ca_file` verifies the
    server (else the system CAs do), `client_cert` is (certificate file, key file), and
    `insecure` turns verification off.
    """

    def __init__(
        self,
        host: str,
        token_file: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        insecure: bool = False,
        *,
        tls_server_name: str | None = None,
        token_refresh_seconds: float = TOKEN_REFRESH_SECONDS,
    ) -> None:
        url = parse_url(host)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"API server URL must be http(s)://host[:port]: {host!r}")
        if token is not None and token_file is not None:
            raise ValueError("give a token or a token file, not both")
        self.host = host.rstrip("/")
        self._token_file = token_file
        self._token = token
        self._token_refresh = token_refresh_seconds
        self._token_read_at = 0.0
        self._token_lock = threading.Lock()
        if token_file is not None:
            self._token = _read_token(token_file)
            self._token_read_at = time.monotonic()
        if url.scheme == "http" and self._token is not None:
            log.warning("sending a bearer token to %s over plain http", self.host)

        tls: dict[str, Any] = {}
        if url.scheme == "https":
            if insecure:
                tls.update(cert_reqs="CERT_NONE", assert_hostname=False)
                log.warning("TLS verification of %s is off (insecure)", self.host)
                # urllib3 would warn on every request; the warning above says it once.
                warnings.filterwarnings(
                    "ignore", category=urllib3.exceptions.InsecureRequestWarning
                )
            else:
                tls.update(cert_reqs="CERT_REQUIRED", ca_certs=ca_file)
            if client_cert is not None:
                tls.update(cert_file=client_cert[0], key_file=client_cert[1])
            if tls_server_name:
                tls.update(server_hostname=tls_server_name)
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=2, retries=False, **tls)
        self._temp_files: list[str] = []
        self._cleanup = weakref.finalize(self, _remove_files, self._temp_files)

    def __repr__(self) -> str:
        return f"KubeApi(host={self.host!r})"  # never the token

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str] | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR
    ) -> KubeApi:
        """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, its token and CA."""
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError("KUBERNETES_SERVICE_HOST/PORT not set: not in a pod")
        token_file, ca_file = os.path.join(sa_dir, "token"), os.path.join(sa_dir, "ca.crt")
        if not os.path.isfile(ca_file):
            raise KubeConfigError(f"no service-account CA at {ca_file}")
        if ":" in host:  # IPv6
            host = f"[{host}]"
        try:
            return cls(f"https://{host}:{port}", token_file=token_file, ca_file=ca_file)
        except ValueError as e:
            raise KubeConfigError(f"in-cluster API server: {e}") from e

    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str] | None = None, *, context: str | None = None
    ) -> KubeApi:
        """A kubeconfig's current (or named) context: server, CA, token or client certificate.

        Without `path`, the first existing file in $KUBECONFIG, else ~/.kube/config (files
        are not merged). Exec and auth-provider plugins are not run: `KubeConfigError`.
        """
        import yaml  # only here: the in-cluster agent never pays for it

        file = _kubeconfig_path(path)
        try:
            with open(file, encoding="utf-8") as f:
                config = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError) as e:
            raise KubeConfigError(f"cannot read kubeconfig {file}: {e}") from e
        except yaml.YAMLError as e:
            raise KubeConfigError(f"kubeconfig {file} is not valid YAML: {e}") from e
        return _from_kubeconfig_dict(cls, config, file, context)

    @classmethod
    def default(cls) -> KubeApi:
        """In-cluster, else the local kubeconfig; `KubeConfigError` says what both said."""
        tried = []
        for name, make in (("in-cluster", cls.in_cluster), ("kubeconfig", cls.from_kubeconfig)):
            try:
                return make()
            except KubeConfigError as e:
                tried.append(f"{name}: {e}")
        raise KubeConfigError("; ".join(tried))

    # --- requests ---------------------------------------------------------------------------

    def get(self, path: str, params: Params | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """GET `path` (e.g. /api/v1/nodes/x) and return its JSON object; `ApiError` else.

        `timeout` bounds the connect and each wait for data, not the whole call.
        """
        timeouts = urllib3.Timeout(connect=timeout, read=timeout)
        response = self._request(path, params, timeouts, stream=False)
        try:
            body = json.loads(response.data)
        except ValueError as e:  # UnicodeDecodeError is one too
            raise ApiError(response.status, "bad_response", f"GET {path}: not JSON: {e}") from e
        if not isinstance(body, dict):
            raise ApiError(response.status, "bad_response", f"GET {path}: not a JSON object")
        return body

    def patch(
        self,
        path: str,
        body: object,
        content_type: str = "application/merge-patch+json",
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """PATCH `path` with `body` (JSON-encoded) as `content_type`; the patched object."""
        return self._send("PATCH", path, body, content_type, timeout)

    def post(self, path: str, body: object, timeout: float = 10.0) -> dict[str, Any]:
        """POST `body` (JSON-encoded) to a collection `path`; the created object."""
        return self._send("POST", path, body, "application/json", timeout)

    def _send(
        self, method: str, path: str, body: object, content_type: str, timeout: float
    ) -> dict[str, Any]:
        data = json.dumps(body, separators=(",", ":")).encode()
        timeouts = urllib3.Timeout(connect=timeout, read=timeout)
        response = self._request(
            path, None, timeouts, stream=False, method=method, body=data, content_type=content_type
        )
        try:
            answer = json.loads(response.data)
        except ValueError as e:
            raise ApiError(
                response.status, "bad_response", f"{method} {path}: not JSON: {e}"
            ) from e
        if not isinstance(answer, dict):
            raise ApiError(response.status, "bad_response", f"{method} {path}: not a JSON object")
        return answer

    def stream(
        self,
        path: str,
        params: Params | None = None,
        timeout: float = 330.0,
        *,
        connect_timeout: float = 10.0,
    ) -> WatchStream:
        """Open a watch: GET with the response streamed; iterate it for the events.

        HTTP errors raise here, before any event. `timeout` is the longest silence allowed
        between two reads (make it longer than the watch's timeoutSeconds);
        `WatchStream.close()` ends it early, from any thread.
        """
        timeouts = urllib3.Timeout(connect=connect_timeout, read=timeout)
        return WatchStream(self._request(path, params, timeouts, stream=True), f"watch {path}")

    def close(self) -> None:
        """Close pooled connections and remove the temporary credential files; final."""
        self._pool.clear()
        self._cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _request(
        self,
        path: str,
        params: Params | None,
        timeout: urllib3.Timeout,
        *,
        stream: bool,
        method: str = "GET",
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> BaseHTTPResponse:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        url = self.host + path
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        if query:
            url += "?" + urlencode(query)
        what = f"{method} {path}"
        for attempt in (1, 2):
            headers = {"Accept": "application/json", "User-Agent": "topowatch"}
            if content_type is not None:
                headers["Content-Type"] = content_type
            token = self._current_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = self._pool.request(
                    method,
                    url,
                    body=body,
                    headers=headers,
                    timeout=timeout,
                    retries=False,
                    redirect=False,
                    preload_content=not stream,
                )
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise _transport_error(e, what) from e
            if 200 <= response.status < 300:
                return response
            error = _status_error(response, what)
            if response.status == 401 and attempt == 1 and self._token_rotated():
                log.info("%s: 401 with a rotated token file; retrying with the new token", what)
                continue
            raise error
        raise AssertionError("unreachable")

    def _current_token(self) -> str | None:
        if self._token_file is None:
            return self._token
        with self._token_lock:
            if time.monotonic() - self._token_read_at >= self._token_refresh:
                self._reload_token()
            return self._token

    def _token_rotated(self) -> bool:
        """Re-read the token file after a 401; True if it holds a different token now."""
        if self._token_file is None:
            return False
        with self._token_lock:
            before = self._token
            self._reload_token()
            return self._token != before

    def _reload_token(self) -> None:
        assert self._token_file is not None
        self._token_read_at = time.monotonic()
        try:
            self._token = _read_token(self._token_file)
        except KubeConfigError as e:  # keep the token we have; it may still be good
            log.warning("%s; keeping the previous token", e)


class WatchStream:
    """The events of one watch, decoded as they arrive; also a context manager.

    `close()` may come from another thread while a read is blocked: it shuts the socket down
    so that the read returns at once, and the iteration then just ends.
    """

    def __init__(self, response: BaseHTTPResponse, what: str) -> None:
        self._response = response
        self._what = what
        self._lock = threading.Lock()  # abort and release must not overlap
        self._closed = False
        self._released = False
        self._events: Generator[dict[str, Any]] = self._read()

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> dict[str, Any]:
        try:
            return next(self._events)
        except ValueError:  # "generator already executing": close() is finishing it
            if self._closed:
                raise StopIteration from None
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the stream now; safe from any thread and more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._released:
                _abort(self._response)
        try:
            self._events.close()
        except ValueError:  # another thread is inside next(): it releases on its way out
            return
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        # A half-read stream must never go back to the pool as if it were reusable.
        with contextlib.suppress(Exception):
            self._response.close()
        with contextlib.suppress(Exception):
            self._response.release_conn()

    def _read(self) -> Generator[dict[str, Any]]:
        try:
            for line in self._lines():
                if self._closed:
                    return
                try:
                    event = json.loads(line)
                except ValueError as e:
                    raise ApiError(
                        self._response.status,
                        "bad_response",
                        f"{self._what}: event is not JSON: {e}: {line[:100]!r}",
                    ) from e
                if not isinstance(event, dict):
                    raise ApiError(
                        self._response.status,
                        "bad_response",
                        f"{self._what}: event is not an object: {line[:100]!r}",
                    )
                yield event
        except ApiError:
            raise
        except Exception as e:
            if self._closed:
                return  # whatever the cut-off read raised
            if isinstance(e, urllib3.exceptions.HTTPError | OSError):
                raise _transport_error(e, self._what) from e
            raise
        finally:
            self._release()

    def _lines(self) -> Iterator[bytes]:
        """Newline-delimited lines, however the chunks split them."""
        pending = bytearray()
        for chunk in self._chunks():
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                pending += chunk[start:end]
                if pending.strip():
                    yield bytes(pending)
                pending.clear()
                start = end + 1
            pending += chunk[start:]
            if len(pending) > MAX_EVENT_BYTES:
                raise ApiError(
                    self._response.status,
                    "bad_response",
                    f"{self._what}: an event longer than {MAX_EVENT_BYTES} bytes",
                )
        if pending.strip():
            yield bytes(pending)

    def _chunks(self) -> Iterator[bytes]:
        response = self._response
        if response.chunked:
            yield from response.read_chunked(decode_content=True)
            return
        while chunk := response.read1(65536, decode_content=True):  # whatever has arrived
            yield chunk


def _transport_error(exc: BaseException, what: str) -> ApiError:
    """An `ApiError` (status None) for a call that got no HTTP answer."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.NewConnectionError):  # a ConnectTimeoutError too
        reason = "unavailable"
    elif isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        reason = "timeout"
    else:
        reason = "unavailable"
    text = str(exc).strip()
    detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return ApiError(None, reason, f"{what}: {detail}")


def _status_error(response: BaseHTTPResponse, what: str) -> ApiError:
    """The `ApiError` for a non-2xx answer, with the API server's Status message if any."""
    status = response.status
    try:
        body = response.data  # read whole, so the connection can be reused
    except Exception:
        body = b""
    finally:
        with contextlib.suppress(Exception):
            response.release_conn()
    text = f"{what}: HTTP {status} {response.reason or ''}".strip()
    message: object = None
    try:
        decoded = json.loads(body)
        if isinstance(decoded, dict):  # a Status: 'nodes "x" not found'
            message = decoded.get("message")
    except ValueError:
        message = body.decode("utf-8", errors="replace").strip() or None
    if message:
        text = f"{text}: {' '.join(str(message).split())[:_ERROR_BODY_CHARS]}"
    return ApiError(status, reason_for_status(status), text)


def _param(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise KubeConfigError(f"cannot read token file {path}: {type(e).__name__}") from e
    if not token:
        raise KubeConfigError(f"token file {path} is empty")
    return token


def _abort(response: BaseHTTPResponse) -> None:
    """Shut a streamed response's socket so that a read blocked in another thread returns."""
    try:
        response.shutdown()  # urllib3 >= 2.3
        return
    except Exception:  # no socket any more, or an older urllib3: try the socket itself
        pass
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _remove_files(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
    paths.clear()


# --- kubeconfig ---------------------------------------------------------------------------------


def _kubeconfig_path(path: str | os.PathLike[str] | None) -> str:
    if path is not None:
        return os.fspath(path)
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for candidate in listed:
        if os.path.isfile(candidate):
            return candidate
    if listed:
        raise KubeConfigError(f"none of the files in KUBECONFIG exist: {', '.join(listed)}")
    home = os.path.expanduser("~/.kube/config")
    if not os.path.isfile(home):
        raise KubeConfigError(f"no kubeconfig at {home} and KUBECONFIG is not set")
    return home


def _named(config: Mapping[str, Any], section: str, name: str, file: str) -> Mapping[str, Any]:
    """The body of entry `name` in a kubeconfig list (`clusters`, `users`, `contexts`)."""
    key = section[:-1]  # clusters -> cluster
    for entry in config.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(key) or {}
            if not isinstance(body, Mapping):
                raise KubeConfigError(f"{key} {name!r} in {file} is not a mapping")
            return body
    raise KubeConfigError(f"no {key} named {name!r} in {file}")


def _from_kubeconfig_dict(
    cls: type[KubeApi], config: object, file: str, context_name: str | None
) -> KubeApi:
    if not isinstance(config, Mapping):
        raise KubeConfigError(f"kubeconfig {file} is not a mapping")
    context_name = context_name or config.get("current-context")
    if not context_name:
        raise KubeConfigError(f"kubeconfig {file} has no current-context")
    context = _named(config, "contexts", str(context_name), file)
    cluster = _named(config, "clusters", str(context.get("cluster")), file)
    user_name = context.get("user")
    user = _named(config, "users", str(user_name), file) if user_name else {}
    where = f"user {user_name!r} in {file}"

    if "exec" in user:
        command = _field(user.get("exec"), "command")
        raise KubeConfigError(
            f"{where} authenticates with an exec plugin ({command}), which topowatch does not "
            "run; use a token or a client certificate, or run in-cluster"
        )
    if "auth-provider" in user:
        provider = _field(user.get("auth-provider"), "name")
        raise KubeConfigError(
            f"{where} uses the {provider!r} auth-provider plugin, which topowatch does not "
            "support; use a token or a client certificate, or run in-cluster"
        )
    if user.get("username") or user.get("password"):
        raise KubeConfigError(f"{where}: basic auth (username/password) is not supported")
    if cluster.get("proxy-url"):
        raise KubeConfigError(f"cluster of context {context_name!r}: proxy-url is not supported")
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"cluster of context {context_name!r} in {file} has no server")

    base = os.path.dirname(os.path.abspath(file))
    temp: list[str] = []
    try:
        insecure = bool(cluster.get("insecure-skip-tls-verify"))
        ca_file = _file_or_data(cluster, "certificate-authority", base, temp)
        if insecure and ca_file:
            raise KubeConfigError(
                f"cluster of context {context_name!r}: certificate-authority together with "
                "insecure-skip-tls-verify is not allowed"
            )
        cert = _file_or_data(user, "client-certificate", base, temp)
        key = _file_or_data(user, "client-key", base, temp)
        if bool(cert) != bool(key):
            raise KubeConfigError(f"{where}: client certificate and key must come together")
        token = user.get("token")
        token_file = user.get("tokenFile")
        try:
            api = cls(
                str(server),
                token=str(token) if token else None,
                token_file=None if token or not token_file else _resolve(str(token_file), base),
                ca_file=ca_file,
                client_cert=(cert, key) if cert and key else None,
                insecure=insecure,
                tls_server_name=cluster.get("tls-server-name") or None,
            )
        except ValueError as e:
            raise KubeConfigError(f"context {context_name!r} in {file}: {e}") from e
    except BaseException:
        _remove_files(temp)
        raise
    api._temp_files.extend(temp)
    return api


def _field(section: object, key: str) -> str:
    value = section.get(key) if isinstance(section, Mapping) else None
    return str(value) if value else "?"


def _resolve(path: str, base: str) -> str:
    """A kubeconfig path: relative ones are relative to the kubeconfig's directory."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(base, path)


def _file_or_data(section: Mapping[str, Any], key: str, base: str, temp: list[str]) -> str | None:
    """`key` as a file path: `key`-data (which wins, as in kubectl) goes to a 0600 temp file."""
    data = section.get(f"{key}-data")
    if data:
        try:
            raw = base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as e:
            raise KubeConfigError(f"{key}-data is not valid base64") from e
        fd, path = tempfile.mkstemp(prefix="topowatch-kube-", suffix=".pem")
        temp.append(path)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # mkstemp's default; said out loud for the key
            f.write(raw)
        return path
    named = section.get(key)
    return _resolve(str(named), base) if named else None
