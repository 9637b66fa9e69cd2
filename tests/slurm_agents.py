"""Node agents' health API as loopback HTTP servers, one per address, for the Slurm controller.

Each server answers `/api/v1/health` the way `topowatch node` does (exporter/node/health_api.py:
bearer token, 503 before ready, `{"node", "generated_at", "ready", "findings"}`), or misbehaves
the way a broken host does (garbage, a hang, a wrong token, another node's name). The real agent's
endpoint is tested against the same contract in tests/node/test_node_host.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from exporter.core.findings import Finding

TOKEN = "s3cret-agent-token"


def finding(check: str, action: str, at: float, component: str = "gpu0") -> Finding:
    return Finding(check, component, "critical", action, f"{check} on {component}", at, at, True)


@dataclass
class Behaviour:
    """What one node's agent answers: findings, or a way of failing."""

    findings: list[Finding] = field(default_factory=list)
    mode: str = "ok"  # ok | garbage | hang | status:<code> | as:<other node> | not_ready
    hang_s: float = 10.0


class _Handler(BaseHTTPRequestHandler):
    agents: ClassVar[dict[str, Behaviour]]
    node_of: ClassVar[dict[str, str]]  # address → node
    token: ClassVar[str]
    requests: ClassVar[list[tuple[str, float]]]
    changed: ClassVar[threading.Condition]

    def do_GET(self) -> None:
        address = self.server.server_address[0]
        node = self.node_of[str(address)]
        self.requests.append((node, time.monotonic()))
        path, _, query = self.path.partition("?")
        asked = dict(urllib.parse.parse_qsl(query))
        if float(asked.get("wait", 0)) > 0:  # a long poll: answer when the version changes
            with self.changed:
                self.changed.wait_for(
                    lambda: _version(self.agents.get(node, Behaviour())) != asked.get("version"),
                    timeout=float(asked["wait"]),
                )
        behaviour = self.agents.get(node, Behaviour())
        if path == "/metrics":  # what Prometheus scrapes through the file_sd targets
            return self._send(200, f'topowatch_node_info{{node="{node}"}} 1\n'.encode())
        if path != "/api/v1/health":
            return self._send(404, b"{}")
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(401, b'{"error": "bearer token required"}')
        mode = behaviour.mode
        if mode == "hang":
            time.sleep(behaviour.hang_s)
            return self._send(200, b"[]")
        if mode == "garbage":
            return self._send(200, b"<html>login page</html>")
        if mode.startswith("status:"):
            return self._send(int(mode.split(":", 1)[1]), b"{}")
        body: dict[str, Any] = {
            "node": mode.split(":", 1)[1] if mode.startswith("as:") else node,
            "generated_at": "2026-11-25T00:00:00Z",
            "ready": mode != "not_ready",
            "findings": [f.to_dict() for f in behaviour.findings],
            "version": _version(behaviour),
        }
        self._send(503 if mode == "not_ready" else 200, json.dumps(body).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with suppress(OSError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class FakeAgents:
    """Servers at `addresses` (node → 127.0.0.X), all on `port`; `agents[node]` says what each
    answers, and may change while they run."""

    def __init__(self, addresses: dict[str, str], port: int, token: str = TOKEN) -> None:
        self.addresses = addresses
        self.port = port
        self.agents: dict[str, Behaviour] = {}
        self.requests: list[tuple[str, float]] = []
        self.changed = threading.Condition()
        handler = type(
            "Handler",
            (_Handler,),
            {
                "agents": self.agents,
                "node_of": {a: n for n, a in addresses.items()},
                "token": token,
                "requests": self.requests,
                "changed": self.changed,
            },
        )
        self.servers = [ThreadingHTTPServer((a, port), handler) for a in addresses.values()]
        for server in self.servers:
            server.daemon_threads = True

    def set(self, node: str, behaviour: Behaviour) -> None:
        """Change what `node` answers, waking its long polls (as the real agent's next
        evaluation does)."""
        with self.changed:
            self.agents[node] = behaviour
            self.changed.notify_all()

    @contextmanager
    def running(self) -> Iterator[FakeAgents]:
        threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            for server in self.servers:
                server.shutdown()
                server.server_close()


def _version(behaviour: Behaviour) -> str:
    encoded = json.dumps([f.to_dict() for f in behaviour.findings], sort_keys=True)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]


def loopback_addresses(nodes: list[str]) -> dict[str, str]:
    return {name: f"127.0.0.{index + 2}" for index, name in enumerate(nodes)}
