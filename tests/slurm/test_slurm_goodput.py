"""The Slurm goodput ledger (issue 29, part 6): interruptions from successive `squeue --json`
reads and what the slurm-controller saw and did on the nodes.

Rules the rows rest on:
- squeue(1) JOB STATE CODES and slurm.h `enum job_states`: RUNNING (CONFIGURING: its nodes
  boot), SUSPENDED (`scontrol suspend`, or PreemptMode=SUSPEND), PENDING, COMPLETING (epilogs
  running after the end), and the ends COMPLETED, CANCELLED (scancel), FAILED, TIMEOUT,
  NODE_FAIL, PREEMPTED (PreemptMode=CANCEL), BOOT_FAIL, DEADLINE, OUT_OF_MEMORY.
- scontrol(1) `requeue`: "Requeue a running, suspended or finished Slurm batch job into
  pending state"; slurmctld's job_requeue() increments `restart_cnt` (so do a node failure of
  a requeueable job and PreemptMode=REQUEUE), and the job waits out a BeginTime before it runs
  again with a new `start_time`. `requeuehold` requeues and holds it (REQUEUE_HOLD).
  Seen on the real 22.05 here: `scontrol requeue` shows COMPLETING with restart_cnt 1 at once
  (end_time far in the future), then PENDING with reason BeginTime.
- `preempt_time`: when slurmctld chose the job for preemption.
- HyperPod acts on a node in FAIL with Reason `Action:Reboot`/`Action:Replace` and requeues the
  jobs on it (the remediation tests' rule); slurmctld marks a node that stops answering DOWN
  with Reason "Not responding".
The attribution rules (first match wins) are exporter/slurm/goodput.py's docstring; the
documents are each output version's fixture (tests/fixtures/slurm/README.md), job 1 changed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporter.cli.slurm_explain import explain_slurm
from exporter.core.exposition import encode_text
from exporter.core.findings import Finding
from exporter.slurm.explain import goodput_lines
from exporter.slurm.goodput import SETTLE_S, SlurmGoodput, attribute
from exporter.slurm.metrics import goodput_families
from exporter.slurm.service import SlurmControllerService, build_app, build_service, goodput_path
from exporter.slurm.settings import settings_from_mapping
from exporter.sources.slurm.commands import SlurmCli
from exporter.sources.slurm.jobs import parse_jobs
from exporter.sources.slurm.nodes import SlurmNode
from healthcheck.remediation.state import RemediationState
from tests.conftest import free_port
from tests.slurm_agents import TOKEN, Behaviour, FakeAgents, finding, loopback_addresses
from tests.slurm_harness import binary, running_slurmctld

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"
VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")
T0 = 1795565630  # job 1's start_time in every fixture
GPUS = 16  # two p5 nodes: tres_alloc_str gres/gpu=16
# job_state_string() (slurm_protocol_defs.c) prints the first flag set, in this order, instead of
# the base state (v0.0.38/v0.0.39).
_FLAG_ORDER = ("COMPLETING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SPECIAL_EXIT")
_ALLOCATED = ("RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")


def squeue(version: str, *changes: dict[str, Any]) -> str:
    """A `squeue --json` document of `version`: its fixture's job 1 ("spread", RUNNING on
    gpu-[2-3], 16 GPUs here) once per dict, changed as the dict says. `job_state` is written
    "BASE+FLAG" and printed as that version prints it; times are Unix seconds (0: unset)."""
    document = json.loads((FIXTURES / f"squeue_{version}.json").read_text())
    template = document["jobs"][0]
    template["tres_alloc_str"] = "cpu=2,mem=2M,node=2,billing=2,gres/gpu=16"
    jobs = []
    for change in changes:
        job = copy.deepcopy(template)
        for key, value in change.items():
            if key == "job_state":
                words = value.split("+")
                job[key] = _printed_state(version, words)
                if not any(w in _ALLOCATED for w in words):
                    job["nodes"], job["job_resources"] = "", None
            elif key.endswith("_time"):
                job[key] = value if version in ("v0.0.38", "v0.0.39") else _number(value)
            else:
                job[key] = value
        jobs.append(job)
    document["jobs"] = jobs
    return json.dumps(document)


def _printed_state(version: str, words: list[str]) -> Any:
    if version not in ("v0.0.38", "v0.0.39"):
        return words
    flags = [f for f in _FLAG_ORDER if f in words[1:]]
    return flags[0] if flags else words[0]


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


# --- steps of a scenario -----------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """squeue read at T0 + at: job 1 as `fields` say (a `job_state` of "" leaves it out)."""

    at: float
    job_state: str = "RUNNING"
    restart_cnt: int = 0
    start: float = 0.0  # relative to T0
    end: float | None = None
    preempt: float | None = None
    suspend: float | None = None
    reason: str = "None"

    def document(self, version: str) -> str:
        if not self.job_state:
            return squeue(version)
        fields: dict[str, Any] = {
            "job_state": self.job_state,
            "restart_cnt": self.restart_cnt,
            "start_time": int(T0 + self.start),
            "state_reason": self.reason,
        }
        for key, value in (
            ("end_time", self.end),
            ("preempt_time", self.preempt),
            ("suspend_time", self.suspend),
        ):
            fields[key] = int(T0 + value) if value is not None else 0
        return squeue(version, fields)


@dataclass(frozen=True)
class Find:
    """gpu-N's agent reports a finding first seen at T0 + at."""

    at: float
    node: str
    check: str
    severity: str = "fatal"
    action: str = "reboot"
    evidence: str = ""

    def finding(self) -> Finding:
        said = self.evidence or f"{self.check} tripped"
        at = T0 + self.at
        return Finding(self.check, "gpu3", self.severity, self.action, said, at, at, True)


@dataclass(frozen=True)
class Act:
    """The controller recorded an action on a node (its state file) at T0 + at."""

    at: float
    node: str
    action: str


@dataclass(frozen=True)
class Nodes:
    """slurmctld's node list read at T0 + at: (name, state, flags, reason) each."""

    at: float
    nodes: tuple[tuple[str, str, str, str], ...]


def node(name: str, state: str, flags: str = "", reason: str = "", at: float = 0.0) -> SlurmNode:
    return SlurmNode(
        name=name,
        address="127.0.0.1",
        hostname=name,
        state=state,
        flags=frozenset(f for f in flags.split(",") if f),
        reason=reason,
        reason_set_by="root" if reason else "",
        reason_changed_at=T0 + at if reason else None,
        partitions=("all",),
        features=frozenset(),
        gpus=8,
    )


Step = Read | Find | Act | Nodes


def play(version: str, steps: Sequence[Step], settle: bool = True) -> SlurmGoodput:
    ledger = SlurmGoodput()
    healthy = [node(n, "allocated") for n in ("gpu-2", "gpu-3")]
    ledger.observe_nodes(healthy, T0)
    last = 0.0
    for step in steps:
        last = max(last, step.at)
        if isinstance(step, Read):
            jobs, problems = parse_jobs(step.document(version))
            assert problems == [] and all(j.problems == () for j in jobs), problems
            ledger.observe_jobs(jobs, T0 + step.at)
        elif isinstance(step, Find):
            ledger.observe_findings(step.node, [step.finding()])
        elif isinstance(step, Act):
            ledger.observe_action(step.node, step.action, T0 + step.at)
        else:
            ledger.observe_nodes(
                [node(n, s, f, r, step.at) for n, s, f, r in step.nodes], T0 + step.at
            )
    if settle:
        ledger.tick(T0 + last + SETTLE_S + 1)
    return ledger


@dataclass(frozen=True)
class Row:
    name: str
    steps: tuple[Step, ...]
    causes: tuple[tuple[str, str], ...]  # (cause, component) of each entry, oldest first
    words: str = ""  # in the last entry's detail (or missing, for unknown)
    check: Callable[[SlurmGoodput], None] | None = field(default=None, compare=False)


def _entry(ledger: SlurmGoodput, index: int = -1) -> Any:
    return ledger.interruptions_of("1")[index]


def _seconds(ledger: SlurmGoodput, now: float) -> dict[str, float]:
    found = ledger.job_goodput("1", T0 + now)
    assert found is not None
    return found.seconds


def _preempted_wait(ledger: SlurmGoodput) -> None:
    entry = _entry(ledger)
    assert (entry.stopped_at, entry.resumed_at) == (T0 + 45, T0 + 190)
    seconds = _seconds(ledger, 400)
    assert seconds["preempted"] == 145 and seconds["waiting"] == 0
    assert entry.lost_gpu_seconds(T0 + 400) == GPUS * 145


def _remediation_times(ledger: SlurmGoodput) -> None:
    entry = _entry(ledger)
    assert (entry.detected_at, entry.action_at, entry.stopped_at) == (T0 + 30, T0 + 40, T0 + 200)
    assert (entry.node, entry.check, entry.action) == ("gpu-3", "row_remap_failure", "replace")
    assert entry.node_back_at == T0 + 260 and entry.resumed_at == T0 + 290


def _suspended_is_not_counted(ledger: SlurmGoodput) -> None:
    found = ledger.job_goodput("1", T0 + 300)
    assert found is not None
    assert found.seconds["suspended"] == 100 and found.ettr == 1.0
    assert _entry(ledger).resumed_at == T0 + 150


def _between_reads(ledger: SlurmGoodput) -> None:
    entry = _entry(ledger)
    assert (entry.stopped_at, entry.resumed_at) == (T0 + 60, T0 + 80)
    assert _seconds(ledger, 90)["waiting"] == 20


def _completed(ledger: SlurmGoodput) -> None:
    found = ledger.job_goodput("1", T0 + 500)
    assert found is not None
    assert found.interruptions == 0 and found.ettr == 1.0 and found.finished_at == T0 + 100
    assert not _entry(ledger).counted and ledger.live_counts() == {}


ROWS = [
    Row(
        "PREEMPTED: PreemptMode=CANCEL ends it",
        (Read(30), Read(60, "PREEMPTED", end=50)),
        (("preempted", ""),),
        "PREEMPTED",
    ),
    Row(
        "requeued after slurmctld chose it for preemption (PreemptMode=REQUEUE)",
        (
            Read(30),
            Read(60, "PENDING", restart_cnt=1, preempt=45, start=181),
            Read(200, restart_cnt=1, start=190),
        ),
        (("preempted", ""),),
        "PreemptMode=REQUEUE",
        _preempted_wait,
    ),
    Row(
        "suspended by a preemption (PreemptMode=SUSPEND)",
        (Read(30), Read(60, "SUSPENDED", preempt=50, suspend=50)),
        (("preempted", ""),),
        "PreemptMode=SUSPEND",
    ),
    Row(
        "NODE_FAIL after a fatal XID 79 on gpu-3",
        (
            Read(30),
            Find(40, "gpu-3", "xid", evidence="XID 79 FALLEN_OFF_THE_BUS"),
            Read(60, "NODE_FAIL", end=45),
        ),
        (("node_fault", "gpu"),),
        "xid on gpu3 of gpu-3",
    ),
    Row(
        "requeued (--requeue) after an uncorrectable ECC error: restart_cnt + 1",
        (
            Read(30),
            Find(40, "gpu-3", "ecc_uncorrectable", "critical"),
            Read(60, "PENDING+REQUEUED", restart_cnt=1, start=181),
        ),
        (("node_fault", "hbm"),),
        "ecc_uncorrectable",
    ),
    Row(
        "the controller's replace after a row-remap failure; HyperPod requeues; node back",
        (
            Read(20),
            Find(30, "gpu-3", "row_remap_failure", "critical", "replace"),
            Act(40, "gpu-3", "replace"),
            Read(190),
            Read(200, "COMPLETED+COMPLETING", restart_cnt=1, end=10**9),
            Read(230, "PENDING", restart_cnt=1, start=320, reason="BeginTime"),
            Nodes(250, (("gpu-3", "allocated", "FAIL", "Action:Replace"),)),
            Nodes(260, (("gpu-3", "idle", "", ""),)),
            Read(300, restart_cnt=1, start=290),
        ),
        (("remediation", "hbm"),),
        "replace of gpu-3 began",
        _remediation_times,
    ),
    Row(
        "a fatal finding the job was read RUNNING after, the controller's reboot, a requeue",
        (
            Read(20),
            Find(30, "gpu-3", "xid", evidence="XID 48 DBE"),
            Read(40),  # still running: the finding did not kill it
            Act(45, "gpu-3", "reboot"),
            Read(60, "PENDING+REQUEUED", restart_cnt=1, start=181),
        ),
        (("remediation", "hbm"),),
        "reboot of gpu-3 began",
    ),
    Row(
        "HyperPod's own Action:Reboot on gpu-2 (no finding of ours)",
        (
            Read(30),
            Nodes(40, (("gpu-2", "allocated", "FAIL", "Action:Reboot"),)),
            Read(60, "PENDING+REQUEUED", restart_cnt=1, start=181),
        ),
        (("remediation", "unknown"),),
        "reboot of gpu-2 began",
    ),
    Row(
        "slurmctld marks gpu-2 DOWN (Not responding), then NODE_FAIL",
        (
            Read(30),
            Nodes(50, (("gpu-2", "down", "NOT_RESPONDING", "Not responding"),)),
            Read(60, "NODE_FAIL", end=55),
        ),
        (("node_fault", "host"),),
        "NOT_RESPONDING",
    ),
    Row(
        "NODE_FAIL with no evidence of ours: the host, uncertain",
        (Read(30), Read(60, "NODE_FAIL", end=55)),
        (("node_fault", "host"),),
        "NODE_FAIL",
    ),
    Row(
        "scontrol requeue with nothing else to go on: unknown, and what is missing",
        (Read(30), Read(60, "PENDING", restart_cnt=1, start=181, reason="BeginTime")),
        (("unknown", ""),),
        "scontrol requeue",
    ),
    Row(
        "scancel: CANCELLED",
        (Read(30), Read(60, "CANCELLED", end=50)),
        (("user", ""),),
        "scancel",
    ),
    Row(
        "its time limit: TIMEOUT",
        (Read(30), Read(60, "TIMEOUT", end=50)),
        (("user", ""),),
        "--time",
    ),
    Row(
        "COMPLETED: an entry, not an interruption",
        (Read(30), Read(110, "COMPLETED", end=100)),
        (("completed", ""),),
        "completed",
        _completed,
    ),
    Row(
        "scontrol suspend, then resume: user, and the suspension is left out of ETTR",
        (Read(30), Read(60, "SUSPENDED", suspend=50), Read(160, suspend=150)),
        (("user", ""),),
        "scontrol suspend",
        _suspended_is_not_counted,
    ),
    Row(
        "a batch job requeued after it COMPLETED (scontrol requeue): its end was not its end",
        (
            Read(30),
            Read(110, "COMPLETED", end=100),
            Read(150, "PENDING", restart_cnt=1, start=300, reason="BeginTime"),
            Read(320, restart_cnt=1, start=310),
        ),
        (("unknown", ""),),
        "requeued (restart count +1)",
    ),
    Row(
        "scontrol requeuehold: REQUEUE_HOLD",
        (Read(30), Read(60, "PENDING+REQUEUE_HOLD", restart_cnt=1, reason="JobHeldUser")),
        (("user", ""),),
        "requeuehold",
    ),
    Row(
        "requeued and running again between two reads (restart_cnt + 1, a new start_time)",
        (Read(30), Read(60), Read(90, restart_cnt=1, start=80)),
        (("unknown", ""),),
        "between two reads",
        _between_reads,
    ),
    Row(
        "requeued twice between two reads: two entries",
        (Read(30), Read(90, restart_cnt=2, start=80)),
        (("unknown", ""), ("unknown", "")),
    ),
    Row(
        "a fatal finding at the requeue that ran again between two reads",
        (Read(30), Find(50, "gpu-2", "xid", evidence="XID 79"), Read(90, restart_cnt=1, start=80)),
        (("node_fault", "gpu"),),
    ),
    Row(
        "gone from squeue while it ran: unknown, its end not seen",
        (Read(30), Read(60, "")),
        (("unknown", ""),),
        "left squeue",
    ),
    Row(
        "a finding first seen after the stop (the agent's clock): node fault, uncertain",
        (Read(30), Read(60, "NODE_FAIL", end=55), Find(80, "gpu-3", "nvlink_down", "warning")),
        (("node_fault", "nvlink"),),
        "nvlink_down",
    ),
    Row(
        "a finding from before the run began is not its cause (it ran through it)",
        (Find(-60, "gpu-3", "xid", evidence="XID 79"), Read(30), Read(60, "FAILED", end=55)),
        (("unknown", ""),),
        "the job's own exit",
    ),
    Row(
        "COMPLETING is not the end: then PENDING with restart_cnt + 1 is a requeue",
        (
            Read(30),
            Read(60, "COMPLETED+COMPLETING", restart_cnt=1, end=10**9),
            Read(90, "PENDING", restart_cnt=1, start=181),
        ),
        (("unknown", ""),),
        "requeued (restart count +1)",
    ),
    Row(
        "COMPLETING with restart_cnt + 1, then RUNNING again: its PENDING fell between reads",
        (
            Read(30),
            Read(60, "COMPLETED+COMPLETING", restart_cnt=1, end=10**9),
            Read(90, restart_cnt=1, start=85),
        ),
        (("unknown", ""),),
        "requeued (restart count +1)",
    ),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_interruption_rows(version: str, row: Row) -> None:
    ledger = play(version, row.steps)
    entries = ledger.interruptions_of("1")
    assert [(e.cause, e.component) for e in entries] == list(row.causes), [
        (e.detail, e.uncertain, e.missing) for e in entries
    ]
    assert all(e.settled for e in entries)
    last = entries[-1]
    said = f"{last.detail} {last.missing} {last.uncertain}"
    assert row.words in said, said
    if last.cause == "unknown":
        assert last.missing  # never guessed: what was looked for is said
    assert last.namespace == "all" and last.team == "all" and last.gpus == GPUS
    counted = [e for e in entries if e.counted]
    assert sum(ledger.live_counts().values()) == len(counted)
    if row.check is not None:
        row.check(ledger)


def test_nothing_is_counted_before_it_settles_and_nothing_twice() -> None:
    steps = [Read(30), Read(60, "PENDING", restart_cnt=1, start=181)]
    ledger = play("v0.0.40", steps, settle=False)
    (entry,) = ledger.interruptions_of("1")
    assert not entry.settled and ledger.live_counts() == {}
    for later in (61, 90, 60 + SETTLE_S + 1, 60 + SETTLE_S + 50):
        ledger.tick(T0 + later)
    assert ledger.live_counts() == {("unknown", "", "all"): 1}
    # The same read again and again changes nothing.
    jobs, _ = parse_jobs(Read(400, "PENDING", restart_cnt=1, start=500).document("v0.0.40"))
    for at in (400, 430, 460):
        ledger.observe_jobs(jobs, T0 + at)
    assert len(ledger.interruptions_of("1")) == 1 and sum(ledger.live_counts().values()) == 1


def test_team_is_the_account_when_the_job_has_one() -> None:
    ledger = SlurmGoodput()
    for at, state in ((30, "RUNNING"), (60, "CANCELLED")):
        document = squeue(
            "v0.0.41",
            {"job_state": state, "account": "llm-team", "end_time": T0 + 50, "restart_cnt": 0},
        )
        ledger.observe_jobs(parse_jobs(document)[0], T0 + at)
    ledger.tick(T0 + 500)
    (entry,) = ledger.interruptions_of("1")
    assert (entry.team, entry.namespace, entry.cause) == ("llm-team", "all", "user")


def test_attribution_is_pure_and_a_preemption_beside_a_fatal_finding_says_so() -> None:
    from exporter.slurm.goodput import NodeEvent, StopFacts

    stop = StopFacts(time=100.0, nodes=("gpu-2",), since=0.0, state="PREEMPTED")
    xid = NodeEvent(98.0, "gpu-2", "finding", check="xid", part="gpu", severity="fatal")
    verdict = attribute(stop, [xid])
    assert verdict.cause == "preempted"
    assert "may have stopped it" in verdict.uncertain and "no preemptor" in verdict.uncertain
    assert attribute(stop, [xid]) == verdict


# --- metrics: the Kueue side's names and label sets ---------------------------------------------


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def _label_keys(line: str) -> set[str]:
    return set(re.findall(r'(\w+)="', line.split("}")[0]))


def test_metrics_have_the_kueue_sides_names_and_labels() -> None:
    from exporter.cluster.metrics import goodput as kueue

    assert kueue.SERIES == __import__("exporter.slurm.metrics", fromlist=["SERIES"]).SERIES
    steps = [Read(30), Find(40, "gpu-3", "xid", evidence="XID 79"), Read(60, "NODE_FAIL", end=45)]
    ledger = play("v0.0.42", steps)
    text = encode_text(goodput_families(ledger, T0 + 400)).decode()
    total = _series(text, "topowatch_interruptions_total")
    assert all(_label_keys(line) == {"cause", "component", "team"} for line in total)
    assert 'topowatch_interruptions_total{cause="node_fault",component="gpu",team="all"} 1' in total
    assert 'topowatch_interruptions_total{cause="user",component="",team="all"} 0' in total
    (per_job,) = _series(text, "topowatch_job_interruptions")
    assert per_job == 'topowatch_job_interruptions{namespace="all",job_name="1",team="all"} 1'
    assert _series(text, "topowatch_job_ettr_ratio")
    lost = _series(text, "topowatch_goodput_lost_gpu_seconds")
    assert 'topowatch_goodput_lost_gpu_seconds{cause="node_fault",team="all"} 0' in lost  # ended
    # The alert rule's expression reads these labels (rules/topowatch-alerts.yaml).
    rules = (Path(__file__).parents[2] / "rules" / "topowatch-alerts.yaml").read_text()
    assert "topowatch_job_interruptions[1h]" in rules and "$labels.job_name" in rules


def test_per_job_series_are_capped_and_ended_jobs_age_out() -> None:
    ledger = SlurmGoodput()
    jobs = [{"job_id": n, "job_state": "RUNNING", "start_time": T0} for n in range(1, 6)]
    ledger.observe_jobs(parse_jobs(squeue("v0.0.40", *jobs))[0], T0 + 10)
    text = encode_text(goodput_families(ledger, T0 + 20, cap=3)).decode()
    assert len(_series(text, "topowatch_job_interruptions")) == 3
    assert "topowatch_goodput_job_series_dropped 2" in text


# --- explain ------------------------------------------------------------------------------------


def test_explain_lines_say_interrupted_n_times() -> None:
    steps = [
        Read(30),
        Find(40, "gpu-3", "xid", evidence="XID 79"),
        Read(60, "PENDING", restart_cnt=1, start=181),
        Read(200, restart_cnt=1, start=190),
        Read(300, "PREEMPTED", restart_cnt=1, start=190, end=290),
    ]
    ledger = play("v0.0.38", steps)
    view = ledger.job_goodput("1", T0 + 500)
    assert view is not None
    lines = goodput_lines(view.as_dict())
    assert lines[0].startswith("Goodput: ETTR ")
    assert lines[1] == "Interrupted 2 times: 1 node fault (gpu), 1 preempted"
    assert any("XID 79" in line and "16 GPUs" in line for line in lines)
    assert any("running again" in line for line in lines)


# --- the controller: wiring, API, and a restart ------------------------------------------------


class FakeSlurm(SlurmCli):
    """slurmctld's answers, set by the test."""

    def __init__(self) -> None:
        super().__init__(env={})
        self.nodes = (FIXTURES / "sinfo_v0.0.38.json").read_text()
        self.jobs = squeue("v0.0.38")

    def nodes_json(self) -> str:
        return self.nodes

    def squeue_json(self) -> str:
        return self.jobs


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def _controller(tmp: Path, fake: FakeSlurm, clock: Clock) -> SlurmControllerService:
    token = tmp / "health-token"
    token.write_text(TOKEN + "\n")
    raw: dict[str, Any] = {
        "cluster": "test",
        "interval_seconds": 1,
        "agents": {"port": free_port(), "token_file": str(token), "timeout_seconds": 0.5},
        "remediation": {"state_file": str(tmp / "state.json"), "policy": {"mode": "observe"}},
        "prometheus": {"placement": False},
        "listen": "127.0.0.1:0",
    }
    service = build_service(settings_from_mapping(raw), {})
    service.cli = fake
    service.clock = clock
    return service


def _cycle(service: SlurmControllerService, clock: Clock, at: float, **read: Any) -> None:
    clock.at = T0 + at
    assert isinstance(service.cli, FakeSlurm)
    service.cli.jobs = Read(at, **read).document("v0.0.38")
    asyncio.run(service.cycle(watch=False))


async def _get(service: SlurmControllerService, *paths: str) -> list[tuple[int, Any]]:
    from aiohttp.test_utils import TestClient, TestServer

    out = []
    async with TestClient(TestServer(build_app(service, admin_token=None))) as client:
        for path in paths:
            answer = await client.get(path)
            body = await answer.text()
            out.append((answer.status, json.loads(body) if path.startswith("/api") else body))
    return out


def test_a_restarted_controller_keeps_its_ledger_and_counts_nothing_twice(tmp_path: Path) -> None:
    fake, clock = FakeSlurm(), Clock(T0)
    first = _controller(tmp_path, fake, clock)
    _cycle(first, clock, 30)
    first.goodput.observe_findings("gpu-3", [Find(40, "gpu-3", "xid", evidence="XID 79").finding()])
    _cycle(first, clock, 60, job_state="PENDING", restart_cnt=1, start=181)
    _cycle(first, clock, 200, restart_cnt=1, start=190)
    _cycle(first, clock, 300, restart_cnt=1, start=190)  # settled
    ledger_file = goodput_path(tmp_path / "state.json")
    assert ledger_file.exists()
    [(_, metrics)] = asyncio.run(_get(first, "/metrics"))
    assert 'topowatch_interruptions_total{cause="node_fault",component="gpu",team="all"} 1' in (
        metrics
    )

    # The controller stops at T0+300 and starts again at T0+900; meanwhile it had recorded a
    # reboot of gpu-2 (its state file), the job was requeued once more and started again.
    second = _controller(tmp_path, fake, clock)
    assert [e.cause for e in second.goodput.interruptions_of("1")] == ["node_fault"]
    second.state_file.write_state(
        "gpu-2", RemediationState("reboot", T0 + 820, "slurm", 1, "requested")
    )
    third = _controller(tmp_path, fake, clock)
    _cycle(third, clock, 900, restart_cnt=2, start=850)
    _cycle(third, clock, 1100, restart_cnt=2, start=850)
    entries = third.goodput.interruptions_of("1")
    assert [(e.cause, e.component) for e in entries] == [
        ("node_fault", "gpu"),
        ("remediation", "unknown"),
    ]
    assert "no controller watched" in entries[1].uncertain
    assert entries[1].action == "reboot" and entries[1].settled
    found = third.goodput.job_goodput("1", T0 + 1100)
    assert found is not None
    # From the last write (T0+200, when the entry settled: nothing changed at T0+300) to the
    # new run's start (T0+850) no one watched; the rest is known: the first run, the wait
    # after the XID, the second run, the third from T0+850.
    assert found.seconds["unobserved"] == 650
    assert found.seconds["running"] == (60 - 0) + (200 - 190) + (1100 - 850)
    [(_, metrics), (_, listed), (_, job), (bad, _)] = asyncio.run(
        _get(
            third,
            "/metrics",
            "/api/v1/interruptions?job=1",
            "/api/v1/goodput/1",
            "/api/v1/interruptions?cause=gremlins",
        )
    )
    [(_, recent), (_, last_hour), (late, _)] = asyncio.run(
        _get(
            third,
            f"/api/v1/interruptions?since={T0 + 500}&namespace=all",
            "/api/v1/interruptions?since=1h&limit=1",
            "/api/v1/interruptions?since=yesterday-ish",
        )
    )
    assert [e["cause"] for e in recent] == ["remediation"]
    assert [e["cause"] for e in last_hour] == ["remediation"] and late == 400
    # The XID's interruption came from the file: not counted again; the new one is.
    assert 'topowatch_interruptions_total{cause="node_fault",component="gpu",team="all"} 0' in (
        metrics
    )
    assert (
        'topowatch_interruptions_total{cause="remediation",component="unknown",team="all"} 1'
        in metrics
    )
    assert [e["cause"] for e in listed] == ["remediation", "node_fault"]  # newest first
    assert job["interruption_count"] == 2 and job["namespace"] == "all"
    assert bad == 400


def test_an_unreadable_ledger_file_is_moved_aside_not_fatal(tmp_path: Path) -> None:
    path = goodput_path(tmp_path / "state.json")
    path.write_text("{not json")
    fake, clock = FakeSlurm(), Clock(T0)
    service = _controller(tmp_path, fake, clock)
    assert service.goodput_problem and "moved to" in service.goodput_problem
    assert not path.exists() and list(tmp_path.glob("state-goodput.json.unreadable-*"))
    _cycle(service, clock, 30)
    assert path.exists() and service.status()["goodput"]["jobs"] == 1


def test_explain_asks_the_controller_for_the_ledger(tmp_path: Path) -> None:
    fake, clock = FakeSlurm(), Clock(T0)
    service = _controller(tmp_path, fake, clock)
    _cycle(service, clock, 30)
    _cycle(service, clock, 60, job_state="PENDING", restart_cnt=1, start=181)

    async def scenario() -> tuple[str, str, str]:
        from aiohttp import web

        runner = web.AppRunner(build_app(service, admin_token=None))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            fake.jobs = Read(61, "PENDING", restart_cnt=1, start=181).document("v0.0.38")
            live = await asyncio.to_thread(explain_slurm, "1", None, False, fake, url)
            fake.jobs = squeue("v0.0.38", {"job_id": 7, "job_state": "PENDING"})
            gone = await asyncio.to_thread(explain_slurm, "1", None, False, fake, url)
            nobody = await asyncio.to_thread(
                explain_slurm, "7", None, False, fake, f"http://127.0.0.1:{free_port()}"
            )
        finally:
            await runner.cleanup()
        return live, gone, nobody

    live, gone, nobody = asyncio.run(scenario())
    assert "Interrupted 1 time: 1 unknown (not settled yet)" not in live
    assert "Interrupted 1 time: 1 unknown" in live and "scontrol requeue" in live
    assert 'Slurm job 1 "spread"' in gone and "no longer in squeue" in gone
    assert "Interrupted 1 time" in gone
    assert "goodput unavailable: no answer from the slurm-controller" in nobody


# --- a real slurmctld: scontrol requeue after the controller asked HyperPod to replace ----------


@pytest.mark.real_component
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs jobs as root here")
def test_real_requeue_after_the_controllers_replace_is_a_remediation(tmp_path: Path) -> None:
    """slurmd on every node: a job runs on gpu-2; gpu-2's agent asks for a replacement, the
    controller (act mode) sets Action:Replace; HyperPod's part is played by hand: `scontrol
    requeue` the job (restart_cnt 1), resume the node, release the requeue's BeginTime. The
    ledger says remediation (hbm: row remapping), with detection, action, node back and
    running-again times, and the metrics carry it."""
    nodes = ["gpu-1", "gpu-2"]
    addresses = loopback_addresses(nodes)
    agents = FakeAgents(addresses, free_port())
    # The requeued job starts again at a pass of slurmctld's main scheduling loop when the
    # pass its update triggers finds gpu-2 still completing: every 60 s by default, as long
    # as the wait below, so the loop runs every second here.
    quick = ["SchedulerParameters=sched_interval=1"]
    with (
        running_slurmctld(
            tmp_path, nodes, slurmd=True, addresses=addresses, extra_conf=quick
        ) as env,
        agents.running(),
    ):
        job = subprocess.run(
            [
                binary("sbatch"),
                "--parsable",
                "-o",
                "/dev/null",
                "-w",
                "gpu-2",
                "--wrap",
                "sleep 300",
            ],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
            check=True,
        ).stdout.strip()
        token = tmp_path / "health-token"
        token.write_text(TOKEN + "\n")
        raw = {
            "cluster": "test",
            "interval_seconds": 1,
            "agents": {"port": agents.port, "token_file": str(token), "watch_seconds": 0},
            "slurm": {"timeout_seconds": 20},
            "remediation": {"state_file": str(tmp_path / "state.json"), "policy": {"mode": "act"}},
            "prometheus": {"placement": False},
            "listen": "127.0.0.1:0",
        }
        service = build_service(settings_from_mapping(raw), env)

        def cycle() -> None:
            asyncio.run(service.cycle())
            service.controller.run_once()

        def state() -> str:
            jobs, _ = parse_jobs(SlurmCli(env=env).squeue_json())
            return next((j.state for j in jobs if j.job_id == job), "")

        _wait(lambda: state() == "RUNNING", "the job running")
        cycle()
        assert [t.job_id for t in service.goodput.jobs.values()] == [job]
        # First seen a few seconds ago (damping held it for some polls): the job was read
        # RUNNING after it, so it did not kill the job; the requeue is the action's doing.
        seen = time.time() - 5
        agents.agents["gpu-2"] = Behaviour([finding("row_remap_failure", "replace", seen)])
        cycle()  # the controller asks HyperPod: Action:Replace
        scontrol = binary("scontrol")
        subprocess.run([scontrol, "requeue", job], env=env, check=True, timeout=10)
        cycle()  # COMPLETING (22.05 prints the flag) with restart_cnt 1
        (entry,) = service.goodput.interruptions_of(job)
        assert (entry.cause, entry.component, entry.action) == ("remediation", "hbm", "replace")
        assert entry.detected_at is not None and entry.action_at is not None
        assert entry.detected_at <= entry.action_at <= entry.stopped_at
        agents.agents["gpu-2"] = Behaviour([])
        # Slurm's times are whole seconds: the node is back and the job released two seconds
        # after the requeue, so its wait cannot round away however fast it starts again.
        time.sleep(2)
        for words in (
            ("update", "nodename=gpu-2", "state=resume"),
            ("update", f"jobid={job}", "starttime=now"),
        ):
            subprocess.run([scontrol, *words], env=env, check=True, timeout=10)
        _wait(lambda: state() == "RUNNING", "the job running again")
        cycle()
        (entry,) = service.goodput.interruptions_of(job)
        assert entry.resumed_at is not None and entry.node_back_at is not None
        found = service.goodput.job_goodput(job, time.time())
        assert found is not None and found.restarts == 1 and found.seconds["waiting"] > 0
        service.clock = lambda: time.time() + SETTLE_S + 5
        service.goodput.tick(service.clock())
        text = encode_text(service.families()).decode()
        assert (
            'topowatch_interruptions_total{cause="remediation",component="hbm",team="all"} 1'
            in text
        )
        assert f'topowatch_job_interruptions{{namespace="all",job_name="{job}",team="all"}} 1' in (
            text
        )


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.3)
