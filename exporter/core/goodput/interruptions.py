"""One interruption of a job: the ledger entry, and its JSON form for the history store.

An entry is opened when a running job stops running and is never removed: its attribution
(cause, component, evidence) may change until it is `settled` (`attribution.SETTLE_S` after the
stop), its times fill in as the job's nodes act and come back and the job runs again. The id
names the job and the entry's place in the job's ledger, so a restarted process (or another
replica) that rebuilds the same entry writes the same row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from exporter.core.goodput.causes import CAUSES, Cause

JobKey = tuple[str, str, str]  # (namespace, owner kind, job name)


def job_id(key: JobKey) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


@dataclass(frozen=True, slots=True)
class Interruption:
    id: str  # "<namespace>/<kind>/<job>#<n>", n counting from 1 in the job's ledger
    namespace: str
    job_kind: str
    job: str
    workload: str  # the Workload that was running (the first, for a job of several)
    cluster_queue: str
    team: str
    flavor: str
    gpus: int  # GPUs the job held when it stopped
    nodes: tuple[str, ...]
    stopped_at: float
    cause: Cause = "unknown"
    component: str = ""
    detail: str = ""
    uncertain: str = ""
    missing: str = ""
    node: str = ""  # the node whose evidence decided it
    check: str = ""
    finding_component: str = ""
    verdict: str = ""
    preemptor: str = ""
    action: str = ""
    detected_at: float | None = None
    action_at: float | None = None
    node_back_at: float | None = None
    resumed_at: float | None = None
    settled: bool = False
    checkpoint_at: float | None = None
    checkpoint_note: str = ""
    # Time the job spent, after this stop and until it ran again, with pods bound but not yet
    # all Ready (restarting), and with none bound (waiting: quota, topology, a node replaced).
    restarting_s: float = 0.0
    waiting_s: float = 0.0
    run_started: float | None = None  # when the run this stop ended began

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.job_kind, self.job)

    @property
    def counted(self) -> bool:
        """An interruption proper: a job that completed was not interrupted."""
        return self.cause != "completed"

    def lost_gpu_seconds(self, now: float) -> float:
        """GPUs held idle or torn down x time until running again (now while it is not)."""
        if not self.counted:
            return 0.0
        end = self.resumed_at if self.resumed_at is not None else now
        return self.gpus * max(0.0, end - self.stopped_at)

    @property
    def work_lost_gpu_seconds(self) -> float | None:
        """GPU-seconds of work since the job's last checkpoint (None: no checkpoint known)."""
        if self.checkpoint_at is None or not self.counted:
            return None
        return self.gpus * max(0.0, self.stopped_at - self.checkpoint_at)

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"] = list(self.nodes)
        if now is not None:
            out["lost_gpu_seconds"] = self.lost_gpu_seconds(now)
        out["work_lost_gpu_seconds"] = self.work_lost_gpu_seconds
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interruption | None:
        """The entry a store document holds; None when it is not one (never raises)."""
        try:
            values: dict[str, Any] = {}
            for f in fields(cls):
                if f.name in data:
                    values[f.name] = data[f.name]
            values["nodes"] = tuple(str(n) for n in values.get("nodes", ()))
            if values.get("cause") not in CAUSES:
                values["cause"] = "unknown"
            entry = cls(**values)
            if not isinstance(entry.stopped_at, int | float) or not entry.id:
                return None
            return entry
        except (TypeError, ValueError):
            return None
