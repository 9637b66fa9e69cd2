"""The `topowatch` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import promtool_lint

REPO = Path(__file__).resolve().parents[2]


def topowatch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "NODE_NAME": "cli-node"}
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=timeout,
    )


def test_node_once_on_the_simulation_prints_a_clean_exposition() -> None:
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--fault", "xid=79@gpu3")
    assert proc.returncode == 0, proc.stderr.decode()
    assert b'topowatch_gpu_up{node="cli-node",gpu="0"' in proc.stdout
    assert b'xid="79"' in proc.stdout
    assert promtool_lint(proc.stdout) == ""


def test_node_once_accepts_hyperpod_instance_type_names() -> None:
    proc = topowatch(
        "node", "--simulate", "ml.p6e-gb200.36xlarge", "--once", "--compat", "dcgm,efa"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"DCGM_FI_DEV_GPU_TEMP{" in proc.stdout and b"node_amazonefa_tx_bytes{" in proc.stdout


def test_bad_fault_spec_is_a_clear_error() -> None:
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--fault", "xid=79@gpu99")
    assert proc.returncode == 2
    assert b"GPUs 0..7" in proc.stderr
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--fault", "melt@gpu0")
    assert proc.returncode == 2 and b"unknown fault kind" in proc.stderr


def test_unknown_profile_and_compat_mode_are_clear_errors() -> None:
    proc = topowatch("node", "--simulate", "p4d.24xlarge", "--once")
    assert proc.returncode == 2 and b"known profiles" in proc.stderr
    proc = topowatch("node", "--simulate", "p5.48xlarge", "--once", "--compat", "nvsmi")
    assert proc.returncode == 2 and b"unknown compat mode" in proc.stderr


def node_without_hardware(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    """One poll of the real agent with no GPU, no Kubernetes and an empty sysfs/proc tree."""
    root = str(tmp_path)
    return topowatch(
        "node", "--once", "--no-kubernetes", "--sysfs-root", root, "--proc-root", root, *extra
    )


def test_no_gpu_no_simulation_still_exports_with_the_reason(tmp_path: Path) -> None:
    proc = node_without_hardware(tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b'topowatch_nvml_up{node="cli-node"} 0' in proc.stdout
    assert b'reason="nvml_unavailable"' in proc.stdout
    assert b"NVML" in proc.stderr  # said plainly in the log
    assert promtool_lint(proc.stdout) == ""


def test_a_kernel_log_asked_for_and_unreadable_is_a_failing_collector_not_a_dead_agent(
    tmp_path: Path,
) -> None:
    """`--kernel-log journal` with no journal to read (the chart's journal mounts without the
    systemd-journal group, say): the agent serves, and says why in its metrics and log."""
    proc = node_without_hardware(
        tmp_path,
        "--kernel-log",
        "journal",
        "--journal-dir",
        str(tmp_path / "no-journal-here"),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b'topowatch_exporter_collector_success{node="cli-node",collector="kernel_log"} 0' in (
        proc.stdout
    )
    assert b'collector="kernel_log",reason="journal_unreadable"' in proc.stdout
    assert b"no-journal-here" in proc.stderr
    assert promtool_lint(proc.stdout) == ""


def test_every_subcommand_has_help() -> None:
    proc = topowatch("node", "--help")
    assert proc.returncode == 0 and b"--simulate" in proc.stdout and b"--compat" in proc.stdout


def test_a_taken_port_is_one_line_naming_the_option_not_a_traceback() -> None:
    """Each command's listening socket taken by another process: exit 2, one line that says
    which address and which option picks another port (issue 31)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        node = topowatch(
            "node", "--simulate", "p5.48xlarge", "--no-kubernetes", "--listen", f"127.0.0.1:{port}"
        )
        cluster = topowatch("cluster", "--simulate", "--listen", f"127.0.0.1:{port}")
    for proc in (node, cluster):
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "Traceback" not in err, err
        (line,) = [x for x in err.splitlines() if x.startswith("topowatch ")]
        assert f"127.0.0.1:{port}" in line or f"'127.0.0.1', {port}" in line, line
        assert "address already in use" in line and "--listen HOST:PORT" in line, line


def test_a_demo_fault_without_a_node_names_the_nodes_to_choose_from() -> None:
    proc = topowatch(
        "demo",
        "--prometheus-port",
        "0",
        "--listen",
        "127.0.0.1:0",
        "--node-port-base",
        "0",
        "--duration",
        "1",
        "--fault",
        "xid=79@gpu3",
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert "without node=NAME" in err and "write it as node=hyperpod-i-" in err, err
