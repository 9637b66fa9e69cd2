"""Node faults at Meta's published rates, the simulated HyperPod operator's recovery, and the
ground truth the goodput ledger is measured against (benchmarks/goodput.py).

Rates and mix: Meta's Llama 3 report (The Llama 3 Herd of Models, 2024, table 5) counts 419
unexpected interruptions in 54 days of a 16,384-GPU (2,048-node) H100 job: 3.79 per 1,000
node-days, of which faulty GPU 30.1 %, GPU HBM3 17.2 %, software bug 12.9 %, network switch or
cable 8.4 %, host maintenance 7.6 %, GPU SRAM 4.5 %, GPU system processor 4.1 %, and many small
ones (NIC, NCCL watchdog, silent data corruption, thermal, SSD, power supply, chassis, ...).
Here the rest is split between NVLink (7 %), the host's kernel (8 %) and the GPU system
processor (4 %). A demo scales the rate up (`FaultRates.scale`), keeping the mix.

How each fault shows (what a cluster watcher can see), and its true cause:
- the node agent publishes a finding in the Node's `topowatch.io/findings` annotation, first
  seen at the fault (faulty GPU: XID 79; HBM: XID 48; SRAM: XID 95; software: XID 13, no
  action; network: EFA link down; NVLink: XID 74; GPU system processor: XID 119; kernel: a
  kernel log finding), and the job's pods die with it;
- host maintenance shows no finding: the node goes NotReady and the pods die;
- the agent writes the finding up to `report_delay_s` late, its clock up to `agent_skew_s` off
  the API server's, and now and then garbled (`garbled_report_p`: a truncated annotation, put
  right at its next write), so a watcher sees the finding after the pods' end, sometimes
  stamped after it;
- HyperPod then marks the node for reboot or replacement (30-90 s later), and it comes back
  (findings cleared, Schedulable) after the repair; software faults need no repair.
- Proactive remediation (`remediation_per_1000_node_days`): a warning finding with action
  reboot (pending row remaps) that kills nothing; 5-15 minutes later HyperPod reboots the node,
  and that reboot is what stops the jobs on it (true cause: remediation).
Jobs hit by a fault are restarted by the operator (HyperPod auto-resume): they keep their
Kueue admission, their pods come back once every node of their placement is usable again,
start not Ready, and are Ready after a start-up time; only then does training progress.

`GroundTruth` records each interruption (the job, when, the true cause and component) and each
job's true running time (every pod Ready), as the simulator makes them happen.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Final

JobKey = tuple[str, str, str]  # (namespace, owner kind, job): the goodput ledger's key

META_RATE_PER_1000_NODE_DAYS: Final = 419 / (2048 * 54) * 1000


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    share: float  # of all faults
    component: str  # the true component (exporter.core.goodput.causes.COMPONENTS)
    check: str  # the finding's check id; "" when the fault shows no finding
    where: str  # "gpu" (a GPU index), "efa" (a device port), "node"
    severity: str
    action: str  # none | reboot | replace
    evidence: str
    node_down: bool = False  # the node goes NotReady
    repair: str = ""  # reboot | replace | "" (no repair: the node stays usable)
    repair_s: tuple[float, float] = (0.0, 0.0)


META_MIX: Final[tuple[FaultKind, ...]] = (
    FaultKind(
        "faulty_gpu", 0.30, "gpu", "xid", "gpu", "fatal", "replace",
        "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
        repair="replace", repair_s=(900.0, 1800.0),
    ),
    FaultKind(
        "gpu_hbm", 0.17, "hbm", "xid", "gpu", "fatal", "reboot",
        "XID 48 ROBUST_CHANNEL_GPU_ECC_DBE (WORKFLOW_XID_48) x1",
        repair="reboot", repair_s=(480.0, 900.0),
    ),
    FaultKind(
        "software", 0.13, "software", "xid", "gpu", "critical", "none",
        "XID 13 ROBUST_CHANNEL_GR_EXCEPTION (RESTART_APP) x1",
    ),
    FaultKind(
        "network", 0.08, "network", "efa_link_down", "efa", "critical", "reboot",
        "EFA port state DOWN", repair="reboot", repair_s=(480.0, 900.0),
    ),
    FaultKind(
        "host_maintenance", 0.08, "host", "", "node", "", "", "", node_down=True,
        repair="reboot", repair_s=(600.0, 1200.0),
    ),
    FaultKind(
        "gpu_sram", 0.05, "hbm", "xid", "gpu", "fatal", "replace",
        "XID 95 ROBUST_CHANNEL_UNCONTAINED_ERROR (RESET_GPU) x1",
        repair="replace", repair_s=(900.0, 1800.0),
    ),
    FaultKind(
        "nvlink", 0.07, "nvlink", "xid", "gpu", "fatal", "reboot",
        "XID 74 NVLINK_ERROR (WORKFLOW_NVLINK_ERR) x1", repair="reboot", repair_s=(480.0, 900.0),
    ),
    FaultKind(
        "host_kernel", 0.08, "host", "kernel_log", "node", "critical", "reboot",
        "kernel: BUG: soft lockup - CPU#12 stuck for 22s", repair="reboot",
        repair_s=(480.0, 900.0),
    ),
    FaultKind(
        "gpu_system_processor", 0.04, "gpu", "xid", "gpu", "fatal", "reboot",
        "XID 119 GSP_RPC_TIMEOUT (RESET_GPU) x1", repair="reboot", repair_s=(480.0, 900.0),
    ),
)  # fmt: skip
PROACTIVE: Final = FaultKind(
    "proactive_reboot", 0.0, "hbm", "row_remap_pending", "gpu", "warning", "reboot",
    "2 pending row remaps", repair="reboot", repair_s=(480.0, 900.0),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FaultRates:
    """How often nodes fail (per 1,000 node-days, times `scale` for a demo), the mix, and how
    long HyperPod's recovery takes."""

    per_1000_node_days: float = META_RATE_PER_1000_NODE_DAYS
    scale: float = 1.0
    mix: tuple[FaultKind, ...] = META_MIX
    remediation_per_1000_node_days: float = 0.5
    detect_to_action_s: tuple[float, float] = (30.0, 90.0)
    restart_delay_s: tuple[float, float] = (30.0, 90.0)  # the operator recreating the pods
    startup_s: tuple[float, float] = (60.0, 180.0)  # pods created to all Ready
    remediation_after_s: tuple[float, float] = (300.0, 900.0)  # warning -> proactive reboot
    # The node agent: how late it writes a finding to the Node (its report interval), how far
    # its clock is off the API server's, and how often a write is garbled (a truncated value).
    report_delay_s: tuple[float, float] = (0.0, 45.0)
    agent_skew_s: tuple[float, float] = (-2.0, 6.0)
    garbled_report_p: float = 0.02

    def per_node_second(self) -> float:
        return self.per_1000_node_days * self.scale / 1000 / 86_400

    def remediation_per_node_second(self) -> float:
        return self.remediation_per_1000_node_days * self.scale / 1000 / 86_400


@dataclass(frozen=True, slots=True)
class TruthInterruption:
    job: JobKey
    workload: str
    time: float
    cause: str  # preempted | node_fault | remediation | completed | ...
    component: str  # for node_fault and remediation; "" otherwise
    node: str = ""
    fault: str = ""  # the FaultKind's name


@dataclass(slots=True)
class TruthJob:
    key: JobKey
    first_admitted: float | None = None
    running_s: float = 0.0
    running_since: float | None = None
    finished_at: float | None = None

    def running_at(self, now: float) -> float:
        extra = now - self.running_since if self.running_since is not None else 0.0
        return self.running_s + max(0.0, extra)

    def ettr(self, now: float) -> float | None:
        if self.first_admitted is None:
            return None
        end = self.finished_at if self.finished_at is not None else now
        wall = end - self.first_admitted
        return self.running_at(end) / wall if wall > 0 else None


@dataclass
class GroundTruth:
    interruptions: list[TruthInterruption] = field(default_factory=list)
    jobs: dict[JobKey, TruthJob] = field(default_factory=dict)
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (time, node, kind)

    def job(self, key: JobKey) -> TruthJob:
        found = self.jobs.get(key)
        if found is None:
            found = self.jobs[key] = TruthJob(key)
        return found

    def admitted(self, key: JobKey, now: float) -> None:
        job = self.job(key)
        if job.first_admitted is None:
            job.first_admitted = now

    def started(self, key: JobKey, now: float) -> None:
        job = self.job(key)
        if job.running_since is None:
            job.running_since = now

    def ended(self, key: JobKey, now: float) -> None:
        """The job's Workload is gone (finished and collected, or abandoned by its owner)."""
        job = self.jobs.get(key)
        if job is not None and job.finished_at is None:
            job.running_s += max(0.0, now - job.running_since) if job.running_since else 0.0
            job.running_since = None
            job.finished_at = now

    def running(self, key: JobKey) -> bool:
        job = self.jobs.get(key)
        return job is not None and job.running_since is not None

    def stopped(
        self,
        key: JobKey,
        workload: str,
        now: float,
        cause: str,
        component: str = "",
        node: str = "",
        fault: str = "",
    ) -> bool:
        """The job stopped running: an interruption (only if it was running)."""
        job = self.jobs.get(key)
        if job is None or job.running_since is None:
            return False
        job.running_s += max(0.0, now - job.running_since)
        job.running_since = None
        self.interruptions.append(
            TruthInterruption(key, workload, now, cause, component, node, fault)
        )
        if cause == "completed":
            job.finished_at = now
        return True


class FaultDraw:
    """Which nodes fail in a step, and how: a Poisson process per node, its own generator (so
    turning faults on changes nothing else the simulation draws)."""

    def __init__(self, rates: FaultRates, seed: int) -> None:
        self.rates = rates
        self.rng = random.Random(f"node-faults-{seed}")
        total = sum(k.share for k in rates.mix)
        self._cumulative: list[tuple[float, FaultKind]] = []
        acc = 0.0
        for kind in rates.mix:
            acc += kind.share / total
            self._cumulative.append((acc, kind))

    def faults(self, nodes: list[str], dt: float) -> list[tuple[str, FaultKind]]:
        if dt <= 0:
            return []
        p_fault = 1.0 - math.exp(-self.rates.per_node_second() * dt)
        p_warn = 1.0 - math.exp(-self.rates.remediation_per_node_second() * dt)
        out: list[tuple[str, FaultKind]] = []
        for node in nodes:
            if self.rng.random() < p_fault:
                out.append((node, self._kind(self.rng.random())))
            elif self.rng.random() < p_warn:
                out.append((node, PROACTIVE))
        return out

    def _kind(self, u: float) -> FaultKind:
        for bound, kind in self._cumulative:
            if u <= bound:
                return kind
        return self._cumulative[-1][1]

    def between(self, bounds: tuple[float, float]) -> float:
        return float(round(self.rng.uniform(*bounds)))
