"""`topowatch slurm-controller`: remediation and Prometheus discovery for a Slurm cluster.

Runs on the head node. Every interval: read the node list from slurmctld, write Prometheus' file_sd
targets, poll every agent's health API (bounded concurrency, a timeout each) and hand each answer to
the same RemediationController the Kubernetes side runs (observe by default, budget, breaker,
cooldown, ladder, audit); it acts through `scontrol` (healthcheck.remediation.providers.slurm) and
keeps its state in a file (statefile), with the node's Reason in slurmctld as the source of truth
for what was already asked (reports). Placement of Slurm jobs (`squeue --json`) is read in the same
cycle when the placement module is present.

Nothing here blocks the event loop: Slurm commands run in threads, the controller decides and
acts in its own thread, and /metrics, /healthz and /api/v1/remediation keep answering while
slurmctld is down or agents time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from healthcheck.remediation.alerts import bearer_ok, read_token_file
from healthcheck.remediation.audit import AuditRecord
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.providers.base import ActionRequest
from healthcheck.remediation.providers.slurm import SlurmNodes
from healthcheck.remediation.state import Outcome, RemediationState

log = logging.getLogger(__name__)

MIN_WATCH_ROUND_S = 1.0  # a watched agent is asked at most once a second without news
PlacementFamilies = Callable[[str, Sequence[SlurmNode], str], list[Family]]


class _StateFileWriter:
    """The controller's NodeWriter on Slurm: state to the file; no Events exist (the Auditor
    already logs and counts every record)."""

    def __init__(self, state_file: StateFile) -> None:
        self.state_file = state_file

    def write_state(self, node: str, state: RemediationState) -> None:
        self.state_file.write_state(node, state)

    def write_states(self, items: Sequence[tuple[str, RemediationState]]) -> None:
        self.state_file.write_states(items)

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

    # -- start-up --

    def load_state(self) -> None:
        """Read the state file; a bad one is logged and holds every node (no action) until a
        person mends it; the process keeps serving."""
        try:
            self.states = self.state_file.load()
        except StateFileError as exc:
            self.state_problem = str(exc)
            log.error("remediation paused: %s", exc)

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
        if self.settings.placement and self.placement is not None:
            await self._read_placement()
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

    async def _read_placement(self) -> None:
        assert self.placement is not None
        try:
            text = await asyncio.to_thread(self.cli.squeue_json)
        except SlurmCommandError as exc:
            self.counts.command_failures[("squeue", exc.kind)] += 1
            log.warning("cannot read jobs: %s", exc)
            return
        self.placement_families = self.placement(
            text, list(self.nodes.values()), self.settings.cluster
        )

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

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/remediation", status)
    app.router.add_post("/api/v1/remediation/reset", reset)
    return app


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
    if settings.admin_token_file is not None:
        service.admin_token = read_token_file(settings.admin_token_file)
    service.load_state()
    return service


def _placement(settings: Settings) -> PlacementFamilies | None:
    if not settings.placement:
        return None
    from exporter.slurm.metrics import slurm_families
    from exporter.sources.slurm.jobs import parse_jobs
    from exporter.topology.files import load_placements

    placements = load_placements(settings.topology_file) if settings.topology_file else {}

    def families(text: str, nodes: Sequence[SlurmNode], cluster: str) -> list[Family]:
        jobs, problems = parse_jobs(text)
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
