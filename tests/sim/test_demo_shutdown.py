"""`topowatch demo` stops cleanly and promptly on SIGTERM: the real command, its 34 node agents
and the real Prometheus it starts.

No wall-clock assertion (CI is a loaded 2-core machine): the exit time is printed, and the
generous wait below only keeps a hung demo from hanging the suite. What is asserted: the demo
exits with status 0 and none of the processes it started is left running.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_component

STARTUP_S = 120.0  # the simulation, 34 agents and the first informer sync, on a loaded machine
EXIT_HANG_GUARD_S = 20.0  # the demo's own shutdown deadline is a few seconds


def free_port_below_ephemeral() -> int:
    """A port free now and below the kernel's ephemeral range, so no socket bound to port 0
    (the demo's node agents) can be given it meanwhile."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        candidate = rng.randrange(20000, max(20001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    raise RuntimeError("no free port below the ephemeral range")


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free now (held open together, so never the same one twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def answers(url: str, status: int = 200) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == status)
    except (urllib.error.URLError, OSError):
        return False


Process = tuple[int, str]  # pid and start time (clock ticks since boot): unique across pid reuse


def _stat(pid: int) -> tuple[str, int, str] | None:
    """State, parent pid and start time of a live process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), fields[19]


def descendants(root: int) -> dict[Process, str]:
    """Every live process below `root`, with its command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found: dict[Process, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is None:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[(pid, stat[2])] = cmdline.strip()
        todo.extend(children.get(pid, []))
    return found


def running(process: Process) -> bool:
    """Still there and not a zombie (a zombie has exited; only its exit status is left)."""
    stat = _stat(process[0])
    return stat is not None and stat[2] == process[1] and stat[0] not in ("Z", "X")


def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus missing: run scripts/bootstrap.sh (Debian package prometheus)")
    # Prometheus's port is chosen outside the kernel's ephemeral range: one picked inside it
    # could be taken by one of the 34 node agents' own ephemeral ports before Prometheus binds.
    (port,) = free_ports(1)
    prometheus_port = free_port_below_ephemeral()
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "--log-level",
                "WARNING",
                "demo",
                "--listen",
                f"127.0.0.1:{port}",
                "--node-port-base",
                "0",
                "--prometheus-port",
                str(prometheus_port),
            ],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group, so that cleanup below can reach strays
        )

    def logs() -> str:
        return f"stdout:\n{stdout.read_text()}\nstderr:\n{stderr.read_text()[-3000:]}"

    started: dict[Process, str] = {}
    try:
        deadline = time.monotonic() + STARTUP_S
        ready = False
        while not ready and proc.poll() is None and time.monotonic() < deadline:
            ready = answers(f"http://127.0.0.1:{port}/readyz") and answers(
                f"http://127.0.0.1:{prometheus_port}/-/ready"
            )
            if not ready:
                time.sleep(0.5)
        assert ready, f"the demo did not come up (exit status {proc.poll()})\n{logs()}"
        started = descendants(proc.pid)
        assert any("prometheus" in cmdline for cmdline in started.values()), (started, logs())

        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the demo alone: Prometheus must hear it from the demo
        try:
            status = proc.wait(timeout=EXIT_HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo still runs {EXIT_HANG_GUARD_S:.0f} s after SIGTERM\n{logs()}")
        print(f"topowatch demo exited {time.monotonic() - sent:.2f} s after SIGTERM")

        assert status == 0, logs()
        left = {process: cmdline for process, cmdline in started.items() if running(process)}
        assert not left, f"still running after the demo exited: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid, _ in (process for process in started if running(process)):
            os.kill(pid, signal.SIGKILL)
