"""`topowatch slurm-controller`: remediation and Prometheus discovery for a Slurm cluster.

Runs on the head node. Every interval: read the node list from slurmctld, write Prometheus' file_sd
targets, poll every agent's health API (bounded concurrency, a timeout each) and hand each answer to
the same RemediationController the Kubernetes side runs (observe by default, budget, breaker,
cooldown, ladder, audit); it acts through `scontrol` (healthcheck.remediation.providers.slurm) and
keeps its state in a file (statefile), with the node's Reason in slurmctld as the source of truth
for what was already asked (reports). Placement of Slurm jobs (`squeue --json`) is read in the same
cycle when the placement module is present.

The goodput ledger (issue 29, exporter/slurm/goodput.py) reads the same `squeue --json` every
cycle, with what this controller saw on the nodes: its agents' findings, its own actions (each
state it records), slurmctld's node states and Reasons. It is kept beside the state file
(`<state file stem>-goodput.json`, replaced atomically when it changed) and read back at start;
`/metrics` carries the Kueue side's goodput families, `GET /api/v1/interruptions` and
`GET /api/v1/goodput[/JOBID]` serve it, and `topowatch explain --slurm JOBID` asks for it.

Nothing here blocks the event loop: Slurm commands run in threads, the controller decides and
acts in its own thread, and /metrics, /healthz and /api/v1/remediation keep answering while
slurmctld is down or agents time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web

from exporter.core.exposition import (
    COUNTER,
    GAUGE,
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Family,
    encode_openmetrics,
    encode_text,
    wants_openmetrics,
)
from exporter.core.findings import Finding
from exporter.slurm import file_sd
from exporter.slurm.goodput import SlurmGoodput, check_cause, interruption_view
from exporter.slurm.metrics import DEFAULT_GOODPUT_JOB_CAP, goodput_families
from exporter.slurm.poller import (
    OUTCOMES,
    AgentPoller,
    AgentReading,
    Target,
)
from exporter.slurm.reports import (
    Facts,
    node_object,
    reconcile,
    report,
    worth_polling,
)
from exporter.slurm.settings import Settings, SettingsError, check_against_slurm
from exporter.slurm.statefile import StateFile, StateFileError, atomic_write
from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError
from exporter.sources.slurm.jobs import SlurmJob, parse_jobs
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from healthcheck.remediation.alerts import bearer_ok, read_token_file
from healthcheck.remediation.audit import AuditRecord
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.providers.base import ActionRequest
from healthcheck.remediation.providers.slurm import SlurmNodes
from healthcheck.remediation.state import Outcome, RemediationState

log = logging.getLogger(__name__)

MIN_WATCH_ROUND_S = 1.0  # a watched agent is asked at most once a second without news
# (jobs, squeue's document problems, nodes, cluster) -> families
PlacementFamilies = Callable[
    [Sequence[SlurmJob], Sequence[str], Sequence[SlurmNode], str], list[Family]
]
MAX_API_LIMIT = 10_000
DEFAULT_API_LIMIT = 1_000
GOODPUT_REFRESH_S = 300.0  # the ledger file is rewritten at least this often while jobs run
# Actions recorded in the state file that did something to the node (not refused or deferred).
_ACTED = frozenset({"requested", "done", "recovered", "checked", "gone"})


def goodput_path(state_file: Path) -> Path:
    """Where the goodput ledger lives: beside the state file (`state.json` ->
    `state-goodput.json`)."""
    return state_file.with_name(f"{state_file.stem}-goodput.json")


class _StateFileWriter:
    """The controller's NodeWriter on Slurm: state to the file; no Events exist (the Auditor
    already logs and counts every record). Each state written is also kept for the goodput
    ledger (`written`, taken by the service's cycle: the controller writes from its thread)."""

    def __init__(self, state_file: StateFile) -> None:
        self.state_file = state_file
        self.written: deque[tuple[str, RemediationState]] = deque(maxlen=10_000)

    def write_state(self, node: str, state: RemediationState) -> None:
        self.state_file.write_state(node, state)
        self.written.append((node, state))

    def write_states(self, items: Sequence[tuple[str, RemediationState]]) -> None:
        self.state_file.write_states(items)
        self.written.extend(items)

    def post_event(self, record: AuditRecord) -> None:
        return None


@dataclass(slots=True)
class _Counts:
    cycles: Counter[str]
    polls: Counter[str]
    command_failures: Counter[tuple[str, str]]
    resumed: Counter[str]


class SlurmControllerService:
    def __init__(
        self,
        settings: Settings,
        cli: SlurmCli,
        poller: AgentPoller,
        controller: RemediationController,
        state_file: StateFile,
        placement: PlacementFamilies | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.cli = cli
        self.poller = poller
        self.controller = controller
        self.state_file = state_file
        self.placement = placement
        self.clock = clock
        self.nodes: dict[str, SlurmNode] = {}
        self.states: dict[str, RemediationState] = {}
        self.state_problem: str | None = None
        self.last_good: dict[str, tuple[Finding, ...]] = {}
        self.last_outcome: dict[str, str] = {}
        self.counts = _Counts(Counter(), Counter(), Counter(), Counter())
        self.placement_families: list[Family] = []
        self.last_cycle_s = 0.0
        self.last_cycle_at: float | None = None
        self.slurmctld_problem = ""
        self._reconciled = False
        self._unresolved: dict[str, str] = {}  # `requested` before a restart, not yet confirmed
        self._file_sd_text = ""
        self.admin_token: str | None = None  # resets the breaker over HTTP; none: refused
        # Watch mode (agents.watch_seconds > 0): one long poll per agent, kept by a task.
        self._facts_now = Facts()  # this cycle's facts, for answers arriving between cycles
        self._watchers: dict[Target, asyncio.Task[None]] = {}
        self._watch_session: aiohttp.ClientSession | None = None
        self._first_asks = asyncio.Semaphore(max(1, settings.concurrency))
        # The goodput ledger (issue 29): fed each cycle, kept in `goodput_file` when set.
        self.goodput = SlurmGoodput()
        self.goodput_file: Path | None = None
        self.goodput_problem = ""
        self.goodput_job_cap = DEFAULT_GOODPUT_JOB_CAP
        self._goodput_saved = -math.inf  # when the ledger was last written

    # -- start-up --

    def load_state(self) -> None:
        """Read the state file; a bad one is logged and holds every node (no action) until a
        person mends it; the process keeps serving."""
        try:
            self.states = self.state_file.load()
        except StateFileError as exc:
            self.state_problem = str(exc)
            log.error("remediation paused: %s", exc)
        self.load_goodput()
        for node, state in self.states.items():
            self._goodput_action(node, state)

    def load_goodput(self) -> None:
        """Read the goodput ledger back. One that cannot be read is moved aside (named in the
        log and in /api/v1/remediation's `goodput.problem`) and a new one begun: the ledger is
        history, not the record of an action under way, so it never holds the controller."""
        path = self.goodput_file
        if path is None:
            return
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.goodput_problem = f"cannot read {path}: {exc.strerror}"
            log.error("goodput ledger: %s", self.goodput_problem)
            return
        try:
            document: Any = json.loads(text)
        except ValueError as exc:
            document, problems = None, [f"not JSON ({exc})"]
        else:
            problems = self.goodput.restore(document)
        if document is None or self.goodput.saved_at is None:
            aside = path.with_name(f"{path.name}.unreadable-{int(self.clock())}")
            self.goodput_problem = f"{path}: {'; '.join(problems)}; moved to {aside.name}"
            log.error("goodput ledger: %s", self.goodput_problem)
            with contextlib.suppress(OSError):
                path.rename(aside)
            return
        if problems:
            self.goodput_problem = f"{path}: {len(problems)} parts unreadable: {problems[0]}"
            log.warning("goodput ledger: %s", self.goodput_problem)

    def _goodput_action(self, node: str, state: RemediationState) -> None:
        if state.outcome in _ACTED:
            detail = f"topowatch asked slurmctld for a {state.action} ({self.settings.method})"
            self.goodput.observe_action(node, state.action, state.started_at, detail)

    # -- one cycle --

    async def cycle(self, watch: bool | None = None) -> None:
        """One cycle. `watch` False asks every agent now and waits for the answers (poll mode,
        and `--once`, which must see them before it exits); None: as configured."""
        watching = self.settings.watch_s > 0 if watch is None else watch
        started = time.monotonic()
        now = self.clock()
        try:
            text = await asyncio.to_thread(self.cli.nodes_json)
        except SlurmCommandError as exc:
            self._slurmctld_down(str(exc), exc.kind, now)
            return
        nodes, problems = parse_nodes(text)
        for problem in problems:
            log.warning("slurm node list: %s", problem)
        if not nodes and problems:
            # sinfo --json exits 0 with `errors: [Unspecified error]` and no nodes when slurmctld
            # does not answer (22.05): an error slurm reported, not an empty cluster.
            said = any(p.startswith("slurm says") for p in problems)
            self._slurmctld_down("; ".join(problems)[:300], "failed" if said else "garbage", now)
            return
        self.slurmctld_problem = ""
        self._forget_departed({n.name for n in nodes}, now)
        self.nodes = {n.name: n for n in nodes}
        self.goodput.observe_nodes(nodes, now)
        if not self._reconciled:
            await asyncio.to_thread(self._reconcile, now)
        self._write_file_sd()
        facts = self._facts_now = self._facts()
        polled = [n for n in nodes if worth_polling(n)]
        for node in nodes:
            if not worth_polling(node):
                self._feed(node, None, facts)
        targets = [Target(n.name, n.address) for n in polled]
        if watching:
            self._keep_watching(targets)
        else:

            def arrived(reading: AgentReading) -> None:
                self._take_reading(reading, facts)

            readings = await self.poller.poll(targets, arrived)
            if self._unresolved:
                await asyncio.to_thread(self._resume_asked, readings, self.clock())
        await self._read_jobs()
        self.counts.cycles["ok"] += 1
        self.last_cycle_s = time.monotonic() - started
        self.last_cycle_at = now

    # -- watch mode --

    def _keep_watching(self, targets: Sequence[Target]) -> None:
        """A watcher per agent worth asking; a node gone, out of reach or moved to another
        address loses its watcher (a new one starts for the new address)."""
        wanted = set(targets)
        for target in list(self._watchers):
            if target not in wanted:
                self._watchers.pop(target).cancel()
        for target in targets:
            running = self._watchers.get(target)
            if running is None or running.done():
                self._watchers[target] = asyncio.create_task(
                    self._watch(target), name=f"watch {target.node}"
                )

    async def _watch(self, target: Target) -> None:
        """Long-poll one agent for as long as it is watched: each answer is taken as it comes
        (the agent answers at once when its findings change), then asked again with the version
        it gave. An agent that fails, or gives no version (an older agent), is asked again after
        the interval, as in poll mode; the first ask of each watcher waits its turn among
        `concurrency` others, so a restart does not open every connection at once."""
        if self._watch_session is None:
            self._watch_session = self.poller.session(limit=0)
        session = self._watch_session
        version = ""
        while True:
            asked = version
            began = time.monotonic()
            try:
                if asked:
                    reading = await self.poller.watch(session, target, asked, self.settings.watch_s)
                else:
                    async with self._first_asks:
                        reading = await self.poller.watch(session, target, "", 0.0)
                self._take_reading(reading, self._facts_now)
                if reading.node in self._unresolved:
                    await asyncio.to_thread(self._resume_asked, [reading], self.clock())
                version = reading.version if reading.ok else ""
            except Exception:  # one bad answer must not end the watch for good
                log.exception("watching %s", target.node)
                version = ""
            if not version:
                await asyncio.sleep(self.settings.interval_s)
            elif version == asked and time.monotonic() - began < MIN_WATCH_ROUND_S:
                # Unchanged, yet answered at once: an agent that does not hold long polls
                # (too many waiters, or a bug) must not be asked in a tight loop.
                await asyncio.sleep(MIN_WATCH_ROUND_S)

    async def close(self) -> None:
        """Stop every watcher and close their connections."""
        watchers = list(self._watchers.values())
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        self._watchers.clear()
        if self._watch_session is not None:
            await self._watch_session.close()
            self._watch_session = None

    def _slurmctld_down(self, detail: str, kind: str, now: float) -> None:
        """No node list: every node is held (acting through a slurmctld we cannot read would be
        acting blind), counted and logged; the last file_sd targets stay as they were."""
        self.counts.command_failures[("nodes", kind)] += 1
        self.counts.cycles["slurmctld_error"] += 1
        if self.slurmctld_problem != detail:
            log.error("cannot read nodes from slurmctld: %s", detail)
        self.slurmctld_problem = detail
        facts = self._facts_now = self._facts()
        for node in self.nodes.values():
            self._feed(node, None, facts)

    def _facts(self) -> Facts:
        return Facts(
            opt_out_feature=self.settings.opt_out_feature,
            excluded=self.settings.exclude_nodes,
            count_all_as_gpu=not any(n.gpus for n in self.nodes.values()),
            state_problem=self.state_problem,
            slurmctld_problem=self.slurmctld_problem,
        )

    def _take_reading(self, reading: AgentReading, facts: Facts) -> None:
        self.counts.polls[reading.outcome] += 1
        before = self.last_outcome.get(reading.node)
        self.last_outcome[reading.node] = reading.outcome
        if reading.ok:
            self.last_good[reading.node] = reading.findings
            self.goodput.observe_findings(reading.node, reading.findings)
        elif before != reading.outcome:  # audited once per change, counted every time
            self.controller.auditor.problem(
                reading.node, f"agent_{reading.outcome}", reading.detail, reading.received_at
            )
        node = self.nodes.get(reading.node)
        if node is not None:
            self._feed(node, reading, facts)

    def _feed(self, node: SlurmNode, reading: AgentReading | None, facts: Facts) -> None:
        state = self.states.get(node.name)
        seen = report(node, reading, self.last_good.get(node.name, ()), state, facts)
        at = reading.received_at if reading is not None else self.clock()
        self.controller.observe_report(seen, node_object(node), at)

    def _forget_departed(self, names: set[str], now: float) -> None:
        for gone in sorted(set(self.nodes) - names):
            self.controller.observe_node({"metadata": {"name": gone}}, now, deleted=True)
            self.last_good.pop(gone, None)
            self.last_outcome.pop(gone, None)

    def _reconcile(self, now: float) -> None:
        """Actions a previous run recorded as `requested` (it stopped between the decision and
        the outcome): confirmed from slurmctld now; the rest wait for their node's answer this
        cycle (`_resume_asked`)."""
        self._reconciled = True
        if self.state_problem is not None:
            return
        for item in reconcile(self.states, self.nodes):
            self.counts.resumed[item.verdict] += 1
            if item.verdict == "resume":
                self._unresolved[item.node] = item.detail
                continue
            outcome = "done" if item.verdict == "confirmed" else "failed"
            self._finish(item.node, outcome, f"after a restart: {item.detail}", now)

    def _resume_asked(self, readings: Sequence[AgentReading], now: float) -> None:
        """An action decided before a restart and never carried out is carried out now, once,
        if the node still asks for it (its agent answered, findings that ask for an action) and
        the mode is still act; withdrawn if the node is healthy again; left `requested` (so
        nothing else happens to the node) while its agent does not answer."""
        answered = {r.node: r for r in readings if r.node in self._unresolved}
        for node, reading in sorted(answered.items()):
            if not reading.ok:
                continue
            detail = self._unresolved.pop(node)
            asking = any(f.actionable and f.action != "none" for f in reading.findings)
            if not asking:
                self._finish(
                    node, "failed", f"after a restart, withdrawn: node healthy; {detail}", now
                )
            elif self.settings.policy.mode != "act":
                self._finish(
                    node, "failed", f"after a restart, not carried out (observe); {detail}", now
                )
            else:
                self._resume(node, detail, now)

    def _resume(self, node: str, detail: str, now: float) -> None:
        state = self.states[node]
        provider = next((p for p in self.controller.providers if isinstance(p, SlurmNodes)), None)
        if provider is None:
            self._finish(node, "failed", "after a restart: no slurm provider", now)
            return
        request = ActionRequest(
            node,
            state.action,
            node_object(self.nodes[node]),
            {"triggers": ["resumed after restart"]},
        )
        [result] = provider.execute([request])
        self.controller.auditor.outcome(
            node,
            state.action,
            result.ok,
            f"resumed after a restart ({detail}): {result.detail}",
            now,
        )
        outcome = "done" if result.ok else "failed"
        self._finish(node, outcome, f"resumed after a restart: {result.detail}", now)

    def _finish(self, node: str, outcome: str, message: str, now: float) -> None:
        """Record the outcome of an action found `requested` after a restart, in the file and in
        the controller (which holds the `requested` state until told)."""
        state = self.states[node]
        finished = state.finished(cast(Outcome, outcome), now, message)
        try:
            self.state_file.write_state(node, finished)
        except (OSError, StateFileError) as exc:
            log.error("cannot record the outcome for %s: %s", node, exc)
            return
        self.states[node] = finished
        self.controller.adopt_state(node, finished)
        self.controller.auditor.lifecycle(node, f"restart_{outcome}", message, now, state.action)

    def _write_file_sd(self) -> None:
        path = self.settings.file_sd
        if path is None:
            return
        text = file_sd.render(self.nodes.values(), self.settings.agent_port, self.settings.cluster)
        if text == self._file_sd_text:
            return
        try:
            atomic_write(path, text, mode=0o644)
        except OSError as exc:
            self.counts.command_failures[("file_sd", "write")] += 1
            log.error("cannot write %s: %s", path, exc)
            return
        self._file_sd_text = text

    async def _read_jobs(self) -> None:
        """One `squeue --json` for placement and the goodput ledger. A document that cannot
        be read in full feeds the ledger only the jobs it lists (none counts as gone)."""
        writer = getattr(self.controller, "writer", None)
        if isinstance(writer, _StateFileWriter):
            while writer.written:
                self._goodput_action(*writer.written.popleft())
        try:
            text = await asyncio.to_thread(self.cli.squeue_json)
        except SlurmCommandError as exc:
            self.counts.command_failures[("squeue", exc.kind)] += 1
            log.warning("cannot read jobs: %s", exc)
            return
        jobs, problems = parse_jobs(text)
        if jobs or not problems:
            self.goodput.observe_jobs(jobs, self.clock(), complete=not problems)
        if self.settings.placement and self.placement is not None:
            self.placement_families = self.placement(
                jobs, problems, list(self.nodes.values()), self.settings.cluster
            )
        await self._save_goodput()

    async def _save_goodput(self) -> None:
        """Write the ledger when it changed, and at least every GOODPUT_REFRESH_S while jobs
        run: after a restart, time since the last write is judged from squeue alone."""
        path = self.goodput_file
        now = self.clock()
        stale = now - self._goodput_saved >= GOODPUT_REFRESH_S and bool(self.goodput.jobs)
        if path is None or not (self.goodput.changed or stale):
            return
        text = json.dumps(self.goodput.document(now), separators=(",", ":"))
        try:
            await asyncio.to_thread(atomic_write, path, text)
        except OSError as exc:
            self.counts.command_failures[("goodput_file", "write")] += 1
            self.goodput.changed = True  # try again next cycle
            log.error("cannot write %s: %s", path, exc)
            return
        self._goodput_saved = now

    # -- the goodput ledger's reads (on the event loop, as the cycle that feeds it) --

    def interruptions(
        self,
        partition: str | None = None,
        job: str | None = None,
        cause: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = DEFAULT_API_LIMIT,
    ) -> list[dict[str, Any]]:
        """Entries newest first (ValueError for a bad cause or limit: a 400)."""
        check_cause(cause)
        if not 1 <= limit <= MAX_API_LIMIT:
            raise ValueError(f"limit={limit}: expected 1 to {MAX_API_LIMIT}")
        now = self.clock()
        found = self.goodput.interruptions(since, until, partition, cause, job)
        found.sort(key=lambda e: (e.stopped_at, e.id), reverse=True)
        out = []
        for entry in found[:limit]:
            track = self.goodput.jobs.get(entry.job)
            end = track.finished_at if track is not None and track.finished_at else now
            out.append(interruption_view(entry, end))
        return out

    def goodput_job(self, job_id: str) -> dict[str, Any] | None:
        found = self.goodput.job_goodput(job_id, self.clock())
        return found.as_dict() if found is not None else None

    def goodput_groups(self, group: str) -> list[dict[str, Any]]:
        """ETTR and lost GPU-hours per team or partition (`namespace`)."""
        if group not in ("team", "namespace", "partition"):
            raise ValueError(f"group={group!r}: expected team or namespace (partition)")
        rows: dict[str, dict[str, Any]] = {}
        for job in self.goodput.jobs_goodput(self.clock()):
            name = job.team if group == "team" else job.partition
            row = rows.setdefault(
                name,
                {
                    "group": group,
                    "name": name,
                    "jobs": 0,
                    "running_s": 0.0,
                    "wall_s": 0.0,
                    "excluded_s": 0.0,
                    "interruptions": 0,
                    "lost_gpu_hours_by_cause": {},
                },
            )
            row["jobs"] += 1
            row["running_s"] += job.seconds.get("running", 0.0)
            row["wall_s"] += job.wall
            row["excluded_s"] += job.wall - job.effective_wall
            row["interruptions"] += job.interruptions
            lost = row["lost_gpu_hours_by_cause"]
            for cause, seconds in job.lost_gpu_seconds_by_cause.items():
                lost[cause] = round(lost.get(cause, 0.0) + seconds / 3600, 6)
        for row in rows.values():
            counted = row["wall_s"] - row["excluded_s"]
            row["ettr"] = row["running_s"] / counted if counted > 0 else None
        return [rows[name] for name in sorted(rows)]

    # -- outputs --

    def families(self) -> list[Family]:
        cycles = Family(
            "topowatch_slurm_controller_cycles", COUNTER, "Controller cycles, by result."
        )
        for result in ("ok", "slurmctld_error"):
            cycles.add([("result", result)], self.counts.cycles[result])
        seconds = Family(
            "topowatch_slurm_controller_cycle_seconds",
            GAUGE,
            "How long the last complete cycle took (node list, file_sd, every agent polled).",
        )
        seconds.add([], self.last_cycle_s)
        polls = Family(
            "topowatch_slurm_agent_polls", COUNTER, "Agent health API answers, by outcome."
        )
        for outcome in OUTCOMES:
            polls.add([("outcome", outcome)], self.counts.polls[outcome])
        up = Family(
            "topowatch_slurm_agent_up",
            GAUGE,
            "1 when the node's agent answered its health API cleanly in the last cycle.",
        )
        for name in sorted(self.last_outcome):
            up.add([("node", name)], 1 if self.last_outcome[name] == "ok" else 0)
        failures = Family(
            "topowatch_slurm_command_failures",
            COUNTER,
            "Slurm commands (and file writes) that failed, by command and kind.",
        )
        for (command, kind), count in sorted(self.counts.command_failures.items()):
            failures.add([("command", command), ("kind", kind)], count)
        nodes = Family("topowatch_slurm_nodes", GAUGE, "Slurm nodes by base state.")
        for state, count in sorted(Counter(n.state for n in self.nodes.values()).items()):
            nodes.add([("state", state)], count)
        healthy_state = Family(
            "topowatch_slurm_state_file_ok",
            GAUGE,
            "0 while the state file cannot be read: remediation holds every node.",
        )
        healthy_state.add([], 0 if self.state_problem else 1)
        resumed = Family(
            "topowatch_slurm_restart_actions",
            COUNTER,
            "Actions found `requested` in the state file at start-up, by what became of them.",
        )
        for verdict in ("confirmed", "resume", "gone"):
            resumed.add([("verdict", verdict)], self.counts.resumed[verdict])
        return [
            cycles,
            seconds,
            polls,
            up,
            failures,
            nodes,
            healthy_state,
            resumed,
            *self.controller.families(),
            *self.placement_families,
            *goodput_families(self.goodput, self.clock(), self.goodput_job_cap),
        ]

    def status(self) -> dict[str, Any]:
        return {
            "cluster": self.settings.cluster,
            "nodes": len(self.nodes),
            "slurmctld_problem": self.slurmctld_problem or None,
            "state_file_problem": self.state_problem,
            "last_cycle_seconds": self.last_cycle_s,
            "last_cycle_at": self.last_cycle_at,
            "remediation": self.controller.status(),
            "goodput": {
                "file": str(self.goodput_file) if self.goodput_file is not None else None,
                "problem": self.goodput_problem or None,
                "jobs": len(self.goodput.jobs),
            },
        }


def build_app(service: SlurmControllerService, admin_token: str | None) -> web.Application:
    """/metrics, /healthz, the remediation status, and the admin's breaker reset (bearer token;
    refused when no admin token is configured)."""
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        om = wants_openmetrics(request.headers.get("Accept"))
        families = service.families()
        body = encode_openmetrics(families) if om else encode_text(families)
        content_type = OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def status(_: web.Request) -> web.Response:
        return web.json_response(service.status())

    async def reset(request: web.Request) -> web.Response:
        if not admin_token:
            return web.json_response(
                {"error": "no admin token configured (remediation.admin_token_file)"}, status=403
            )
        if not bearer_ok(request.headers.get("Authorization"), admin_token):
            return web.json_response({"error": "bearer token required"}, status=401)
        who = request.headers.get("X-Topowatch-Admin", "admin")[:64]
        breaker = service.controller.reset_breaker(service.clock(), who)
        return web.json_response({"breaker": breaker})

    def bad(why: str) -> web.Response:
        return web.json_response({"error": why}, status=400)

    async def interruptions(request: web.Request) -> web.Response:
        """GET /api/v1/interruptions?namespace=PARTITION&job=JOBID&cause=&since=&until=&limit=
        (since/until: Unix seconds, RFC 3339, or a duration back from now: 30m, 6h, 7d)."""
        query = request.query
        now = service.clock()
        try:
            limit_text = query.get("limit", str(DEFAULT_API_LIMIT))
            try:
                limit = int(limit_text)
            except ValueError:
                raise ValueError(f"limit={limit_text!r}: expected a whole number") from None
            found = service.interruptions(
                query.get("namespace") or query.get("partition") or None,
                query.get("job") or None,
                query.get("cause") or None,
                _moment(query.get("since"), now, "since"),
                _moment(query.get("until"), now, "until"),
                limit,
            )
        except ValueError as exc:
            return bad(str(exc))
        return web.json_response(found)

    async def goodput(request: web.Request) -> web.Response:
        try:
            return web.json_response(service.goodput_groups(request.query.get("group", "team")))
        except ValueError as exc:
            return bad(str(exc))

    async def goodput_job(request: web.Request) -> web.Response:
        job = request.match_info["job"]
        view = service.goodput_job(job)
        if view is None:
            return web.json_response(
                {"error": f"job {job} not in the goodput ledger (never seen running, or let go)"},
                status=404,
            )
        return web.json_response(view)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/remediation", status)
    app.router.add_post("/api/v1/remediation/reset", reset)
    app.router.add_get("/api/v1/interruptions", interruptions)
    app.router.add_get("/api/v1/goodput", goodput)
    app.router.add_get("/api/v1/goodput/{job}", goodput_job)
    return app


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def _moment(text: str | None, now: float, name: str) -> float | None:
    """A query time: Unix seconds, RFC 3339, or a duration back from now ("30m", "7d")."""
    if not text:
        return None
    said = text.strip()
    if said[-1:] in _UNITS and said[:-1].replace(".", "", 1).isdigit():
        return now - float(said[:-1]) * _UNITS[said[-1]]
    try:
        value = float(said)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
    try:
        return datetime.fromisoformat(said.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(
            f"{name}={text!r}: expected Unix seconds, RFC 3339 or a duration (30m, 6h, 7d)"
        ) from None


# --- the process ----------------------------------------------------------------------------


def build_service(settings: Settings, env: dict[str, str] | None = None) -> SlurmControllerService:
    """Everything wired from the settings; TokenFileError when a token file cannot be read,
    SettingsError when slurm.conf lacks what the settings need (RebootProgram for reboot-asap)
    or slurmctld cannot be asked whether it has it."""
    token = read_token_file(settings.token_file)
    cli = SlurmCli(env=env, timeout_s=settings.slurm_timeout_s, bin_dir=settings.bin_dir)
    if settings.method == "reboot-asap":
        try:
            config = cli.show_config()
        except SlurmCommandError as exc:
            raise SettingsError(
                f"slurm.method reboot-asap: cannot check slurm.conf's RebootProgram: {exc}"
            ) from exc
        check_against_slurm(settings, config)
    state_file = StateFile(settings.state_file)
    controller = RemediationController(
        settings.policy,
        [SlurmNodes(method=settings.method, cli=cli)],
        writer=_StateFileWriter(state_file),
        recheck_s=min(10.0, settings.interval_s),
    )
    poller = AgentPoller(
        token,
        settings.agent_port,
        timeout_s=settings.agent_timeout_s,
        concurrency=settings.concurrency,
        scheme=settings.scheme,
    )
    service = SlurmControllerService(
        settings, cli, poller, controller, state_file, placement=_placement(settings)
    )
    service.goodput_file = goodput_path(settings.state_file)
    if settings.admin_token_file is not None:
        service.admin_token = read_token_file(settings.admin_token_file)
    service.load_state()
    return service


def _placement(settings: Settings) -> PlacementFamilies | None:
    if not settings.placement:
        return None
    from exporter.slurm.metrics import slurm_families
    from exporter.topology.files import load_placements

    placements = load_placements(settings.topology_file) if settings.topology_file else {}

    def families(
        jobs: Sequence[SlurmJob],
        problems: Sequence[str],
        nodes: Sequence[SlurmNode],
        cluster: str,
    ) -> list[Family]:
        for problem in problems:
            log.warning("squeue: %s", problem)
        return slurm_families(jobs, nodes, placements, cluster, problems)

    return families


async def serve(
    service: SlurmControllerService,
    stop: asyncio.Event,
    once: bool = False,
    started: Callable[[int], None] | None = None,
) -> None:
    """Serve HTTP, run the controller thread, cycle every interval until `stop`."""
    settings = service.settings
    runner = web.AppRunner(build_app(service, service.admin_token), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.listen_host, settings.listen_port)
    await site.start()
    if started is not None:
        sockets = getattr(getattr(site, "_server", None), "sockets", None) or []
        started(sockets[0].getsockname()[1] if sockets else settings.listen_port)
    service.controller.start()
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                await service.cycle(watch=False if once else None)
            except Exception:  # one bad cycle must not end the controller
                log.exception("slurm controller cycle failed")
            if once:
                break
            left = settings.interval_s - (time.monotonic() - began)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, left))
    finally:
        await service.close()
        service.controller.stop()
        if once:  # what the last cycle fed in is decided (and acted on) before exiting
            await asyncio.to_thread(service.controller.run_once)
        await runner.cleanup()
