"""A real slurmctld alone on loopback (auth/none, cred/none, no slurmd), for tests that need one.

Every node sits at 127.0.0.1; `scontrol show topology|node` and `scontrol update node=...`
work with no slurmd running. Shared by the topology and the remediation tests.

It leaves nothing running: before the daemons stop, every job is cancelled and the harness waits
(bounded) until squeue lists none and this cluster's slurmstepd processes are gone. slurmd
double-forks a slurmstepd per job step, so stopping slurmd under a running job orphaned its
slurmstepd, which ignores SIGTERM and outlived the test run (twice, on CI). Whatever is still
there after the daemons stopped is killed by PID, with a warning in the log.
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.topology.hostlist import compress
from tests import processes
from tests.conftest import free_port

START_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 30.0  # scancel to an empty squeue and no slurmstepd left
STOP_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


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
    since = processes.now_ticks()
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
                text = log_file.read_text() if log_file.exists() else ""
                pytest.fail(f"slurmctld exited {process.returncode}:\n{text[-3000:]}")
            shown = subprocess.run(
                [scontrol, "show", probe], env=env, capture_output=True, text=True, timeout=5
            )
            if shown.returncode == 0 and shown.stdout.strip():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"slurmctld did not answer within {START_TIMEOUT_S} s")
        with _running_slurmds(tmp, nodes, env) if slurmd else _nothing():
            try:
                yield env
            finally:
                drain(env, tmp, since)
    finally:
        _stop(process)
        _kill_job_processes(env, tmp, since)


def drain(
    env: Mapping[str, str], tmp: Path, since: int, timeout_s: float = DRAIN_TIMEOUT_S
) -> bool:
    """Cancel every job, every user's (by id: scancel needs a filter, squeue lists them all),
    until squeue lists none and no slurmstepd of this cluster runs; bounded by `timeout_s`,
    since a job step can hang. Whether it drained; it gives up at once when squeue fails (no
    controller to cancel with): the kill by PID after the daemons stop is what is left."""
    squeue, scancel = binary("squeue"), binary("scancel")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = subprocess.run(
                [squeue, "-h", "-a", "-o", "%A"],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if listed.returncode != 0:
                log.warning("squeue failed, cannot drain Slurm: %s", listed.stderr.strip())
                return False
            jobs = listed.stdout.split()
            if jobs:
                subprocess.run([scancel, *jobs], env=env, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired as exc:
            log.warning("cannot drain Slurm: %s", exc)
            return False
        steps = job_processes(env, tmp, since)
        if not jobs and not steps:
            return True
        if time.monotonic() > deadline:
            log.warning(
                "Slurm did not drain in %.0f s: jobs %s; job processes left: %s",
                timeout_s,
                " ".join(jobs) or "none",
                "; ".join(f"pid {p.pid}: {processes.cmdline(p)}" for p in steps) or "none",
            )
            return False
        time.sleep(0.2)


def job_processes(env: Mapping[str, str], tmp: Path, since: int) -> list[processes.Proc]:
    """This cluster's job processes, started at or after `since` (clock ticks): its slurmstepds
    (they hold this cluster's slurmd log open, under `tmp`) and everything below them, and any
    process whose environment has this cluster's SLURM_CONF and a SLURM_JOB_ID (a job's own
    processes, even once their slurmstepd is gone). Other clusters on the host are left out."""
    under = os.path.realpath(tmp) + os.sep
    conf = f"SLURM_CONF={env['SLURM_CONF']}".encode()
    table = processes.scan()
    found: dict[processes.Key, processes.Proc] = {}
    for proc in table.values():
        if proc.start < since or not proc.running or proc.key in found:
            continue
        if proc.comm == "slurmstepd":
            if any(path.startswith(under) for path in processes.open_paths(proc.pid)):
                found[proc.key] = proc
                found.update((p.key, p) for p in processes.descendants(table, proc.pid))
            continue
        entries = processes.environ(proc.pid)
        if conf in entries and any(e.startswith(b"SLURM_JOB_ID=") for e in entries):
            found[proc.key] = proc
    return sorted(found.values(), key=lambda p: (p.start, p.pid))


def _kill_job_processes(env: Mapping[str, str], tmp: Path, since: int) -> None:
    """After the daemons stopped: kill by PID whatever of this cluster's jobs is still there."""
    left = job_processes(env, tmp, since)
    if not left:
        return
    log.warning(
        "killing %d Slurm job process(es) left after slurmd and slurmctld stopped: %s",
        len(left),
        "; ".join(f"pid {p.pid}: {processes.cmdline(p)}" for p in left),
    )
    if stuck := processes.terminate(left):
        log.warning("still running after SIGKILL: %s", ", ".join(str(p.pid) for p in stuck))


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL; then whatever the daemon had forked (slurmctld's slurmscriptd)
    gets a moment to exit with it, and is killed by PID if it does not."""
    below = processes.descendants(processes.scan(), process.pid)
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if left := processes.wait_gone(below, STOP_TIMEOUT_S / 2):
        log.warning(
            "killing what %s left: %s",
            process.args[0] if isinstance(process.args, list) else process.args,
            "; ".join(f"pid {p.pid}: {processes.cmdline(p)}" for p in left),
        )
        processes.terminate(left)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _running_slurmds(tmp: Path, nodes: list[str], env: dict[str, str]) -> Iterator[None]:
    """One `slurmd -D -N NAME` per node; wait until sinfo shows every node idle."""
    slurmd, sinfo = binary("slurmd"), binary("sinfo")
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for name in nodes:
            daemons.append(
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
        for process in daemons:
            _stop(process)
