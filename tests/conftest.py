"""Shared fixtures: real promtool, simulated nodes, pollers; the process guard (no test leaves a
process behind)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from exporter.cluster.run import kube_api_client, serve_cluster
from exporter.cluster.service import ClusterService, build_app, run_app
from exporter.core.snapshot import NodeSnapshot
from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from tests import processes
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


Response = tuple[int, dict[str, str], Any]


def fetch_json(port: int, path: str) -> Response:
    """(status, headers, JSON body) of a GET on a local service, error statuses included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


@contextmanager
def serving(api_url: str, **options: Any) -> Iterator[tuple[int, ClusterService]]:
    """`serve_cluster` against the API server at `api_url`, in a thread, with `options` (its
    keyword arguments); yields its port and service once it listens, and stops it (through its
    asyncio event) on the way out."""
    stop = asyncio.Event()
    holder: dict[str, Any] = {}
    started = threading.Event()

    def on_started(port: int, service: ClusterService) -> None:
        holder.update(port=port, service=service, loop=asyncio.get_running_loop())
        started.set()

    thread = threading.Thread(
        target=serve_cluster,
        args=(kube_api_client(api_url), "127.0.0.1", 0),
        kwargs={"on_started": on_started, "stop": stop, **options},
        daemon=True,
    )
    thread.start()
    try:
        assert started.wait(10), "cluster service did not start"
        yield holder["port"], holder["service"]
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(stop.set)
        thread.join(15)
        assert not thread.is_alive(), "cluster service did not stop"


def metric_value(service: ClusterService, name: str) -> float:
    """The value of the unlabelled sample `name` on the service's /metrics."""
    for line in service.metrics_body(False).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


_DATABASES = iter(range(10**9))


def new_database(server: PostgresServer, prefix: str) -> str:
    """The URL of a database of its own on `server` (names never repeat in one session)."""
    return server.create_database(f"{prefix}_{next(_DATABASES)}")


def history_url(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> str:
    """The history store of a test parametrized over "sqlite" and "postgresql": a file in
    `tmp_path`, or a database of its own on the session's PostgreSQL (`pg_server`)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/history.db"
    return new_database(request.getfixturevalue("pg_server"), prefix)


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


# --- the process guard ----------------------------------------------------------------------


class ProcessGuard:
    """Fails whoever leaves a process running: a test (teardown error), a module- or
    session-scoped fixture (a teardown error on the test whose teardown finalised it), or the
    session (an error after the last teardown, and a failed exit status). What is left is killed
    by PID, so one leak does not turn into twenty minutes of slurmstepd on a CI runner.

    It is a plugin object rather than hook functions in this conftest because a conftest's hooks
    are not called for session-scoped fixtures (their node is the session, at the rootdir, above
    tests/). The bookkeeping is in tests/processes.py; this class maps pytest's phases onto its
    windows: a test's window spans its setup, call and teardown; a wider fixture's setup opens a
    window of its own inside it, checked when pytest finalises that fixture.

    `TOPOWATCH_PROCESS_GUARD=off` in the environment leaves it out (e.g. under a debugger);
    `TOPOWATCH_PROCESS_SETTLE_S` shortens the wait for processes already exiting (tests of the
    guard itself)."""

    NAME = "topowatch-process-guard"

    def __init__(self) -> None:
        self.ledger = processes.Ledger()
        self.settle_s = float(os.environ.get("TOPOWATCH_PROCESS_SETTLE_S", processes.SETTLE_S))
        self.ledger.install()
        self._tests: dict[str, processes.Owner] = {}
        self._fixtures: dict[pytest.FixtureDef[Any], processes.Owner] = {}
        self._pending: list[str] = []  # fixture leaks, told by the teardown that finalised them

    @staticmethod
    def describe(who: str, leaks: list[processes.Leak], when: str) -> str:
        lines = [
            f"{who} left {len(leaks)} process{'es' if len(leaks) > 1 else ''} running {when};"
            f" the process guard killed {'them' if len(leaks) > 1 else 'it'} (SIGTERM, then"
            f" SIGKILL after {processes.TERM_GRACE_S:.0f} s):",
            *(f"  {leak}" for leak in leaks),
            "Stop and reap every process you start before returning (tests/processes.py says"
            " how processes are attributed).",
        ]
        return "\n".join(lines)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self._tests[item.nodeid] = self.ledger.open(f"test {item.nodeid}")
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        try:
            result = yield
        except BaseException as exc:
            if message := self._finish(item):
                exc.add_note(message)
            raise
        if message := self._finish(item):
            pytest.fail(message, pytrace=False)
        return result

    def _finish(self, item: pytest.Item) -> str:
        """Close the test's window, kill what it left; the report (with fixture leaks found
        while this teardown finalised module or session fixtures), '' when clean."""
        reports, self._pending = self._pending, []
        owner = self._tests.pop(item.nodeid, None)
        if owner is not None and (leaks := self.ledger.stop_leftovers(owner, self.settle_s)):
            reports.insert(0, self.describe("this test", leaks, "after it ended"))
        return "\n\n".join(reports)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        owner = self.ledger.open(f"fixture {fixturedef.argname!r} (scope={fixturedef.scope})")
        self._fixtures[fixturedef] = owner
        try:
            return (yield)
        finally:
            self.ledger.close(owner)

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owner = self._fixtures.pop(fixturedef, None)
        if owner is not None and (leaks := self.ledger.stop_leftovers(owner, self.settle_s)):
            self._pending.append(self.describe(owner.label, leaks, "after its teardown"))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Iterator[None]:
        """After every fixture is torn down (runner's sessionfinish runs inside this wrapper),
        before the terminal summary (outer wrappers): anything of the session's still running
        is an error of the run."""
        try:
            return (yield)
        finally:
            self._end_of_session(session)
            self.ledger.reap_all()

    def _end_of_session(self, session: pytest.Session) -> None:
        reports, self._pending = self._pending, []
        if leaks := self.ledger.stop_leftovers(None, self.settle_s):
            reports.append(self.describe("the session", leaks, "after every fixture was torn down"))
        if not reports:
            return
        report = pytest.TestReport(
            nodeid="tests/conftest.py::process-guard",
            location=("tests/conftest.py", None, "process guard: end of session"),
            keywords={},
            outcome="failed",
            longrepr="\n\n".join(reports),
            when="teardown",
        )
        session.config.hook.pytest_runtest_logreport(report=report)  # counted, shown as ERROR
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self) -> None:
        self.ledger.uninstall()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TOPOWATCH_PROCESS_GUARD") == "off":
        return
    if not config.pluginmanager.has_plugin(ProcessGuard.NAME):
        config.pluginmanager.register(ProcessGuard(), ProcessGuard.NAME)
