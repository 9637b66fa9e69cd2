"""Polling every node agent's `/api/v1/health`, with bounded concurrency and a timeout each.

One aiohttp session, at most `concurrency` requests in flight, `timeout_s` per request: a cycle
over N agents costs about N / concurrency round trips, and a dead host costs one timeout in one
slot. Each answer is handed on as soon as it arrives (`on_reading`), so a node that turns bad is
acted on without waiting for the slowest agent of the cycle.

An answer is trusted only when it is exactly what the agent serves: status 200, a JSON object
naming the node we asked (an address that now belongs to another host must not lend it its
findings), `ready` true, and a `findings` list. Anything else is a reading with an outcome that
says what went wrong, and no findings: the controller takes no action on doubt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter.core.findings import Finding, decode_findings

HEALTH_PATH = "/api/v1/health"
MAX_BODY_BYTES = 1 << 20  # 64 findings of 240-character evidence fit many times over
# Outcomes, a metric label each. `ok` alone carries findings.
OUTCOMES = (
    "ok",
    "not_ready",
    "unauthorized",
    "timeout",
    "unreachable",
    "bad_status",
    "garbage",
    "wrong_node",
)


@dataclass(frozen=True, slots=True)
class Target:
    node: str  # the Slurm node name
    address: str  # NodeAddr


@dataclass(frozen=True, slots=True)
class AgentReading:
    node: str
    outcome: str
    received_at: float  # when the answer (or the failure) came back
    findings: tuple[Finding, ...] = ()
    problems: tuple[str, ...] = ()  # findings entries the agent sent that could not be read
    detail: str = ""
    version: str = ""  # the agent's version of these findings ("" when it gives none)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def read_answer(node: str, status: int, body: bytes, at: float) -> AgentReading:
    """Judge one HTTP answer (pure: the tests feed it every kind of bad answer)."""
    if status in (401, 403):
        return AgentReading(node, "unauthorized", at, detail=f"HTTP {status}: token refused")
    if status == 503:
        return AgentReading(node, "not_ready", at, detail="agent has not evaluated health yet")
    if status != 200:
        return AgentReading(node, "bad_status", at, detail=f"HTTP {status}")
    try:
        document: Any = json.loads(body)
    except ValueError as exc:
        return AgentReading(node, "garbage", at, detail=f"not JSON: {exc}")
    if not isinstance(document, dict) or not isinstance(document.get("findings"), list):
        return AgentReading(node, "garbage", at, detail="no `findings` list in the answer")
    named = document.get("node")
    if named != node:
        return AgentReading(
            node, "wrong_node", at, detail=f"answered as {str(named)[:80]!r}, asked {node!r}"
        )
    if document.get("ready") is not True:
        return AgentReading(node, "not_ready", at, detail="agent says ready=false")
    findings, problems = decode_findings(json.dumps(document["findings"]))
    version = document.get("version")
    version = version[:64] if isinstance(version, str) else ""
    return AgentReading(node, "ok", at, tuple(findings), tuple(problems), version=version)


class AgentPoller:
    def __init__(
        self,
        token: str,
        port: int,
        timeout_s: float = 5.0,
        concurrency: int = 200,
        scheme: str = "http",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.port = port
        self.timeout_s = timeout_s
        self.concurrency = max(1, concurrency)
        self.scheme = scheme
        self.clock = clock

    def url(self, target: Target) -> str:
        host = f"[{target.address}]" if ":" in target.address else target.address
        return f"{self.scheme}://{host}:{self.port}{HEALTH_PATH}"

    def session(self, limit: int) -> aiohttp.ClientSession:
        """A session for `limit` connections at once (0: no limit, one per watched agent)."""
        connector = aiohttp.TCPConnector(limit=limit, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)

    async def watch(
        self, session: aiohttp.ClientSession, target: Target, version: str, wait_s: float
    ) -> AgentReading:
        """One long poll: the agent answers when its findings' version differs from `version`
        or after `wait_s` (the agent caps it), whichever comes first; `timeout_s` on top."""
        params = {"wait": f"{wait_s:g}", "version": version}
        timeout = aiohttp.ClientTimeout(total=wait_s + self.timeout_s)
        return await self._get(session, target, params, timeout)

    async def poll(
        self,
        targets: Sequence[Target],
        on_reading: Callable[[AgentReading], None] | None = None,
    ) -> list[AgentReading]:
        """One reading per target, in target order; `on_reading` sees each as it arrives."""
        limit = asyncio.Semaphore(self.concurrency)
        async with self.session(self.concurrency) as session:

            async def one(target: Target) -> AgentReading:
                async with limit:
                    reading = await self._get(session, target)
                if on_reading is not None:
                    on_reading(reading)
                return reading

            return list(await asyncio.gather(*(one(t) for t in targets)))

    async def _get(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        params: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> AgentReading:
        # The session's timeout unless the call has its own (aiohttp takes timeout=None as
        # "no timeout at all", so it is only ever passed set).
        timeout = timeout or aiohttp.ClientTimeout(total=self.timeout_s)
        limit = timeout.total or self.timeout_s
        try:
            async with session.get(
                self.url(target), params=params, timeout=timeout, allow_redirects=False
            ) as response:
                body = await response.content.read(MAX_BODY_BYTES + 1)
                if len(body) > MAX_BODY_BYTES:
                    return AgentReading(
                        target.node, "garbage", self.clock(), detail="answer over 1 MiB"
                    )
                return read_answer(target.node, response.status, body, self.clock())
        except TimeoutError:
            detail = f"no answer within {limit:g} s"
            return AgentReading(target.node, "timeout", self.clock(), detail=detail)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            detail = f"{type(exc).__name__}: {str(exc)[:200]}"
            return AgentReading(target.node, "unreachable", self.clock(), detail=detail)
