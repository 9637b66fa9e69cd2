"""Slurm jobs as `squeue --json` prints them, across the openapi/data_parser versions.

The shapes moved between Slurm releases (each read from SchedMD's own dumpers; the fixtures in
tests/fixtures/slurm/ hold one document per version and its README cites the lines):
- openapi v0.0.38 (21.08-22.05, src/plugins/openapi/v0.0.38/jobs.c): `job_state` a string
  ("PENDING"); numbers plain or null; `job_resources` (only for allocated jobs) has `nodes` as a
  hostlist string and `allocated_nodes` as a list of `{"nodename": ...}`; no switch request.
- data_parser v0.0.39 (23.02): `job_state` still a string; `*_NO_VAL` numbers become
  `{"set": bool, "infinite": bool, "number": N}`; `minimum_switches` (a plain count, the
  `--switches` maximum despite its name) appears.
- v0.0.40 (23.11): `job_state` a list, base state and flags (["PENDING", "REQUEUED"]); times
  are `{"set", "infinite", "number"}` too.
- v0.0.41 (24.05): `job_resources.nodes` becomes an object: `{"count", "select_type", "list"
  (hostlist), "whole", "allocation": [{"name": ...}, ...]}`.
- v0.0.42 (24.11+): the switch count is `required_switches`.
What the goodput ledger reads (exporter/slurm/goodput.py) kept its name throughout: `restart_cnt`
(a plain count: how many times slurmctld requeued the job, `scontrol requeue`, a node failure or
a preemption with PreemptMode=REQUEUE; slurm.h `job_info_t.restart_cnt`), `account`, and the
times `end_time`, `suspend_time` and `preempt_time` (plain, then `{"set", "number"}` objects from
v0.0.40). v0.0.38/v0.0.39 print job_state_string(), which names one flag instead of the base
state when a flag is set (slurm_protocol_defs.c: COMPLETING, CONFIGURING, REQUEUED, REQUEUE_HOLD,
...): the base state is then inferred (`state_from_flag`), a requeued job being PENDING again.
The job's own `nodes` (the allocated nodes as a hostlist string) kept its shape throughout and is
read first. A job that cannot be read keeps what could be read and carries its problems as
"unknown: <why>" strings; a document that cannot be read at all is a problem, never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.topology.hostlist import HostlistError, expand

__all__ = [
    "ALLOCATED_STATES",
    "BASE_STATES",
    "SlurmJob",
    "parse_jobs",
]

# Base job states (squeue(1) JOB STATE CODES; slurm.h enum job_states). Everything else in a
# `job_state` list is a flag (REQUEUED, COMPLETING, CONFIGURING, ...).
BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# v0.0.38/v0.0.39 print job_state_string(), which names some flags instead of the base state
# (slurm_protocol_defs.c: COMPLETING, CONFIGURING, RESIZING, REQUEUED, ... come first).
_FLAG_NAMES_HOLDING_NODES = frozenset({"CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING"})
# Flags that mean the job is queued again: slurmctld's job requeue sets JOB_PENDING with
# JOB_REQUEUE (while the old run's nodes finish), JOB_REQUEUE_HOLD (`scontrol requeuehold`),
# JOB_SPECIAL_EXIT, JOB_REQUEUE_FED; a reservation's deletion holds it (RESV_DEL_HOLD). A job
# STOPPED by SIGSTOP keeps its allocation.
_FLAG_NAMES_BASE = {
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "STOPPED": "RUNNING",
}
# States in which the job holds its nodes, so where it landed can be judged. A CONFIGURING job
# (nodes booting) already has them; a COMPLETING one is releasing them and is left out.
ALLOCATED_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING"})
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job record of `squeue --json`. Absent numbers are None, absent strings ""."""

    job_id: str  # "123", or "123_4" for an array task, as squeue shows it
    name: str
    user: str
    partition: str  # may be a comma list while pending ("gpu,cpu")
    state: str  # the base state, upper case: PENDING, RUNNING, ... ("" when unreadable)
    state_flags: frozenset[str]  # CONFIGURING, REQUEUED, COMPLETING, ...
    reason: str  # state_reason: "Resources", "Priority", "None", ...
    reason_detail: str  # state_description: "ReqNodeNotAvail, UnavailableNodes:gpu-3"
    nodes: tuple[str, ...]  # allocated node names, in hostlist order
    node_count: int | None  # allocated, or the minimum asked for while pending
    max_nodes: int | None
    switches: int | None  # --switches: at most this many leaf switches (None: not asked)
    contiguous: bool
    dependency: str
    required_nodes: str
    excluded_nodes: str
    gpus: int | None  # GPUs allocated (tres_alloc_str) or asked for (tres_req_str)
    submit_time: float | None
    start_time: float | None
    api_version: str  # "v0.0.38" ... from meta.plugin, "" when absent
    problems: tuple[str, ...] = field(default=())
    restart_count: int | None = None  # restart_cnt: times slurmctld requeued it (None: absent)
    account: str = ""
    end_time: float | None = None  # when it ended (or, while running, its time limit)
    suspend_time: float | None = None  # its last suspension or resumption
    preempt_time: float | None = None  # when slurmctld chose it for preemption
    # The base state was inferred from the one flag job_state_string() printed (v0.0.38/39):
    # a COMPLETING job read as COMPLETED may be ending any way (cancelled, requeued, ...).
    state_from_flag: bool = False

    @property
    def allocated(self) -> bool:
        """The job holds nodes right now (running, suspended, or configuring them)."""
        return bool(self.nodes) and (
            self.state in ALLOCATED_STATES or "CONFIGURING" in self.state_flags
        )

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


def parse_jobs(text: str) -> tuple[list[SlurmJob], list[str]]:
    """Every job of one `squeue --json` document, and the problems of the document itself."""
    try:
        document = json.loads(text)
    except (ValueError, TypeError) as exc:
        return [], [f"unknown: squeue output is not JSON ({exc})"]
    if not isinstance(document, Mapping):
        return [], ["unknown: squeue output is not a JSON object"]
    problems: list[str] = []
    for error in _list(document.get("errors")):
        said = (
            _text(error.get("error") or error.get("description"))
            if isinstance(error, Mapping)
            else _text(error)
        )
        if said:
            problems.append(f"squeue reported an error: {said}")
    entries = document.get("jobs")
    if not isinstance(entries, list):
        problems.append("unknown: squeue output has no jobs list")
        return [], problems
    version = _api_version(document.get("meta"))
    jobs: list[SlurmJob] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            problems.append(f"unknown: jobs[{index}] is not an object")
            continue
        jobs.append(_job(entry, version, index))
    return jobs, problems


def _api_version(meta: Any) -> str:
    if not isinstance(meta, Mapping):
        return ""
    plugin = meta.get("plugin")
    if isinstance(plugin, Mapping):
        # v0.0.38: "openapi/v0.0.38"; v0.0.40+: data_parser "data_parser/v0.0.40"
        for key in ("data_parser", "type"):
            found = re.search(r"v\d+\.\d+\.\d+", _text(plugin.get(key)))
            if found:
                return found.group(0)
    return ""


def _job(entry: Mapping[str, Any], version: str, index: int) -> SlurmJob:
    problems: list[str] = []
    job_id = _job_id(entry, problems, index)
    state, flags, inferred = _state(entry.get("job_state"), problems)
    nodes = _nodes(entry, problems)
    switches = _number(entry.get("required_switches"), "required_switches", problems)
    if switches is None:
        switches = _number(entry.get("minimum_switches"), "minimum_switches", problems)
    gpus = _gpus(entry.get("tres_alloc_str")) if nodes else None
    if gpus is None:
        gpus = _gpus(entry.get("tres_req_str"))
    return SlurmJob(
        job_id=job_id,
        name=_text(entry.get("name")),
        user=_text(entry.get("user_name")) or _user_id(entry.get("user_id")),
        partition=_text(entry.get("partition")),
        state=state,
        state_flags=flags,
        reason=_text(entry.get("state_reason")),
        reason_detail=_text(entry.get("state_description")),
        nodes=nodes,
        node_count=_number(entry.get("node_count"), "node_count", problems),
        max_nodes=_number(entry.get("max_nodes"), "max_nodes", problems),
        # 0 is what slurmctld keeps when --switches was not given (job_info req_switch)
        switches=switches or None,
        contiguous=_bool(entry.get("contiguous")),
        dependency=_text(entry.get("dependency")),
        required_nodes=_text(entry.get("required_nodes")),
        excluded_nodes=_text(entry.get("excluded_nodes")),
        gpus=gpus,
        submit_time=_time(entry.get("submit_time"), "submit_time", problems),
        start_time=_time(entry.get("start_time"), "start_time", problems),
        api_version=version,
        restart_count=_number(entry.get("restart_cnt"), "restart_cnt", problems),
        account=_text(entry.get("account")),
        end_time=_time(entry.get("end_time"), "end_time", problems),
        suspend_time=_time(entry.get("suspend_time"), "suspend_time", problems),
        preempt_time=_time(entry.get("preempt_time"), "preempt_time", problems),
        state_from_flag=inferred,
        problems=tuple(problems),  # last: the readings above may add to them
    )


def _job_id(entry: Mapping[str, Any], problems: list[str], index: int) -> str:
    job_id = _number(entry.get("job_id"), "job_id", problems)
    if job_id is None:
        problems.append("unknown: no job_id")
        return f"?{index}"
    array_job = _number(entry.get("array_job_id"), "array_job_id", problems)
    array_task = _number(entry.get("array_task_id"), "array_task_id", problems)
    if array_job and array_task is not None:
        return f"{array_job}_{array_task}"  # squeue's %i for an array task
    return str(job_id)


def _state(value: Any, problems: list[str]) -> tuple[str, frozenset[str], bool]:
    """(base state, flags, whether the base was inferred from a flag) from a string
    (v0.0.38/39) or a list (v0.0.40+)."""
    if isinstance(value, str):
        words = [value.strip().upper()]
    elif isinstance(value, list) and all(isinstance(word, str) for word in value):
        words = [word.strip().upper() for word in value]
    else:
        problems.append(f"unknown: job_state {_short(value)}")
        return "", frozenset(), False
    base = [word for word in words if word in BASE_STATES]
    flags = frozenset(word for word in words if word and word not in BASE_STATES)
    if base:
        return base[0], flags, False
    if flags & _FLAG_NAMES_HOLDING_NODES:
        # job_state_string() printed a flag: such a job has been allocated nodes.
        return ("RUNNING" if "COMPLETING" not in flags else "COMPLETED"), flags, True
    named = sorted({_FLAG_NAMES_BASE[f] for f in flags if f in _FLAG_NAMES_BASE})
    if len(named) == 1:
        return named[0], flags, True
    if words == [""] or not words:
        problems.append("unknown: empty job_state")
        return "", flags, False
    problems.append(f"unknown: job_state {_short(value)}")
    return "", flags, False


def _nodes(entry: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    """The allocated nodes: the job's `nodes` hostlist, else job_resources (every shape)."""
    candidates: list[Any] = [entry.get("nodes")]
    resources = entry.get("job_resources")
    if isinstance(resources, Mapping):
        inner = resources.get("nodes")
        if isinstance(inner, Mapping):  # v0.0.41+
            candidates.append(inner.get("list"))
            candidates.append(_names(inner.get("allocation"), "name"))
        else:  # v0.0.38-v0.0.40
            candidates.append(inner)
            candidates.append(_names(resources.get("allocated_nodes"), "nodename"))
    for candidate in candidates:
        if isinstance(candidate, tuple):
            if candidate:
                return candidate
            continue
        if candidate is None or candidate == "":
            continue
        if not isinstance(candidate, str):
            problems.append(f"unknown: nodes {_short(candidate)}")
            continue
        try:
            names = tuple(dict.fromkeys(expand(candidate)))
        except HostlistError as exc:
            problems.append(f"unknown: nodes hostlist ({exc})")
            continue
        if names:
            return names
    return ()


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    names = (item.get(key) for item in value if isinstance(item, Mapping))
    return tuple(dict.fromkeys(name for name in names if isinstance(name, str) and name))


def _number(value: Any, name: str, problems: list[str]) -> int | None:
    """A count: plain (v0.0.38), or {"set", "infinite", "number"} (v0.0.39+); None if unset."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"unknown: {name} {_short(value)}")
        return None
    if value < 0 or value != int(value):
        problems.append(f"unknown: {name} {_short(value)}")
        return None
    return int(value)


def _time(value: Any, name: str, problems: list[str]) -> float | None:
    """A UNIX time; 0 and unset mean "not yet" (slurmctld's convention)."""
    number = _number(value, name, problems)
    return float(number) if number else None


def _bool(value: Any) -> bool:
    if isinstance(value, Mapping):  # BOOL16_NO_VAL may come wrapped in newer versions
        value = value.get("number") if value.get("set") is not False else None
    return value is True or (isinstance(value, int) and not isinstance(value, bool) and value == 1)


def _gpus(value: Any) -> int | None:
    if not isinstance(value, str) or not value:
        return None
    found = _GPU_TRES.findall(value)
    return sum(int(n) for n in found) if found else None


def _user_id(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _short(value: Any) -> str:
    said = json.dumps(value, default=str)
    return said if len(said) <= 60 else said[:57] + "..."
