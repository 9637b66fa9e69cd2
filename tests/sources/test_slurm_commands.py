"""Slurm commands run in a process group of their own (issue 28): a hung `scontrol` that forked
dies whole on the timeout, and nothing it started outlives the controller.

A timeout that kills only the process it started leaves that process's children running: a site's
`scontrol` wrapper, or a hung command's helper, could carry out a late `scontrol update` after the
controller wrote the decision off as timed out. The command runs in its own process group
(setpgid(2)) and `os.killpg` kills the group; the group's keeper kills it when the controller
exits, however it exits (exporter/sources/slurm/commands.py `run_in_group`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError
from tests.processes import read_stat


def hung_scontrol(tmp: Path, body: str) -> Path:
    """An `scontrol` that writes its pid and its child's, then does `body`."""
    script = tmp / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"sleep 60 >/dev/null 2>&1 &\necho $! > {tmp / 'child.pid'}\necho $$ > {tmp / 'pid'}\n"
        f"{body}\n"
    )
    script.chmod(0o755)
    return script


def pids(tmp: Path) -> list[int]:
    return [int((tmp / name).read_text()) for name in ("pid", "child.pid")]


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for its parent (the subreaper) to reap it."""
    proc = read_stat(pid)
    return proc is None or not proc.running


def wait_gone(pid_list: list[int], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(gone(p) for p in pid_list):
            return True
        time.sleep(0.05)
    return False


def test_a_timeout_kills_the_command_and_the_child_it_forked(tmp_path: Path) -> None:
    """The old workaround was `exec sleep 5` (no child to leave behind); a shell that forks is
    what a wrapper really is. Both are dead when `run` returns."""
    script = hung_scontrol(tmp_path, "wait")
    cli = SlurmCli(binaries={"scontrol": str(script)}, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(SlurmCommandError) as failed:
        cli.run(["scontrol", "show", "config"])
    assert failed.value.kind == "timeout" and "timed out after 0.5 s" in str(failed.value)
    assert time.monotonic() - started < 10.0
    command, child = pids(tmp_path)
    assert gone(command), "the command survived its timeout"
    assert wait_gone([child], 5.0), "the command's child survived the timeout"


def test_a_command_that_succeeds_leaves_nothing_running(tmp_path: Path) -> None:
    script = hung_scontrol(tmp_path, "echo 'SlurmctldPort = 6817'")
    cli = SlurmCli(binaries={"scontrol": str(script)}, timeout_s=10.0)
    assert cli.show_config() == {"SlurmctldPort": "6817"}
    assert wait_gone(pids(tmp_path), 5.0), "a background child of the command outlived it"


def test_a_missing_command_is_missing_and_leaves_no_keeper(tmp_path: Path) -> None:
    cli = SlurmCli(binaries={"scontrol": str(tmp_path / "no-scontrol")}, timeout_s=1.0)
    with pytest.raises(SlurmCommandError) as failed:
        cli.run(["scontrol", "show", "config"])
    assert failed.value.kind == "missing"


def test_the_command_dies_with_the_controller(tmp_path: Path) -> None:
    """The controller is killed (SIGKILL, its process alone, not its group: nothing of it runs
    to clean up) while `scontrol` hangs: the command and its child die with it, as they did when
    they shared the controller's group."""
    script = hung_scontrol(tmp_path, "wait")
    code = (
        "from exporter.sources.slurm.commands import SlurmCli\n"
        f"SlurmCli(binaries={{'scontrol': {str(script)!r}}}, timeout_s=600).run(['scontrol'])\n"
    )
    controller = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 30.0
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        command, child = pids(tmp_path)
        assert not gone(command) and not gone(child)
        os.kill(controller.pid, signal.SIGKILL)
    finally:
        controller.wait(timeout=30)
    assert wait_gone([command, child]), "the hung command outlived the controller"
