"""Shared fixtures: real promtool, simulated nodes, pollers."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from exporter.cluster.service import ClusterService, build_app, run_app
from exporter.core.snapshot import NodeSnapshot
from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from tests.postgres_harness import PostgresMissing, PostgresServer, postgres_server

# The shared reference data sits beside the checkout (../shared), in CI as in development.
REFERENCE = Path(
    os.environ.get(
        "TOPOWATCH_REFERENCE", Path(__file__).resolve().parents[2] / "shared" / "reference"
    )
)


def reference(relative: str) -> Path:
    path = REFERENCE / relative
    if not path.exists():
        pytest.fail(
            f"reference data {path} missing:"
            " check out shared/ beside the repo or set TOPOWATCH_REFERENCE"
        )
    return path


def promtool_lint(exposition: bytes) -> str:
    """Run the real `promtool check metrics`; return its complaints ('' when clean)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    proc = subprocess.run(
        [binary, "check", "metrics"], input=exposition, capture_output=True, timeout=60
    )
    complaints = (proc.stdout + proc.stderr).decode().strip()
    if proc.returncode != 0 and not complaints:
        complaints = f"promtool exited {proc.returncode}"
    return complaints


def systemd_verify(unit: Path) -> str:
    """Run the real `systemd-analyze verify` on a unit file; its complaints ('' when it
    accepts the unit). Callers skip where the binary is absent."""
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "" if proc.returncode == 0 else proc.stderr.strip() or f"exited {proc.returncode}"


class SimHarness:
    """A simulated node and a poller over it, with simulated time stepping by `interval`."""

    def __init__(
        self, profile: str, faults: tuple[str, ...], tmp: Path, compat: frozenset[str]
    ) -> None:
        self.node = SimulatedNode(
            get_profile(profile), parse_faults(faults), root=tmp, start=1_750_000_000.0
        )
        self.sources = self.node.sources()
        self.now = 1_750_000_000.0
        self.poller = Poller("sim-node-1", self.sources, compat=compat, clock=lambda: self.now)

    def poll(self, step: float = 5.0):  # type: ignore[no-untyped-def]
        self.now += step
        return self.poller.poll()

    def close(self) -> None:
        self.sources.close()
        self.node.close()


def healthy_snapshot(profile: str, tmp: Path) -> NodeSnapshot:
    """A healthy node's second poll (the first primes rates and GPM): a snapshot for a test
    to bend into the case it judges."""
    h = SimHarness(profile, (), tmp, frozenset())
    try:
        h.poll()
        snapshot: NodeSnapshot = h.poll()[0]
        return snapshot
    finally:
        h.close()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[object]:
    made: list[SimHarness] = []

    def make(
        profile: str = "p5.48xlarge", *faults: str, compat: frozenset[str] = frozenset()
    ) -> SimHarness:
        h = SimHarness(profile, faults, tmp_path / f"sim{len(made)}", compat)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def executed_lines(func: Callable[[], object]) -> int:
    """How many Python lines `func` runs, in every function it calls: a measure of its work
    that, unlike a timing, does not depend on how busy the machine is."""
    count = 0

    def line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return line

    def call(frame: FrameType, event: str, arg: object) -> Any:
        return line

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        func()
    finally:
        sys.settrace(previous)
    return count


class ServedCluster:
    """build_app over an existing ClusterService, in a thread with its own event loop."""

    def __init__(self, service: ClusterService) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, args=(service,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "cluster service did not start"

    def _run(self, service: ClusterService) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def started(port: int) -> None:
                self.port = port
                self._ready.set()

            await run_app(build_app(service), "127.0.0.1", 0, self._stop, started)

        asyncio.run(main())

    def get(self, path: str) -> bytes:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
            return body

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def free_port() -> int:
    """A loopback TCP port free at the time of asking, for a server a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL for the session (tests/postgres_harness.py); each test makes its own
    database with `create_database`."""
    try:
        with postgres_server(options=["-c fsync=off"]) as server:
            yield server
    except PostgresMissing as exc:
        pytest.fail(f"{exc}: run scripts/bootstrap.sh")
