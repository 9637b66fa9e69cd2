"""Custom checks: real scripts run as node-problem-detector's custom plugin monitor runs them
(exit codes, capped output, no shell, the process group killed), one run of a check at a
time, and their findings and metrics through the node agent's poller on the simulation.

No assertion is on wall-clock time: the runner's scheduler takes its `now` from the test, and
the scripts wait for files the test writes."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.cli.node import custom_check_runner
from exporter.core.findings import Finding
from exporter.core.snapshot import (
    CUSTOM_OK,
    CUSTOM_PROBLEM,
    CUSTOM_UNKNOWN,
    CustomCheckReading,
)
from exporter.sources.custom_checks import (
    READ_CAP_BYTES,
    CheckSpec,
    CustomCheckRunner,
    npd_message,
    run_check,
)
from healthcheck.detection.checks import custom
from healthcheck.detection.checks.base import History
from healthcheck.detection.config import ConfigError, HealthConfig, config_from_mapping
from healthcheck.detection.monitor import HealthMonitor
from tests.conftest import SimHarness, promtool_lint
from tests.node.test_node_agent import series

Sim = Callable[..., SimHarness]
HUGE = 100 * 1024 * 1024


def script(tmp_path: Path, name: str, body: str, mode: int = 0o755) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def spec(path: Path, timeout: float = 30.0, **kw: object) -> CheckSpec:
    return CheckSpec(name="t", path=str(path), timeout_seconds=timeout, **kw)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Wait for something a process does (bounded only so that a broken test ends)."""
    import time

    end = time.monotonic() + 30
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.01)


# --- the protocol ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "result", "status"),
    [
        (0, "ok", CUSTOM_OK),
        (1, "problem", CUSTOM_PROBLEM),
        (2, "unknown", CUSTOM_UNKNOWN),
        (3, "unknown", CUSTOM_UNKNOWN),  # NPD: anything but 0 and 1 is Unknown
        (255, "unknown", CUSTOM_UNKNOWN),
    ],
)
def test_exit_codes_follow_npd(tmp_path: Path, code: int, result: str, status: int) -> None:
    path = script(tmp_path, "c.sh", f"echo 'exit was {code}'\nexit {code}\n")
    out = run_check(spec(path))
    assert (out.result, out.status, out.exit_code) == (result, status, code)
    assert out.message == f"exit was {code}"


def test_the_message_is_trimmed_stdout_cut_at_80_bytes_as_npd(tmp_path: Path) -> None:
    long = "x" * 200
    path = script(tmp_path, "c.sh", f"echo '   {long}   '\necho 'said on stderr' >&2\nexit 1\n")
    out = run_check(spec(path))
    assert out.result == "problem" and out.message == "x" * 80
    path = script(tmp_path, "d.sh", "printf '\\n  NTP service is down\\nretry later\\n\\n'\nexit 1")
    assert run_check(spec(path)).message == "NTP service is down\nretry later"
    short = run_check(spec(path, max_output_length=10))
    assert short.message == "NTP servic"


def test_args_are_passed_without_a_shell(tmp_path: Path) -> None:
    path = script(tmp_path, "c.sh", 'echo "$#:$1:$2"\n')
    out = run_check(spec(path, args=("a b", "$(touch pwned) ; *")))
    assert out.message == "2:a b:$(touch pwned) ; *"
    assert not (tmp_path / "pwned").exists()


def test_garbage_output_is_made_safe(tmp_path: Path) -> None:
    path = script(tmp_path, "c.sh", "printf 'ok\\000\\001\\377\\376\\033[31mred'\nexit 1\n")
    out = run_check(spec(path))
    assert out.result == "problem"
    assert out.message.startswith("ok") and out.message.endswith("[31mred")
    assert all(c.isprintable() for c in out.message)
    out.message.encode("utf-8")  # valid text for JSON, logs and Events


def test_a_script_writing_100_mb_costs_no_memory(tmp_path: Path) -> None:
    """stdout is read to the end (the script never blocks on a full pipe) but only the first
    4 KiB are kept, as NPD keeps them; the rest is dropped as it arrives."""
    path = script(
        tmp_path, "c.sh", f"yes 'all good' | head -c {HUGE}\nyes err | head -c {HUGE} >&2\n"
    )
    tracemalloc.start()
    try:
        out = run_check(spec(path, timeout=300))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.result == "ok" and out.exit_code == 0
    assert out.stdout_bytes == HUGE  # all read...
    assert out.stdout_kept == READ_CAP_BYTES  # ...4 KiB kept
    assert len(out.stderr) == READ_CAP_BYTES
    assert out.message == "\n".join(["all good"] * 9)[:80]
    assert peak < 2 * 1024 * 1024, f"{peak} bytes allocated at the peak"


def test_missing_non_executable_and_unstartable_files_are_unknown(tmp_path: Path) -> None:
    out = run_check(spec(tmp_path / "nope.sh"))
    assert (out.result, out.status) == ("error", CUSTOM_UNKNOWN)
    assert out.message == f"{tmp_path / 'nope.sh'} not found"
    plain = script(tmp_path, "plain.sh", "exit 0\n", mode=0o644)
    out = run_check(spec(plain))
    assert (out.result, out.status) == ("error", CUSTOM_UNKNOWN)
    assert out.message.endswith("is not executable")
    assert run_check(spec(tmp_path)).message.endswith("is not a regular file")
    binary = tmp_path / "garbage"
    binary.write_bytes(b"\x7fELF\x00\x01garbage")
    binary.chmod(0o755)
    out = run_check(spec(binary))
    assert out.result == "error" and out.message.startswith(f"cannot start {binary}")


def test_a_hanging_script_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    path = script(
        tmp_path,
        "hang.sh",
        f"sleep 1000 &\necho $! > {pidfile}\necho checking\nsleep 1000\n",
    )
    seen: list[int] = []
    out = run_check(spec(path, timeout=2.0), started=lambda p: seen.append(p.pid))
    assert (out.result, out.status, out.exit_code) == ("timeout", CUSTOM_UNKNOWN, None)
    assert out.message == "timed out after 2s, process group killed; output: checking"
    child = int(pidfile.read_text())
    wait_for(lambda: not alive(child), f"the forked child {child} is killed")
    assert not alive(seen[0])


def test_a_script_that_leaves_a_child_behind_is_cleaned_up(tmp_path: Path) -> None:
    """The script exits 0 but leaves children, one holding stdout, one not: its result is
    its own (not a timeout: nothing waits for the children), and the group is killed."""
    holding, detached = tmp_path / "holding.pid", tmp_path / "detached.pid"
    path = script(
        tmp_path,
        "leave.sh",
        f"sleep 1000 &\necho $! > {holding}\n"
        f"sleep 1000 >/dev/null 2>&1 </dev/null &\necho $! > {detached}\n"
        "echo fine\nexit 0\n",
    )
    out = run_check(spec(path, timeout=600))
    assert (out.result, out.message) == ("ok", "fine")
    for pidfile in (holding, detached):
        pid = int(pidfile.read_text())
        wait_for(lambda pid=pid: not alive(pid), f"left-behind child {pid} is killed")  # type: ignore[misc]


def test_a_script_that_closes_its_output_first_is_still_followed_to_its_exit(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "child.pid"
    path = script(
        tmp_path,
        "closes.sh",
        f"echo early\nexec >&- 2>&-\nsleep 1000 &\necho $! > {pidfile}\nexit 1\n",
    )
    out = run_check(spec(path, timeout=600))
    assert (out.result, out.message, out.exit_code) == ("problem", "early", 1)
    pid = int(pidfile.read_text())
    wait_for(lambda: not alive(pid), f"left-behind child {pid} is killed")


def test_a_script_killed_by_a_signal_is_unknown(tmp_path: Path) -> None:
    path = script(tmp_path, "c.sh", "echo dying\nkill -9 $$\n")
    out = run_check(spec(path))
    assert (out.result, out.status, out.exit_code) == ("unknown", CUSTOM_UNKNOWN, None)
    assert out.message == "killed by signal 9: dying"


def test_without_pidfd_the_exit_is_still_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 5.3 (or a seccomp profile) refuse pidfd_open: the runner looks for the
    exit with waitid instead, still without reaping before it kills the group."""
    from exporter.sources import custom_checks

    monkeypatch.setattr(custom_checks, "_pidfd", lambda pid: None)
    test_a_script_that_leaves_a_child_behind_is_cleaned_up(tmp_path)
    test_a_hanging_script_is_killed_with_its_children(tmp_path)


def test_npd_message_helper() -> None:
    assert npd_message(b"  \n hello \n", 80) == "hello"
    assert npd_message("é".encode() * 50, 3) == "é\ufffd"  # a byte cut, as NPD's


# --- the runner: its own schedule, one run at a time ----------------------------------------


def test_a_check_never_runs_twice_at_once_and_a_slow_run_skips_turns(tmp_path: Path) -> None:
    log, release = tmp_path / "starts", tmp_path / "release"
    path = script(
        tmp_path,
        "slow.sh",
        f"mkdir {tmp_path / 'lock'} || echo overlap >> {log}\n"
        f"echo start >> {log}\n"
        f"while [ ! -e {release} ]; do sleep 0.01; done\n"
        f"rmdir {tmp_path / 'lock'}\necho done\n",
    )
    runner = CustomCheckRunner([spec(path, interval_seconds=10.0)], timer=lambda: 0.0)
    try:
        assert runner.tick(0.0) == 10.0  # due at once; next turn at 10
        wait_for(lambda: log.exists(), "the first run starts")
        assert runner.tick(10.0) == 20.0  # still running: turn skipped
        assert runner.tick(25.0) == 30.0  # skipped again
        (reading,) = runner.read()
        assert reading.status is None and reading.runs["skipped"] == 2
        assert log.read_text() == "start\n"  # one process only
        release.touch()
        assert runner.wait_idle(30)
        assert runner.tick(30.0) == 40.0  # the next turn runs
        assert runner.wait_idle(30)
        assert runner.tick(75.0) == 80.0  # turns 40..70 passed unnoticed: skipped, one run
        assert runner.wait_idle(30)
        (reading,) = runner.read()
    finally:
        runner.close()
    assert log.read_text() == "start\n" * 3  # never "overlap"
    assert reading.runs["ok"] == 3 and reading.runs["skipped"] == 2 + 3
    assert (reading.status, reading.result, reading.message) == (CUSTOM_OK, "ok", "done")
    assert reading.recent == (CUSTOM_OK,) * 3
    assert reading.duration_count == 3 and reading.duration_buckets[-1][1] == 3


def test_a_missing_script_is_counted_every_run_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = CustomCheckRunner([spec(tmp_path / "gone.sh", interval_seconds=1.0)])
    for now in (0.0, 1.0, 2.0):
        runner.tick(now)
        assert runner.wait_idle(30)
    (reading,) = runner.read()
    runner.close()
    assert reading.runs["error"] == 3 and reading.status == CUSTOM_UNKNOWN
    assert reading.message.endswith("gone.sh not found")
    said = [r for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(said) == 1


def test_close_kills_a_run_under_way(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    path = script(tmp_path, "hang.sh", f"echo $$ > {pidfile}\nsleep 1000\n")
    runner = CustomCheckRunner([spec(path, timeout=600)])
    runner.tick(0.0)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", "the script starts")
    runner.close()
    assert runner.wait_idle(30)
    pid = int(pidfile.read_text())
    assert not alive(pid)


# --- configuration ----------------------------------------------------------------------------


def test_config_defaults_and_refusals() -> None:
    cfg = config_from_mapping(
        {"damping": {"k": 2, "n": 4}, "custom_checks": [{"name": "ntp", "path": "/opt/ntp.sh"}]}
    )
    (c,) = cfg.custom_checks
    assert (c.args, c.interval_seconds, c.timeout_seconds, c.action) == ((), 30.0, 5.0, "none")
    assert c.max_output_length == 80 and (c.damping.k, c.damping.n) == (2, 4)
    assert c.check_id == "custom:ntp"
    bad = [
        ({"name": "x", "path": "/a", "shell": True}, "unknown key 'custom_checks[0].shell'"),
        ({"name": "x", "path": "check.sh"}, "must be an absolute path"),
        ({"name": "X Y", "path": "/a"}, "name must be"),
        ({"name": "x", "path": "/a", "args": "-q"}, "args must be a list of strings"),
        ({"name": "x", "path": "/a", "action": "explode"}, "action must be one of"),
        ({"name": "x", "path": "/a", "timeout_seconds": 0}, "timeout_seconds must be positive"),
        ({"name": "x", "path": "/a", "interval_seconds": "1m"}, "must be a number"),
        ({"name": "x", "path": "/a", "damping": {"k": 3, "n": 2}}, "1 <= k <= n"),
        ({"name": "x", "path": "/a", "max_output_length": 5000}, "max_output_length"),
    ]
    for entry, said in bad:
        with pytest.raises(ConfigError, match=said.replace("[", r"\[").replace("]", r"\]")):
            config_from_mapping({"custom_checks": [entry]})
    with pytest.raises(ConfigError, match="repeated: x"):
        config_from_mapping({"custom_checks": [{"name": "x", "path": "/a"}] * 2})
    with pytest.raises(ConfigError, match="damped over their runs"):
        config_from_mapping({"damping_overrides": {"custom:x": {"k": 1, "n": 1}}})


def test_the_cli_builds_the_runner_from_the_health_config() -> None:
    assert custom_check_runner(HealthMonitor(HealthConfig())) is None
    assert custom_check_runner(None) is None
    cfg = config_from_mapping(
        {
            "custom_checks": [
                {
                    "name": "a",
                    "path": "/a",
                    "args": ["-q"],
                    "timeout_seconds": 9,
                    "damping": {"k": 2, "n": 7},
                },
                {"name": "b", "path": "/b", "interval_seconds": 60, "max_output_length": 20},
            ]
        }
    )
    runner = custom_check_runner(HealthMonitor(cfg))
    assert runner is not None
    assert runner.specs == (
        CheckSpec("a", "/a", ("-q",), 30.0, 9.0, 80),
        CheckSpec("b", "/b", (), 60.0, 5.0, 20),
    )
    runner.close()


# --- the check: pure ----------------------------------------------------------------------


def test_unknown_is_a_warning_without_action(sim: Sim) -> None:
    snapshot, _ = sim().poll()
    cfg = config_from_mapping({"custom_checks": [{"name": "x", "path": "/x", "action": "reboot"}]})
    reading = CustomCheckReading(
        "x", CUSTOM_UNKNOWN, "timeout", "timed out after 5s", 0.0, (CUSTOM_UNKNOWN,) * 5
    )
    (f,) = custom.check(replace(snapshot, custom_checks=(reading,)), History(), cfg, 1.0)
    assert (f.check, f.component, f.severity, f.action) == ("custom:x", "node", "warning", "none")
    assert f.evidence == "unknown (timeout): timed out after 5s"


# --- through the node agent's poller on the simulation --------------------------------------


def value(text: bytes, name: str, **labels: str) -> float | None:
    for got, v in series(text).get(name, []):
        if all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


def test_findings_and_metrics_through_the_poller(sim: Sim, tmp_path: Path) -> None:
    verdict = tmp_path / "verdict"
    verdict.write_text("1")
    path = script(
        tmp_path,
        "disk.sh",
        f'if [ "$(cat {verdict})" = 1 ]; then echo "/data is 99% full"; exit 1; fi\necho ok\n',
    )
    cfg = config_from_mapping(
        {
            "custom_checks": [
                {
                    "name": "disk",
                    "path": str(path),
                    "action": "reboot",
                    "damping": {"k": 2, "n": 3},
                },
                {"name": "absent", "path": str(tmp_path / "absent.sh")},
            ]
        }
    )
    monitor = HealthMonitor(cfg)
    runner = custom_check_runner(monitor)
    assert runner is not None
    h = sim()
    h.sources.custom_checks = runner
    h.poller.health = monitor
    clock = 0.0

    def run_and_poll() -> tuple[bytes, list[Finding]]:
        nonlocal clock
        runner.tick(clock)
        clock += 30.0
        assert runner.wait_idle(60)
        _, exposition = h.poll()
        assert monitor.last is not None
        return exposition.text, [f for f in monitor.last.findings if f.check.startswith("custom:")]

    text, found = run_and_poll()
    disk = next(f for f in found if f.check == "custom:disk")
    assert (disk.severity, disk.action, disk.actionable) == ("critical", "none", False)
    assert disk.evidence == "/data is 99% full (problem in 1 of the last 1 runs; acts at 2 of 3)"
    absent = next(f for f in found if f.check == "custom:absent")
    assert (absent.severity, absent.action) == ("warning", "none")
    assert "absent.sh not found" in absent.evidence
    assert value(text, "topowatch_custom_check_status", check="disk") == 1
    assert value(text, "topowatch_custom_check_status", check="absent") == 2
    assert value(text, "topowatch_custom_check_runs_total", check="disk", result="problem") == 1
    assert value(text, "topowatch_custom_check_runs_total", check="absent", result="error") == 1
    assert value(text, "topowatch_custom_check_duration_seconds_count", check="disk") == 1

    h.poll()  # a poll without a new run: still one run, still no action
    assert monitor.last is not None
    assert not any(f.actionable for f in monitor.last.findings if f.check == "custom:disk")

    text, found = run_and_poll()  # the second failing run: 2 of 3, the action
    disk = next(f for f in found if f.check == "custom:disk")
    assert (disk.action, disk.actionable) == ("reboot", True)
    assert value(text, "topowatch_custom_check_runs_total", check="disk", result="problem") == 2
    assert value(text, "topowatch_health_finding_actionable", check="custom:disk") == 1
    assert promtool_lint(text) == ""

    verdict.write_text("0")
    text, found = run_and_poll()
    assert [f.check for f in found] == ["custom:absent"]
    assert value(text, "topowatch_custom_check_status", check="disk") == 0
    assert value(text, "topowatch_custom_check_runs_total", check="disk", result="ok") == 1
    assert os.path.exists(path)


def test_the_node_command_runs_the_configured_checks(tmp_path: Path) -> None:
    """`topowatch node --once --health-config`: the checks run before the poll that prints."""
    from tests.cli.test_cli import topowatch

    path = script(tmp_path, "ntp.sh", "echo 'NTP unsynchronised'\nexit 1\n")
    config = tmp_path / "health.yaml"
    config.write_text(f"custom_checks:\n  - {{name: ntp, path: {path}}}\n")
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--health-config", str(config))
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout
    assert value(text, "topowatch_custom_check_status", check="ntp") == 1
    assert value(text, "topowatch_custom_check_runs_total", check="ntp", result="problem") == 1
    assert value(text, "topowatch_health_finding", check="custom:ntp", severity="warning") == 1
    config.write_text("custom_checks:\n  - {name: ntp, path: ntp.sh}\n")
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--health-config", str(config))
    assert proc.returncode == 2 and b"must be an absolute path" in proc.stderr
