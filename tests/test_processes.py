"""The process guard (tests/conftest.py, tests/processes.py) can fail: an inner pytest run over
tests that leave processes behind reports each leak by command and PID, charges it to whoever
started it, kills it, and fails the run; a session fixture's server restarted by a test is not
charged to that test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import processes

REPO = Path(__file__).resolve().parents[1]

INNER = '''
import subprocess
from pathlib import Path

import pytest

from tests import processes

OUT = Path({out!r})


def record(name: str, proc: subprocess.Popen[bytes]) -> None:
    stat = processes.read_stat(proc.pid)
    assert stat is not None
    (OUT / name).write_text(f"{{stat.pid}} {{stat.start}}")


record("session", subprocess.Popen(["sleep", "603"]))  # at collection: the session's


@pytest.fixture(scope="session")
def server():
    """Stopped and started again by a test, on the fixture's behalf, as pg_server is."""
    owner = processes.current_owner()
    proc = [subprocess.Popen(["sleep", "601"])]

    def restart() -> None:
        proc[0].terminate()
        proc[0].wait()
        with processes.attributed_to(owner):
            proc[0] = subprocess.Popen(["sleep", "601"])

    yield restart
    proc[0].terminate()
    proc[0].wait()


@pytest.fixture(scope="module")
def leaky_module():
    record("module", subprocess.Popen(["sleep", "602"]))
    yield


def test_leaks_a_sleep() -> None:
    record("test", subprocess.Popen(["sleep", "600"], start_new_session=True))


def test_restarts_the_session_server(server, leaky_module) -> None:
    server()


def test_last(server) -> None:
    subprocess.run(["true"], check=True)
'''


def test_the_guard_reports_kills_and_fails_leaks_by_whoever_started_them(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER.format(out=str(tmp_path)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TOPOWATCH_PROCESS_SETTLE_S": "0.2",
        "TOPOWATCH_PROCESS_GUARD": "on",
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["-p", "no:cloudcoil", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    done = subprocess.run(
        [*argv, str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out

    pids = {}
    for name in ("test", "module", "session"):
        pid, start = map(int, (tmp_path / name).read_text().split())
        pids[name] = pid
        stat = processes.read_stat(pid)
        assert stat is None or stat.start != start or not stat.running, f"{name} leak alive"

    assert "ERROR at teardown of test_leaks_a_sleep" in out, out
    assert "this test left 1 process running after it ended" in out, out
    assert f"pid {pids['test']} (" in out and "sleep 600" in out, out

    assert "ERROR at teardown of test_last" in out, out
    assert "fixture 'leaky_module' (scope=module) left 1 process running" in out, out
    assert f"pid {pids['module']} (" in out and "sleep 602" in out, out

    assert "the session left 1 process running after every fixture was torn down" in out, out
    assert f"pid {pids['session']} (" in out and "sleep 603" in out, out

    assert "sleep 601" not in out, out  # the restarted server stayed the session fixture's
    assert "3 passed, 3 errors" in out, out
