"""What the goodput ledger reads of `squeue --json`, in every output version's shape.

Rules the rows rest on:
- slurm.h `job_info_t`: `restart_cnt` counts the job's requeues (slurmctld's job_requeue()
  increments it: `scontrol requeue`, a node failure of a requeueable job, PreemptMode=REQUEUE);
  `preempt_time`, `suspend_time`, `end_time` are Unix times, 0 when unset.
- v0.0.38/v0.0.39 print `job_state` with job_state_string() (slurm_protocol_defs.c), which
  names the first flag set instead of the base state: COMPLETING, CONFIGURING, REQUEUED,
  REQUEUE_HOLD, SPECIAL_EXIT, ... A requeued job is PENDING again (job_requeue() sets
  JOB_PENDING with JOB_REQUEUE while the old run completes; `scontrol requeuehold` sets
  JOB_REQUEUE_HOLD). Seen for real on 22.05: `scontrol requeue` shows "COMPLETING" with
  restart_cnt 1 at once, then "PENDING" with reason BeginTime.
- v0.0.40+ print the base state and the flags as a list; times as {"set", "infinite", "number"}.
The fixtures and where each shape comes from: tests/fixtures/slurm/README.md.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from exporter.sources.slurm.jobs import parse_jobs

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"
VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")


def _with(version: str, **fields: Any) -> str:
    document = json.loads((FIXTURES / f"squeue_{version}.json").read_text())
    job = copy.deepcopy(document["jobs"][0])  # job 1 "spread", RUNNING on gpu-[2-3]
    job.update(fields)
    document["jobs"] = [job]
    return json.dumps(document)


def _time(version: str, value: int) -> Any:
    if version in ("v0.0.38", "v0.0.39"):
        return value
    return {"set": True, "infinite": False, "number": value}


@pytest.mark.parametrize("version", VERSIONS)
def test_restart_count_account_and_times_in_every_version(version: str) -> None:
    jobs, problems = parse_jobs((FIXTURES / f"squeue_{version}.json").read_text())
    assert problems == []
    spread = jobs[0]
    assert spread.restart_count == 0
    assert spread.account == ""  # no accounting on the test cluster
    assert spread.preempt_time is None and spread.suspend_time is None  # 0: unset
    assert spread.end_time == 1827101630  # a running job's: its time limit
    assert not spread.state_from_flag
    later = _with(
        version,
        restart_cnt=2,
        account="team-a",
        preempt_time=_time(version, 1795565700),
        suspend_time=_time(version, 1795565800),
    )
    (job,), problems = parse_jobs(later)
    assert problems == [] and job.problems == ()
    assert (job.restart_count, job.account) == (2, "team-a")
    assert (job.preempt_time, job.suspend_time) == (1795565700.0, 1795565800.0)


@pytest.mark.parametrize(
    ("printed", "state", "flags"),
    [
        # job_state_string() of a job being requeued or ending: the flag, not the base state
        ("COMPLETING", "COMPLETED", {"COMPLETING"}),
        ("CONFIGURING", "RUNNING", {"CONFIGURING"}),
        ("REQUEUED", "PENDING", {"REQUEUED"}),
        ("REQUEUE_HOLD", "PENDING", {"REQUEUE_HOLD"}),
        ("SPECIAL_EXIT", "PENDING", {"SPECIAL_EXIT"}),
        ("STOPPED", "RUNNING", {"STOPPED"}),
    ],
)
def test_a_flag_printed_for_the_state_gives_the_base_state_it_implies(
    printed: str, state: str, flags: set[str]
) -> None:
    (job,), problems = parse_jobs(_with("v0.0.38", job_state=printed))
    assert problems == [] and job.problems == ()
    assert (job.state, job.state_flags, job.state_from_flag) == (state, frozenset(flags), True)


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41", "v0.0.42"])
def test_the_state_list_names_the_base_state_itself(version: str) -> None:
    (job,), _ = parse_jobs(_with(version, job_state=["CANCELLED", "COMPLETING"]))
    assert (job.state, job.state_flags, job.state_from_flag) == (
        "CANCELLED",
        frozenset({"COMPLETING"}),
        False,
    )
    (job,), _ = parse_jobs(_with(version, job_state=["PENDING", "REQUEUED"], restart_cnt=1))
    assert (job.state, job.restart_count, job.state_from_flag) == ("PENDING", 1, False)


def test_a_bad_restart_count_is_a_problem_not_an_exception() -> None:
    (job,), _ = parse_jobs(_with("v0.0.38", restart_cnt="twice"))
    assert job.restart_count is None
    assert 'unknown: restart_cnt "twice"' in job.problems
