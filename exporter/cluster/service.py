"""The cluster service: informers feed the model; aiohttp serves /metrics and the JSON API.

Informer threads apply events under one lock; HTTP handlers read under the same lock in a worker
thread, so a slow render never stalls the event loop and never sees half an update.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exporter.cluster.goodput import GoodputBook
from exporter.cluster.history.args import parse_since as parse_since
from exporter.cluster.history.routes import add_history_routes
from exporter.cluster.history.rows import (
    LIVE_CURSOR,
    live_admission_page,
    live_audit_page,
    live_preemption_page,
)
from exporter.cluster.informers import InformerSet
from exporter.cluster.metrics import goodput as goodput_metrics
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.quota.advisor import AdvisorConfig, Recommendation, advise, fair_share_weights
from exporter.cluster.quota.history import QuotaHistory
from exporter.cluster.quota.views import quota_families, recommendations_view
from exporter.cluster.ui import pages as ui
from exporter.cluster.views import elastic as elastic_views
from exporter.cluster.views import goodput as goodput_views
from exporter.cluster.views import workloads as views
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
from exporter.sources.ec2_events import ScheduledEvent
from exporter.store.records import AuditQuery, GoodputQuery, Page, PreemptionQuery
from exporter.store.sqlstore import StoreUnavailable

if TYPE_CHECKING:
    from exporter.cluster.admission.controller import AdmissionController
    from exporter.cluster.history.feed import HistoryFeed, HistoryStore
    from exporter.cluster.leader.election import Leadership
    from healthcheck.remediation.controller import RemediationController

log = logging.getLogger(__name__)


class ClusterService:
    """Model + lock + informers; also the informers' sink."""

    def __init__(
        self,
        model: ClusterModel | None = None,
        workload_cap: int = 2000,
        clock: Callable[[], float] = time.time,
        controller: RemediationController | None = None,
        alerts_token: str | None = None,
        quota_min_observed_s: float = 3600.0,
        leadership: Leadership | None = None,
        history: HistoryFeed | None = None,
        goodput: GoodputBook | None = None,
        goodput_job_cap: int = goodput_metrics.DEFAULT_JOB_CAP,
        admission: AdmissionController | None = None,
    ) -> None:
        self.model = model or ClusterModel()
        # The topowatch.io/node-health admission check (issue 30): sees the raw Workloads,
        # Nodes and ClusterQueues (check entries, findings, check strategies) under the lock.
        self.admission = admission
        # The goodput ledger (issue 29): fed by the model, read by /metrics, the API, the pages.
        self.goodput = goodput if goodput is not None else GoodputBook()
        self.goodput.attach(self.model)
        self.goodput_job_cap = goodput_job_cap
        self.live_interruptions = goodput_metrics.LiveInterruptions()
        self.goodput_figures = goodput_metrics.FigureCache()  # ended jobs, between scrapes
        self.history = history  # the durable store and its feed; None: memory only
        self.leadership = leadership  # several replicas: which one leads (exported)
        self.controller = controller  # gets every Node event; its observe_node never blocks
        self.alerts_token = alerts_token
        self.workload_cap = workload_cap
        self.clock = clock
        self.lock = threading.Lock()
        self.quota_history = QuotaHistory()
        self.quota_min_observed_s = quota_min_observed_s
        self._quota_first_sample: float | None = None
        self._quota_advice: list[Recommendation] = []
        self.informers: InformerSet | None = None
        # The EC2 scheduled-events poller's counts (ok, throttled, error, throttles, malformed),
        # None while it is off (--ec2-events not given).
        self.ec2_event_counts: dict[str, int] | None = None
        self.ec2_event_horizon_s: float | None = None

    # InformerSink
    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.model.replace(kind, items, self.clock())
            problems = self.model.drain_problems()
            if self.admission is not None:
                self.admission.observe_list(kind, items)
        _log_problems(problems)
        if kind == "Node" and self.controller is not None:
            now = self.clock()
            for item in items:
                self.controller.observe_node(item, now)

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.model.apply(kind, event_type, obj, self.clock())
            problems = self.model.drain_problems() if self.model.recent_problems else []
            if self.admission is not None:
                self.admission.observe(kind, event_type, obj)
        _log_problems(problems)
        if kind == "Node" and self.controller is not None:
            self.controller.observe_node(obj, self.clock(), deleted=event_type == "DELETED")

    def set_scheduled_events(self, events: Mapping[str, Sequence[ScheduledEvent]]) -> int:
        """A completed EC2 scheduled-events poll: the whole set, by instance id."""
        with self.lock:
            return self.model.set_scheduled_events(events, self.clock(), self.ec2_event_horizon_s)

    def attach(self, informers: InformerSet) -> None:
        """Informers will feed the model: verdicts wait for every kind's first list."""
        self.informers = informers
        with self.lock:
            self.model.expect_lists(informers.required_kinds, self.clock())

    @property
    def synced(self) -> bool:
        return self.informers is None or self.informers.synced()

    # views, each taken under the lock
    def metrics_body(self, openmetrics: bool) -> bytes:
        with self.lock:
            now = self.clock()
            families = metrics.render(self.model, self.workload_cap, now=now)
            families.extend(quota_families(self._quota_advice, self.model))
            families.extend(
                goodput_metrics.render(
                    self.goodput,
                    now,
                    self.goodput_job_cap,
                    self.live_interruptions,
                    self.goodput_figures,
                )
            )
        families.extend(self.informer_families())
        families.extend(self.ec2_event_families())
        if self.controller is not None:
            families.extend(self.controller.families())
        if self.admission is not None:
            families.extend(self.admission.audit.families())
        if self.leadership is not None:
            families.extend(self.leadership.families())
        if self.history is not None:
            families.extend(self.history.families())
        return encode_openmetrics(families) if openmetrics else encode_text(families)

    def informer_families(self) -> list[Family]:
        synced = Family("topowatch_cluster_informer_synced", GAUGE, "1 once a kind is listed.")
        events = Family("topowatch_cluster_informer_events", COUNTER, "Watch events received.")
        relists = Family(
            "topowatch_cluster_informer_relists",
            COUNTER,
            "Full re-lists after the watch history expired (410 Gone).",
        )
        restarts = Family(
            "topowatch_cluster_informer_watch_restarts", COUNTER, "Watches resumed after ending."
        )
        errors = Family(
            "topowatch_cluster_informer_errors", COUNTER, "List/watch failures, by reason."
        )
        absent = Family(
            "topowatch_cluster_informer_kind_absent",
            GAUGE,
            "1 while an optional kind (HyperPodPyTorchJob) is not served: its CRD is absent.",
        )
        for st in self.informers.status() if self.informers is not None else []:
            labels = [("kind", st.kind)]
            synced.add(labels, st.synced)
            absent.add(labels, st.absent)
            events.add(labels, st.events)
            relists.add(labels, st.relists_gone)
            restarts.add(labels, st.watch_restarts)
            for reason, count in sorted(st.errors.items()):
                errors.add([*labels, ("reason", reason)], count)
        return [synced, events, relists, restarts, errors, absent]

    def ec2_event_families(self) -> list[Family]:
        """The EC2 scheduled-events poller's own counters; none while it is off."""
        counts = self.ec2_event_counts
        if counts is None:
            return []
        polls = Family(
            "topowatch_cluster_ec2_event_polls",
            COUNTER,
            "DescribeInstanceStatus polls for EC2 scheduled events, by result (ok, throttled: "
            "still throttled after every retry, error).",
        )
        for result in ("ok", "throttled", "error"):
            polls.add([("result", result)], counts.get(result, 0))
        throttles = Family(
            "topowatch_cluster_ec2_event_throttles",
            COUNTER,
            "DescribeInstanceStatus calls answered with a throttling error (each retried).",
        )
        throttles.add([], counts.get("throttles", 0))
        malformed = Family(
            "topowatch_cluster_ec2_event_malformed",
            COUNTER,
            "Instance statuses or events in DescribeInstanceStatus answers that were skipped.",
        )
        malformed.add([], counts.get("malformed", 0))
        return [polls, throttles, malformed]

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            state = self.model.workload_state(namespace, name)
            if state is None:
                return None
            now = self.clock()
            view = elastic_views.explained_workload(self.model, state, now=now)
            view["goodput"] = goodput_views.workload_job_view(self.goodput, namespace, name, now)
            if self.admission is not None:
                view["admission_held"] = self.admission.held(namespace, name, state.workload.uid)
            return view

    def elastic_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            job = elastic_views.find_job(self.model, namespace, name)
            if job is None:
                return None
            view = elastic_views.job_view(self.model, job)
            view["goodput"] = goodput_views.job_view(
                self.goodput, namespace, name, self.clock(), drawn=False
            )
            return view

    # the goodput ledger (issue 29)
    def restore_goodput(self) -> int:
        """Rebuild the ledger from the history store (before the informers' first lists);
        what it restores happened before this process watched: not counted live. Returns the
        documents that could not be read; StoreUnavailable when the store is away."""
        if self.history is None:
            return 0
        documents = self.history.goodput_documents()
        with self.lock:
            bad = self.goodput.restore(*documents)
            self.live_interruptions.exclude(self.goodput.interruptions())
        return bad

    def repeat_offender(self, node: str, now: float) -> str:
        """Why `node` is a repeat offender ("" when it is not): what the remediation ladder
        asks before it resets or reboots a node (`RemediationController.repeat_offender`),
        from its own thread, so under the lock."""
        with self.lock:
            found = [o for o in self.goodput.repeat_offenders(now) if o.node == node]
            window = self.goodput.reliability_book.repeat_window_s
        if not found:
            return ""
        parts = f" ({', '.join(found[0].components)})" if found[0].components else ""
        return (
            f"repeat offender: {found[0].incidents} hardware incidents{parts} "
            f"in {window / 86_400:g} days"
        )

    def admission_cycle(self) -> int:
        """One cycle of the admission check (the leader's only): judge under the lock, write
        and audit outside it. Returns the decisions made."""
        if self.admission is None or not self.admission.settings.enabled:
            return 0
        if self.leadership is not None and not self.leadership.is_leader:
            return 0
        self.admission.sync_checks(self.clock())  # API calls: outside the lock
        with self.lock:
            now = self.clock()
            window = self.goodput.reliability_book.repeat_window_s
            offenders = {
                o.node: f"repeat offender: {o.incidents} hardware incidents"
                f" in {window / 86_400:g} days"
                for o in self.goodput.repeat_offenders(now)
            }
            judged = self.admission.judge(self.model, now, offenders, self.synced)
        return len(self.admission.settle(judged, now))

    def admission_view(self, workload: str | None, limit: int) -> dict[str, Any] | None:
        if self.admission is None:
            return None
        return self.admission.view(workload, limit)

    def admission_page(self, q: AuditQuery) -> tuple[Page, str, str | None]:
        """The admission check's decisions over the whole history (`q.admission`)."""

        def live() -> Page:
            audit = self.admission.audit if self.admission is not None else None
            recent = audit.recent(q.workload, limit=1 << 30) if audit is not None else []
            return live_admission_page(recent, q)

        return self._history_or_live(q.cursor, lambda store: store.audit(q), live)

    def restore_admission(self) -> int:
        """Refill the admission audit from the history store (before the first cycle): the
        entries restored; StoreUnavailable when the store is away."""
        if self.history is None or self.admission is None:
            return 0
        audit = self.admission.audit
        return audit.restore(self.history.admission_documents(audit.capacity))

    def tick_goodput(self) -> None:
        """Settle the attributions that are due with no event to do it (on a timer)."""
        with self.lock:
            self.goodput.tick(self.clock())

    def interruptions(
        self,
        namespace: str | None = None,
        job: str | None = None,
        cause: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = goodput_views.DEFAULT_LIMIT,
    ) -> list[dict[str, Any]]:
        with self.lock:
            return goodput_views.interruptions_view(
                self.goodput, self.clock(), namespace, job, cause, since, until, limit
            )

    def goodput_groups(self, group: str) -> dict[str, Any]:
        with self.lock:
            now = self.clock()
            view = goodput_views.goodput_view(self.goodput, group, now)
            view["gpu_seconds"] = goodput_views.gpu_seconds_view(self.goodput, now)
            return view

    def goodput_job(self, namespace: str, job: str, drawn: bool = True) -> dict[str, Any] | None:
        """The job's goodput and interruptions; with its timeline when `drawn`."""
        with self.lock:
            return goodput_views.job_view(self.goodput, namespace, job, self.clock(), drawn)

    def stored_goodput_job(self, namespace: str, job: str) -> dict[str, Any] | None:
        """A job the ledger in memory no longer holds, from the history store (None: not
        there, or no store); StoreUnavailable while the store is away."""
        if self.history is None:
            return None
        store = self.history.store
        jobs = store.goodput(GoodputQuery("job", namespace=namespace, job=job, limit=10))
        if not jobs.items:
            return None
        entries = store.goodput(
            GoodputQuery("interruption", namespace=namespace, job=job, limit=1000)
        )
        return goodput_views.stored_job_view(jobs.items[0], entries.items)

    def reliability(self) -> dict[str, Any]:
        with self.lock:
            return goodput_views.reliability_view(self.goodput, self.clock())

    def elastic_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        with self.lock:
            return elastic_views.jobs_view(self.model, namespace)

    def idle_gpus(self) -> dict[str, Any]:
        with self.lock:
            return elastic_views.idle_view(self.model, self.clock())

    def workloads(self, namespace: str | None, status: str | None) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for (ns, name), state in sorted(self.model.workloads.items()):
                if namespace and ns != namespace:
                    continue
                st = views.status_of(state.workload)
                if status and st != status:
                    continue
                out.append(
                    {
                        "namespace": ns,
                        "name": name,
                        "status": st,
                        "cluster_queue": self.model.cluster_queue_of(state.workload),
                        "gpus_requested": state.workload.gpus_requested,
                    }
                )
            return out

    def preemptions(self, since: float) -> list[dict[str, Any]]:
        with self.lock:
            return views.preemptions_view(self.model, since)

    # the whole history: the store when there is one, else (or while it is away) the model
    def preemption_page(self, q: PreemptionQuery) -> tuple[Page, str, str | None]:
        """(page, "history" | "live", why the store did not answer)."""

        def live() -> Page:
            with self.lock:
                return live_preemption_page(self.model.ledger, q)

        return self._history_or_live(q.cursor, lambda store: store.preemptions(q), live)

    def audit_page(self, q: AuditQuery) -> tuple[Page, str, str | None]:
        def live() -> Page:
            trail = self.controller.auditor.numbered() if self.controller is not None else []
            return live_audit_page(trail, q)

        return self._history_or_live(q.cursor, lambda store: store.audit(q), live)

    def _history_or_live(
        self,
        cursor: str | None,
        from_store: Callable[[HistoryStore], Page],
        live: Callable[[], Page],
    ) -> tuple[Page, str, str | None]:
        note = None
        if self.history is not None and not (cursor or "").startswith(LIVE_CURSOR):
            try:
                return from_store(self.history.store), "history", None
            except StoreUnavailable as exc:
                if cursor:
                    raise  # a store's cursor cannot page the live model
                note = str(exc)
        return live(), "live", note

    def ended_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored view of a finished or deleted workload (None: none, or no store);
        StoreUnavailable while the store is away."""
        if self.history is None:
            return None
        return self.history.store.workload(namespace, name)

    def topology(self) -> dict[str, Any]:
        with self.lock:
            return views.topology_view(self.model)

    def efa_remote_errors(self) -> list[dict[str, Any]]:
        """Live workloads whose nodes report EFA remote errors, and the suspect they share."""
        with self.lock:
            return views.efa_remotes_view(self.model, now=self.clock())

    # pages for people (/ui/...): copied out under the lock, rendered outside it
    def ui_topology(self, highlight: str = "") -> str:
        with self.lock:
            picture = ui.topology_picture(self.model)
        return ui.topology_page(picture, highlight)

    def ui_workload(self, namespace: str, name: str) -> str | None:
        view = self.workload(namespace, name)
        return ui.workload_page(view) if view is not None else None

    def ui_job(self, namespace: str, name: str) -> str | None:
        view = self.elastic_job(namespace, name)
        return ui.job_page(view) if view is not None else None

    def ui_preemptions(self) -> str:
        return ui.preemptions_page(self.preemptions(0.0))

    def ui_goodput(self) -> str:
        with self.lock:
            view = goodput_views.fleet_view(self.goodput, self.clock())
        return ui.goodput_page(view)

    def ui_goodput_job(self, namespace: str, job: str) -> str | None:
        view = self.goodput_job(namespace, job)
        return ui.goodput_job_page(view) if view is not None else None

    def sample_quota(self) -> None:
        """One step of the quota history, and fresh advice cached for the API and /metrics.

        Called on a timer (every QUOTA_SAMPLE_S): advice is a window's judgement, not a per-scrape
        one, and computing it once keeps scrapes cheap. None is published before
        `quota_min_observed_s` of history (default an hour)."""
        with self.lock:
            now = self.clock()
            self.quota_history.sample(self.model, now)
            if self._quota_first_sample is None:
                self._quota_first_sample = now
            if now - self._quota_first_sample < self.quota_min_observed_s:
                return  # advice from a few minutes of history would be noise, not evidence
            self._quota_advice = advise(
                self.model,
                self.quota_history,
                now,
                AdvisorConfig(weights=fair_share_weights(self.model)),
            )

    def quota_recommendations(self) -> list[dict[str, Any]]:
        with self.lock:
            return recommendations_view(self._quota_advice)

    def readiness(self) -> dict[str, Any]:
        informers = self.informers.status() if self.informers is not None else []
        return {
            "ready": self.synced,
            "informers": [
                {
                    "kind": s.kind,
                    "version": s.version,
                    "synced": s.synced,
                    "absent": s.absent,
                    "last_error": s.last_error,
                }
                for s in informers
            ],
        }


def _log_problems(problems: Iterable[str]) -> None:
    for problem in problems:
        log.warning("cluster model: %s", problem)


def build_app(service: ClusterService) -> web.Application:
    """Routes only; the work runs in the default executor so the loop keeps answering."""

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def metrics_handler(request: web.Request) -> web.Response:
        om = wants_openmetrics(request.headers.get("Accept"))
        body: bytes = await off_loop(service.metrics_body, om)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = await off_loop(gzip.compress, body, 6)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        state = service.readiness()
        return web.json_response(state, status=200 if state["ready"] else 503)

    async def workload(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        view = await off_loop(service.workload, ns, name)
        if view is not None:
            return web.json_response(view, headers={"X-Topowatch-Source": "live"})
        try:  # finished and gone, or deleted: its view as it ended
            view = await off_loop(service.ended_workload, ns, name)
        except StoreUnavailable as exc:
            return _error(503, f"workload {ns}/{name} is not live; history unavailable: {exc}")
        if view is None:
            return _error(404, f"workload {ns}/{name} not found")
        return web.json_response(view, headers={"X-Topowatch-Source": "history"})

    async def workloads(request: web.Request) -> web.Response:
        q = request.query
        return web.json_response(
            await off_loop(service.workloads, q.get("namespace"), q.get("status"))
        )

    async def topology(_: web.Request) -> web.Response:
        return web.json_response(await off_loop(service.topology))

    async def efa_remote_errors(_: web.Request) -> web.Response:
        return web.json_response(await off_loop(service.efa_remote_errors))

    async def quota(_: web.Request) -> web.Response:
        return web.json_response(await off_loop(service.quota_recommendations))

    async def elastic_jobs(request: web.Request) -> web.Response:
        return web.json_response(
            await off_loop(service.elastic_jobs, request.query.get("namespace"))
        )

    async def elastic_job(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        view = await off_loop(service.elastic_job, ns, name)
        if view is None:
            return _error(404, f"elastic job {ns}/{name} not found")
        return web.json_response(view)

    async def admission(request: web.Request) -> web.Response:
        """The admission check's recent decisions, newest first (?workload=ns/name, ?limit=)."""
        try:
            limit = min(1000, max(1, int(request.query.get("limit", "100"))))
        except ValueError:
            return _error(400, "limit: expected a whole number")
        view = await off_loop(service.admission_view, request.query.get("workload"), limit)
        if view is None:
            return _error(404, "the admission check is not enabled (admission.enabled)")
        return web.json_response(view)

    async def idle_gpus(_: web.Request) -> web.Response:
        return web.json_response(await off_loop(service.idle_gpus))

    app = web.Application()
    add_ui_routes(app, service, off_loop)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/workloads", workloads)
    app.router.add_get("/api/v1/workloads/{namespace}/{name}", workload)
    add_history_routes(app, service, off_loop)
    add_goodput_routes(app, service, off_loop)
    app.router.add_get("/api/v1/topology", topology)
    app.router.add_get("/api/v1/efa/remote-errors", efa_remote_errors)
    app.router.add_get("/api/v1/quota/recommendations", quota)
    app.router.add_get("/api/v1/elastic/jobs", elastic_jobs)
    app.router.add_get("/api/v1/elastic/jobs/{namespace}/{name}", elastic_job)
    app.router.add_get("/api/v1/elastic/idle", idle_gpus)
    app.router.add_get("/api/v1/admission", admission)
    add_remediation_routes(app, service)
    return app


def add_goodput_routes(
    app: web.Application,
    service: ClusterService,
    off_loop: Callable[..., Awaitable[Any]],
) -> None:
    """The goodput ledger (issue 29):

        GET /api/v1/interruptions?namespace=&job=&cause=&since=&until=&limit=1000
        GET /api/v1/goodput?group=team|cluster_queue|namespace|flavor
        GET /api/v1/goodput/{namespace}/{job}?timeline=1
        GET /api/v1/reliability

    Interruptions come newest first from the ledger in memory (which a restart rebuilds from
    the history store); a job the ledger has let go of comes from the store
    (`X-Topowatch-Source: history`). A query parameter that cannot be read is a 400 that says
    what was expected."""

    def text(request: web.Request, name: str) -> str | None:
        return request.query.get(name) or None

    async def interruptions(request: web.Request) -> web.Response:
        now = service.clock()
        try:
            since, until = text(request, "since"), text(request, "until")
            limit_text = request.query.get("limit", str(goodput_views.DEFAULT_LIMIT))
            try:
                limit = int(limit_text)
            except ValueError:
                raise ValueError(f"limit={limit_text!r}: expected a whole number") from None
            found = await off_loop(
                service.interruptions,
                text(request, "namespace"),
                text(request, "job"),
                text(request, "cause"),
                parse_since(since, now) if since else None,
                _until(until, now) if until else None,
                limit,
            )
        except ValueError as exc:
            return _error(400, str(exc))
        return web.json_response(found, headers={"X-Topowatch-Source": "live"})

    async def goodput(request: web.Request) -> web.Response:
        try:
            view = await off_loop(service.goodput_groups, request.query.get("group", "team"))
        except ValueError as exc:
            return _error(400, str(exc))
        return web.json_response(view)

    async def goodput_job(request: web.Request) -> web.Response:
        ns, job = request.match_info["namespace"], request.match_info["job"]
        drawn = request.query.get("timeline", "1")
        if drawn not in ("0", "1", "true", "false"):
            return _error(400, f"timeline={drawn!r}: expected 1 or 0 (true or false)")
        view = await off_loop(service.goodput_job, ns, job, drawn in ("1", "true"))
        if view is not None:
            return web.json_response(view, headers={"X-Topowatch-Source": "live"})
        try:
            view = await off_loop(service.stored_goodput_job, ns, job)
        except StoreUnavailable as exc:
            return _error(503, f"job {ns}/{job} is not live; history unavailable: {exc}")
        if view is None:
            return _error(404, f"job {ns}/{job} not in the goodput ledger")
        return web.json_response(view, headers={"X-Topowatch-Source": "history"})

    async def reliability(_: web.Request) -> web.Response:
        return web.json_response(await off_loop(service.reliability))

    app.router.add_get("/api/v1/interruptions", interruptions)
    app.router.add_get("/api/v1/goodput", goodput)
    app.router.add_get("/api/v1/goodput/{namespace}/{job}", goodput_job)
    app.router.add_get("/api/v1/reliability", reliability)


def _until(value: str, now: float) -> float:
    """`until` as `since` reads it (Unix seconds, RFC 3339, a duration back from now)."""
    try:
        return parse_since(value, now)
    except ValueError:
        raise ValueError(
            f"until={value!r}: expected Unix seconds, RFC 3339, or a duration like 15m"
        ) from None


def add_ui_routes(
    app: web.Application,
    service: ClusterService,
    off_loop: Callable[..., Awaitable[Any]],
) -> None:
    """HTML pages for people; the same model views as the JSON API, rendered off the loop."""

    def html(body: str, status: int = 200) -> web.Response:
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    async def index(_: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/topology")

    async def topology(request: web.Request) -> web.Response:
        return html(await off_loop(service.ui_topology, request.query.get("workload", "")))

    async def workload(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        page = await off_loop(service.ui_workload, ns, name)
        if page is None:
            return html(ui.not_found_page(f"workload {ns}/{name}"), status=404)
        return html(page)

    async def preemptions(_: web.Request) -> web.Response:
        return html(await off_loop(service.ui_preemptions))

    async def job(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        page = await off_loop(service.ui_job, ns, name)
        if page is None:
            return html(ui.not_found_page(f"elastic job {ns}/{name}"), status=404)
        return html(page)

    async def goodput(_: web.Request) -> web.Response:
        return html(await off_loop(service.ui_goodput))

    async def goodput_job(request: web.Request) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["job"]
        page = await off_loop(service.ui_goodput_job, ns, name)
        if page is None:
            return html(ui.not_found_page(f"job {ns}/{name} (goodput ledger)"), status=404)
        return html(page)

    app.router.add_get("/ui", index)
    app.router.add_get("/ui/jobs/{namespace}/{name}", job)
    app.router.add_get("/ui/topology", topology)
    app.router.add_get("/ui/workloads/{namespace}/{name}", workload)
    app.router.add_get("/ui/preemptions", preemptions)
    app.router.add_get("/ui/goodput", goodput)
    app.router.add_get("/ui/goodput/{namespace}/{job}", goodput_job)


def add_remediation_routes(app: web.Application, service: ClusterService) -> None:
    """Alertmanager's webhook, the remediation status view and the admin's breaker reset.

    Writes need the bearer token (compared in constant time); with no token configured they are
    refused. A refused or malformed request changes nothing.
    """
    from healthcheck.remediation.alerts import AlertPayloadError, bearer_ok, parse_alertmanager

    def refused(request: web.Request) -> web.Response | None:
        if service.controller is None:
            return _error(404, "remediation is not enabled (--remediation-config)")
        if not service.alerts_token:
            return _error(403, "no alerts token configured (--alerts-token-file)")
        header = request.headers.get("Authorization")
        if not header:
            return _error(401, "bearer token required")
        if not bearer_ok(header, service.alerts_token):
            return _error(403, "bad bearer token")
        return None

    async def alerts(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        assert service.controller is not None
        if service.leadership is not None and not service.leadership.is_leader:
            # Only the leader acts; Alertmanager retries a failed delivery, and the Service
            # sends the retry to a replica that may be the leader.
            return _error(503, "not the leader replica; Alertmanager will retry")
        try:
            parsed = parse_alertmanager(await request.read())
        except AlertPayloadError as exc:
            return _error(400, str(exc))
        service.controller.handle_alerts(parsed, service.clock())
        return web.json_response(
            {"accepted": len(parsed.signals), "ignored": list(parsed.ignored)}, status=202
        )

    async def remediation(_: web.Request) -> web.Response:
        if service.controller is None:
            return _error(404, "remediation is not enabled (--remediation-config)")
        return web.json_response(service.controller.status())

    async def reset(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        assert service.controller is not None
        who = request.headers.get("X-Topowatch-Admin", "admin")[:64]
        return web.json_response(
            {"breaker": service.controller.reset_breaker(service.clock(), who)}
        )

    app.router.add_post("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/remediation", remediation)
    app.router.add_post("/api/v1/remediation/reset", reset)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def run_app(
    app: web.Application, host: str, port: int, stop: asyncio.Event, started: Callable[[int], None]
) -> None:
    """Serve until `stop` is set; `started` gets the bound port (useful with port 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    if sockets:
        bound = sockets[0].getsockname()[1]
    started(bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
