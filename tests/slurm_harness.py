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
from collections.abc import Iterator, Mapping, Sequence
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


def slurm_conf(
    tmp: Path,
    nodes: list[str],
    topology: bool,
    slurmd: bool = False,
    addresses: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> str:
    """`slurmd`: one NodeName line per node with its own Port=, so one slurmd per node can run
    on this one host (`slurmd -N NAME`), each with its own spool, pid and log file (%n).
    `addresses`: a NodeAddr per node (127.0.0.0/8 is all loopback: an agent per node can listen
    on its own address with the port every agent shares, as on a real cluster).
    `extra`: more slurm.conf lines, after the others (e.g. `SlurmdTimeout=0`)."""
    if addresses is None and not slurmd:
        node_lines = [f"NodeName={compress(nodes)} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN"]
    else:
        node_lines = [
            f"NodeName={name} NodeAddr={(addresses or {}).get(name, '127.0.0.1')}"
            + (f" Port={free_port()}" if slurmd else "")
            + " CPUs=1 State=UNKNOWN"
            for name in nodes
        ]
    spool = tmp / "spool" / "%n" if slurmd else tmp / "spool"
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
            f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}",
            f"SlurmctldLogFile={tmp / 'slurmctld.log'}",
            *(
                [
                    f"SlurmdPidFile={tmp / 'slurmd-%n.pid'}",
                    f"SlurmdLogFile={tmp / 'slurmd-%n.log'}",
                    "ReturnToService=2",
                ]
                if slurmd
                else []
            ),
            "TopologyPlugin=topology/tree" if topology else "TopologyPlugin=topology/none",
            "SelectType=select/cons_tres",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            *node_lines,
            "PartitionName=all Nodes=ALL Default=YES State=UP",
            *extra,
            "",
        ]
    )


@contextmanager
def running_slurmctld(
    tmp: Path,
    nodes: list[str],
    topology_conf: str | None = None,
    probe: str = "node",
    slurmd: bool = False,
    addresses: Mapping[str, str] | None = None,
    extra_conf: Sequence[str] = (),
) -> Iterator[dict[str, str]]:
    """Start slurmctld, wait until `scontrol show PROBE` answers, yield the env, stop it.

    `slurmd=True` (root only) also starts one slurmd per node and waits until every node is
    idle, so jobs can run; slurmd logs a config-differs warning and mpi/pmix errors, harmless.
    """
    slurmctld, scontrol = binary("slurmctld"), binary("scontrol")
    for directory in ("state", "spool"):
        (tmp / directory).mkdir(parents=True, exist_ok=True)
    if slurmd:
        for name in nodes:
            (tmp / "spool" / name).mkdir(exist_ok=True)
    (tmp / "slurm.conf").write_text(
        slurm_conf(tmp, nodes, topology_conf is not None, slurmd, addresses, extra_conf)
    )
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
        with _running_slurmds(tmp, nodes, env) if slurmd else _nothing():
            yield env
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _running_slurmds(tmp: Path, nodes: list[str], env: dict[str, str]) -> Iterator[None]:
    """One `slurmd -D -N NAME` per node; wait until sinfo shows every node idle."""
    slurmd, sinfo = binary("slurmd"), binary("sinfo")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name in nodes:
            processes.append(
                subprocess.Popen(
                    [slurmd, "-D", "-N", name, "-f", str(tmp / "slurm.conf")],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            shown = subprocess.run(
                [sinfo, "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True
            )
            states = dict(line.split() for line in shown.stdout.splitlines() if line.strip())
            if len(states) >= len(nodes) and all(states.get(n) == "idle" for n in nodes):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"slurmd nodes not idle within {START_TIMEOUT_S * 2} s: {shown.stdout}")
        yield
    finally:
        for process in processes:
            _stop(process)
