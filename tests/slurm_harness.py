"""A real slurmctld alone on loopback (auth/none, cred/none, no slurmd), for tests that need one.

Every node sits at 127.0.0.1; `scontrol show topology|node` and `scontrol update node=...`
work with no slurmd running. Shared by the topology and the remediation tests.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.topology.hostlist import compress
from tests.conftest import free_port

START_TIMEOUT_S = 10.0


def binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        pytest.fail(f"{name} missing: run scripts/bootstrap.sh (Debian slurmctld slurm-client)")
    return path


def slurm_conf(tmp: Path, nodes: list[str], topology: bool) -> str:
    return "\n".join(
        [
            "ClusterName=topowatch",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"SlurmUser={getpass.getuser()}",
            f"StateSaveLocation={tmp / 'state'}",
            f"SlurmdSpoolDir={tmp / 'spool'}",
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}",
            f"SlurmctldLogFile={tmp / 'slurmctld.log'}",
            "TopologyPlugin=topology/tree" if topology else "TopologyPlugin=topology/none",
            "SelectType=select/cons_tres",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            f"NodeName={compress(nodes)} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN",
            "PartitionName=all Nodes=ALL Default=YES State=UP",
            "",
        ]
    )


@contextmanager
def running_slurmctld(
    tmp: Path, nodes: list[str], topology_conf: str | None = None, probe: str = "node"
) -> Iterator[dict[str, str]]:
    """Start slurmctld, wait until `scontrol show PROBE` answers, yield the env, stop it."""
    slurmctld, scontrol = binary("slurmctld"), binary("scontrol")
    for directory in ("state", "spool"):
        (tmp / directory).mkdir(exist_ok=True)
    (tmp / "slurm.conf").write_text(slurm_conf(tmp, nodes, topology_conf is not None))
    if topology_conf is not None:
        (tmp / "topology.conf").write_text(topology_conf)
    env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}
    process = subprocess.Popen(
        [slurmctld, "-D", "-f", str(tmp / "slurm.conf")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log_file = tmp / "slurmctld.log"
                log = log_file.read_text() if log_file.exists() else ""
                pytest.fail(f"slurmctld exited {process.returncode}:\n{log[-3000:]}")
            shown = subprocess.run(
                [scontrol, "show", probe], env=env, capture_output=True, text=True, timeout=5
            )
            if shown.returncode == 0 and shown.stdout.strip():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"slurmctld did not answer within {START_TIMEOUT_S} s")
        yield env
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
