"""Wiring for `topowatch cluster` and `topowatch explain`: clients, threads, signals.

Everything with a decision in it lives elsewhere (model, analyses, views); this module only
connects a Kubernetes API (real or simulated) to the service and the service to a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kubernetes
import yaml

from exporter.cluster.explain import (
    DumpError,
    dump_notes,
    explain_text,
    goodput_text,
    job_text,
    load_dump_objects,
    model_from_objects,
    preemptions_text,
)
from exporter.cluster.goodput import GoodputBook, GoodputConfig
from exporter.cluster.informers import InformerSet
from exporter.cluster.metrics.goodput import DEFAULT_JOB_CAP
from exporter.cluster.service import ClusterService, build_app, run_app
from exporter.cluster.views.elastic import explained_workload, find_job, job_view
from exporter.cluster.views.workloads import preemptions_view
from exporter.sources.ec2_events import Ec2EventsError, Ec2EventsSource

if TYPE_CHECKING:
    from exporter.cluster.admission.controller import AdmissionController
    from exporter.cluster.admission.settings import AdmissionSettings
    from exporter.cluster.history.feed import HistoryFeed
    from exporter.cluster.leader.election import Leadership
    from healthcheck.remediation.controller import RemediationController

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_PORT = 9403
QUOTA_SAMPLE_S = 60.0
EC2_EVENTS_INTERVAL_S = 300.0
HISTORY_FLUSH_S = 1.0
GOODPUT_TICK_S = 10.0  # attributions settle on time, not only on the next event


def kube_api_client(host: str | None = None) -> kubernetes.client.ApiClient:
    """An official-client ApiClient: `host` (the simulation), in-cluster, or kubeconfig."""
    config = kubernetes.client.Configuration()
    config.retries = False  # the informers back off and count; urllib3's retries only add noise
    if host is not None:
        config.host = host
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=config)
    return kubernetes.client.ApiClient(config)


def serve_cluster(
    api_client: kubernetes.client.ApiClient,
    host: str,
    port: int,
    workload_cap: int = 2000,
    on_started: Callable[[int, ClusterService], None] | None = None,
    stop: asyncio.Event | None = None,
    controller: RemediationController | None = None,
    alerts_token: str | None = None,
    quota_sample_s: float = QUOTA_SAMPLE_S,
    quota_min_observed_s: float = 3600.0,
    ec2_events: Ec2EventsSource | None = None,
    ec2_events_interval_s: float = EC2_EVENTS_INTERVAL_S,
    ec2_events_horizon_s: float | None = None,
    leadership: Leadership | None = None,
    history: HistoryFeed | None = None,
    history_flush_s: float = HISTORY_FLUSH_S,
    goodput: GoodputConfig | None = None,
    goodput_job_cap: int = DEFAULT_JOB_CAP,
    admission: AdmissionSettings | None = None,
) -> ClusterService:
    """Run informers and the HTTP service until SIGTERM/SIGINT (or `stop`). `ec2_events`, when
    given, is polled every `ec2_events_interval_s` for EC2 scheduled events. `leadership`
    (several replicas): campaigned for from the start; on stop the Lease is released, so a
    standby takes over at once rather than after the lease duration. `history` (a durable
    store): fed from the model and the audit every `history_flush_s`, by the leader only; on
    stop what is queued is written (for up to 10 s). `goodput` configures the goodput ledger
    (checkpoint key, repeat offenders); with a history store it is rebuilt from it at start,
    so a restart keeps the ledger; `goodput_job_cap` bounds its per-job series. `admission`
    (enabled): the topowatch.io/node-health admission check runs every interval, leader only;
    with a history store every recorded decision is written to it (audit rows of kind
    "admission", /api/v1/admission/history) and the recent ones are restored at start.
    `controller` (remediation, its settings from --remediation-config) includes
    `rack_escalation: {enabled, share}` (off by default): a UltraServer whose share of bad
    nodes reaches `share` is escalated as one rack (healthcheck/remediation/rack.py), shown in
    /api/v1/remediation."""
    service = ClusterService(
        workload_cap=workload_cap,
        controller=controller,
        alerts_token=alerts_token,
        quota_min_observed_s=quota_min_observed_s,
        leadership=leadership,
        history=history,
        goodput=GoodputBook(goodput),
        goodput_job_cap=goodput_job_cap,
        admission=build_admission(admission, api_client),
    )
    if history is not None:
        history.attach(
            service.model,
            controller.auditor if controller is not None else None,
            goodput=service.goodput,
            clock=service.clock,
            admission=service.admission.audit if service.admission is not None else None,
        )
        _restore("goodput ledger", lambda: _goodput_restored(service))
        _restore("admission decisions", lambda: _admission_restored(service))
        if leadership is not None:
            history.leading = lambda: leadership.is_leader
        history.writer.start()
    if leadership is not None:
        leadership.start()
    if ec2_events is not None:
        service.ec2_event_counts = ec2_events.counts
        service.ec2_event_horizon_s = ec2_events_horizon_s
    if controller is not None:
        controller.repeat_offender = service.repeat_offender  # replace, not reboot, again
        controller.start()
    informers = InformerSet(api_client, service)
    service.attach(informers)
    informers.start()
    threading.Thread(
        target=_freeze_after_sync, args=(informers,), name="topowatch-gc-freeze", daemon=True
    ).start()

    async def main() -> None:
        stop_event = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Off the main thread (tests) this fails; the caller stops us through `stop`.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop_event.set)

        def started(bound: int) -> None:
            log.info("cluster service on http://%s:%d (metrics, /api/v1, /readyz)", host, bound)
            if on_started is not None:
                on_started(bound, service)

        sampler = asyncio.create_task(_sample_quota(service, quota_sample_s))
        ticker = asyncio.create_task(_tick_goodput(service, GOODPUT_TICK_S))
        checker = (
            asyncio.create_task(_run_admission(service, admission.interval_seconds))
            if admission is not None and service.admission is not None
            else None
        )
        pump = (
            asyncio.create_task(_pump_history(service, history, history_flush_s))
            if history is not None
            else None
        )
        poller = (
            asyncio.create_task(poll_ec2_events(service, ec2_events, ec2_events_interval_s))
            if ec2_events is not None
            else None
        )
        try:
            await run_app(build_app(service), host, port, stop_event, started)
        finally:
            sampler.cancel()
            ticker.cancel()
            if checker is not None:
                checker.cancel()
            if pump is not None:
                pump.cancel()
            if poller is not None:
                poller.cancel()

    try:
        asyncio.run(main())
    finally:
        informers.stop()
        if controller is not None:
            controller.stop()
        if history is not None:
            _stop_history(service, history)
        if leadership is not None:
            leadership.stop()
    return service


def _restore(what: str, restore: Callable[[], str]) -> None:
    """Refill `what` from the history store as the previous process left it (before the first
    lists). A store that is away, or a record it cannot read, costs only the restored history,
    never the start: `what` begins empty, and the log says why. `restore` returns what it
    refilled, in words for the log ("" when nothing)."""
    from exporter.store.sqlstore import StoreUnavailable

    try:
        told = restore()
    except StoreUnavailable as exc:
        log.error("%s not restored (history store unavailable): %s", what, exc)
        return
    except Exception:  # what it cannot read must not stop the service
        log.exception("%s not restored", what)
        return
    if told:
        log.info("%s restored: %s", what, told)


def _goodput_restored(service: ClusterService) -> str:
    bad = service.restore_goodput()
    return (
        f"{len(service.goodput.interruptions())} interruptions, {len(service.goodput.jobs)} jobs"
        + (f" ({bad} unreadable documents skipped)" if bad else "")
    )


def _admission_restored(service: ClusterService) -> str:
    """The admission check's recent decisions, so /api/v1/admission and explain's "admission
    held" survive a restart."""
    restored = service.restore_admission()
    return f"{restored} decisions" if restored else ""


def build_admission(
    settings: AdmissionSettings | None, api_client: kubernetes.client.ApiClient
) -> AdmissionController | None:
    """The admission check controller when enabled (writing through `api_client`), else None."""
    if settings is None or not settings.enabled:
        return None
    from exporter.cluster.admission.controller import AdmissionController as Controller
    from exporter.cluster.admission.writer import KubeStatusWriter

    log.info(
        "admission check topowatch.io/node-health: %s mode, fail-open after %gs",
        settings.mode,
        settings.fail_open_seconds,
    )
    return Controller(settings, KubeStatusWriter(api_client))


async def _run_admission(service: ClusterService, every_s: float) -> None:
    """The admission check's cycle, off the event loop: every `every_s`, and at once when a
    Workload arrives with an entry to answer. Until the informers have synced it answers only
    what the fail-open deadline says."""
    loop = asyncio.get_running_loop()
    admission = service.admission
    assert admission is not None
    while True:
        await loop.run_in_executor(None, admission.wait, every_s)
        await asyncio.sleep(0.005)  # a burst of events lands together: one cycle answers all
        try:
            await loop.run_in_executor(None, service.admission_cycle)
        except Exception:  # the check must never take the service down
            log.exception("admission cycle failed")


async def _tick_goodput(service: ClusterService, every_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        try:
            await loop.run_in_executor(None, service.tick_goodput)
        except Exception:  # the ledger is not worth the live answers
            log.exception("goodput tick failed")


async def _pump_history(service: ClusterService, history: HistoryFeed, every_s: float) -> None:
    """Hand what changed to the history writer every `every_s` seconds, off the event loop."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        try:
            await loop.run_in_executor(None, history.pump, service.lock)
        except Exception:  # history is not worth the live answers: log, go on
            log.exception("history pump failed")


def _stop_history(service: ClusterService, history: HistoryFeed) -> None:
    """The last changes, written while this replica still leads (its Lease is released after)."""
    try:
        history.pump(service.lock)
    except Exception:
        log.exception("history pump failed at stop")
    if not history.writer.flush(10.0):
        log.warning("history: %d rows not written at stop", history.writer.queued)
    history.writer.stop(timeout=1.0)
    history.store.close()


async def _sample_quota(service: ClusterService, every_s: float) -> None:
    """Feed the quota history once synced, then every `every_s` seconds, off the event loop."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s if service.synced else 1.0)
        if not service.synced:
            continue
        try:
            await loop.run_in_executor(None, service.sample_quota)
        except Exception:  # advice is optional; the service must keep serving without it
            log.exception("quota sampling failed")


async def poll_ec2_events(
    service: ClusterService, source: Ec2EventsSource, every_s: float, first_s: float = 0.0
) -> None:
    """Feed the model EC2's scheduled events every `every_s` seconds, off the event loop. A
    failed poll keeps what the model knew; failures are counted by the source and logged once
    until a poll succeeds again."""
    loop = asyncio.get_running_loop()
    failing = False
    delay = first_s
    while True:
        await asyncio.sleep(delay)
        delay = every_s
        try:
            events = await loop.run_in_executor(None, source.poll)
        except Ec2EventsError as exc:
            if not failing:
                log.warning("EC2 scheduled events: %s; keeping the last known set", exc)
            failing = True
            continue
        except Exception:  # a bug here must not stop the service
            source.counts["error"] = source.counts.get("error", 0) + 1
            if not failing:
                log.exception("EC2 scheduled events poll failed")
            failing = True
            continue
        if failing:
            log.info("EC2 scheduled events: polling again")
        failing = False
        marked = await loop.run_in_executor(None, service.set_scheduled_events, events)
        log.debug("EC2 scheduled events: %d instances, %d nodes unavailable", len(events), marked)


# --- remediation ------------------------------------------------------------------------------


class RemediationConfigError(Exception):
    pass


def read_cluster_config(path: Path) -> AdmissionSettings:
    """The cluster service's --config file (YAML): its `admission:` section, validated. Raises
    RemediationConfigError (the CLI's "cannot use this config") naming the file and key."""
    from exporter.cluster.admission.settings import AdmissionSettingsError, settings_from_mapping

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RemediationConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise RemediationConfigError(f"{path}: not YAML: {exc}") from exc
    if isinstance(raw, dict):
        unknown = sorted(str(k) for k in raw if k != "admission")
        if unknown:
            raise RemediationConfigError(f"{path}: unknown section(s) {', '.join(unknown)}")
    try:
        return settings_from_mapping(raw)
    except AdmissionSettingsError as exc:
        raise RemediationConfigError(f"{path}: {exc}") from exc


def build_controller(
    config_file: Path, api_client: kubernetes.client.ApiClient
) -> tuple[RemediationController, str | None]:
    """The controller and the alerts token (or None) from the remediation YAML.

    YAML keys: mode (observe|act), budget {nodes, percent, window_seconds}, breaker {threshold,
    window_seconds}, cooldown_seconds, active_timeout_seconds, max_attempts, healthy_reset_seconds,
    alert_ttl_seconds, ladder {rules, defaults} (healthcheck.remediation.policy's parse_ladder),
    providers [...], alert_token_file. A config that cannot be read fully is refused: no
    half-understood policy, and no ladder with a loop or an unknown action."""
    try:
        raw = yaml.safe_load(config_file.read_text()) or {}
    except OSError as exc:
        raise RemediationConfigError(f"cannot read {config_file}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise RemediationConfigError(f"{config_file}: not YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise RemediationConfigError(f"{config_file}: expected a mapping at the top")
    try:
        controller = controller_from_mapping(raw, api_client)
    except RemediationConfigError as exc:
        raise RemediationConfigError(f"{config_file}: {exc}") from exc
    token_file = raw.get("alert_token_file")
    token = read_token(Path(token_file)) if isinstance(token_file, str) else None
    return controller, token


def controller_from_mapping(
    raw: dict[str, Any], api_client: kubernetes.client.ApiClient
) -> RemediationController:
    """A controller from an already-parsed remediation config (see build_controller)."""
    from healthcheck.remediation.controller import KubeNodeWriter, RemediationController
    from healthcheck.remediation.policy import PolicyConfig
    from healthcheck.remediation.providers.base import executable
    from healthcheck.remediation.providers.registry import ConfigError, build_providers

    policy, problems = PolicyConfig.from_mapping(raw)
    if problems:
        raise RemediationConfigError("; ".join(problems))
    core_v1 = kubernetes.client.CoreV1Api(api_client)
    try:
        providers = build_providers(raw.get("providers"), core_v1)
    except ConfigError as exc:
        raise RemediationConfigError(str(exc)) from exc
    if policy.mode == "act" and not providers:
        raise RemediationConfigError("mode act needs at least one provider")
    for rule in policy.ladder.rules:
        for step in rule.steps:
            unable = [p.name for p in providers if executable(step.action, p) is None]
            if step.action == "deep-check":
                # Only SageMaker's API runs a deep health check; the controller leaves the
                # providers that cannot out of it, so one that can is enough.
                if providers and len(unable) == len(providers):
                    raise RemediationConfigError(
                        f"ladder rule {rule.name!r}: no provider can deep-check"
                        f" ({', '.join(unable)}); add sagemaker-api"
                    )
                continue
            if unable:
                raise RemediationConfigError(
                    f"ladder rule {rule.name!r}: {', '.join(unable)} cannot {step.action}"
                )
    return RemediationController(policy, providers, writer=KubeNodeWriter(core_v1))


def read_token(path: Path) -> str:
    from healthcheck.remediation.alerts import TokenFileError, read_token_file

    try:
        return read_token_file(path)
    except TokenFileError as exc:
        raise RemediationConfigError(str(exc)) from exc


def _freeze_after_sync(informers: InformerSet) -> None:
    """Move the synced objects out of the collector's sight once the first full list is in.

    The model holds hundreds of thousands of long-lived objects; left in the tracked
    generations, every full collection walks them all and per-event cost grows with cluster
    size (measured: 1.55x at 8,000 vs 500 nodes, 1.27x with the freeze).
    """
    while not informers.wait_synced(5.0):
        if informers.stopped:
            return
    gc.collect()
    gc.freeze()
    log.info("initial sync complete; %d objects frozen out of GC", gc.get_freeze_count())


# --- explain ----------------------------------------------------------------------------------


class ExplainError(Exception):
    pass


class NotFound(ExplainError):
    """The service answered 404: the name may be another kind's (a job, not a Workload)."""


def explain_offline(dump: Path, target: str | None, all_preemptions: bool, as_json: bool) -> str:
    try:
        objects = load_dump_objects(dump.read_text())
    except OSError as exc:
        raise ExplainError(f"cannot read {dump}: {exc.strerror}") from exc
    except DumpError as exc:
        raise ExplainError(f"{dump}: {exc}") from exc
    model, _ = model_from_objects(objects)
    if all_preemptions:
        records = preemptions_view(model, 0.0)
        return _dumps(records) if as_json else preemptions_text(records)
    namespace, name = _split_target(target)
    notes = dump_notes(model.missing_kinds)  # what the dump could not show, said, not guessed
    state = model.workload_state(namespace, name)
    if state is not None:
        view = explained_workload(model, state)
        view["dump_notes"] = notes
        return _dumps(view) if as_json else explain_text(view)
    job = find_job(model, namespace, name)
    if job is None:
        raise ExplainError(f"no workload or elastic job {namespace}/{name} in {dump}")
    job_dict = job_view(model, job)
    job_dict["notes"] = notes
    return _dumps(job_dict) if as_json else job_text(job_dict)


def explain_live(server: str, target: str | None, all_preemptions: bool, as_json: bool) -> str:
    base = server.rstrip("/")
    if all_preemptions:
        records = _get_pages(f"{base}/api/v1/preemptions?limit=1000")
        records.reverse()  # pages come newest first; the text reads oldest first, like a log
        return _dumps(records) if as_json else preemptions_text(records)
    namespace, name = _split_target(target)
    quoted = f"{urllib.parse.quote(namespace)}/{urllib.parse.quote(name)}"
    try:
        view = _get_json(f"{base}/api/v1/workloads/{quoted}")
    except NotFound:
        try:  # not a Workload: an elastic job's name, as users know it
            job = _get_json(f"{base}/api/v1/elastic/jobs/{quoted}")
        except NotFound:
            try:  # any job the goodput ledger knows (Job, PyTorchJob, HyperPodPyTorchJob)
                job = _get_json(f"{base}/api/v1/goodput/{quoted}?timeline=0")
            except NotFound:
                raise ExplainError(f"no workload or job {namespace}/{name} at {base}") from None
            return _dumps(job) if as_json else goodput_text(job)
        return _dumps(job) if as_json else job_text(job)
    return _dumps(view) if as_json else explain_text(view)


def _split_target(target: str | None) -> tuple[str, str]:
    if not target or target.count("/") != 1 or target.startswith("/") or target.endswith("/"):
        raise ExplainError(f"expected NAMESPACE/NAME, got {target!r}")
    namespace, name = target.split("/")
    return namespace, name


MAX_PAGES = 100


def _get_pages(url: str) -> list[Any]:
    """Every item of a paged list (X-Next-Cursor), up to MAX_PAGES pages."""
    items: list[Any] = []
    cursor = None
    for _ in range(MAX_PAGES):
        page_url = url if cursor is None else f"{url}&cursor={urllib.parse.quote(cursor)}"
        page, headers = _get_json_and_headers(page_url)
        items += page
        cursor = headers.get("X-Next-Cursor")
        if not cursor:
            break
    return items


def _get_json(url: str) -> Any:
    return _get_json_and_headers(url)[0]


def _get_json_and_headers(url: str) -> tuple[Any, Mapping[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response), response.headers
    except urllib.error.HTTPError as exc:
        try:
            message = json.load(exc).get("error", exc.reason)
        except (ValueError, AttributeError):
            message = exc.reason
        if exc.code == 404:
            raise NotFound(f"{url}: {message}") from exc
        raise ExplainError(f"{url}: {exc.code} {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ExplainError(f"cannot reach {url}: {exc}") from exc


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def print_or_fail(produce: Callable[[], str], prog: str) -> int:
    try:
        sys.stdout.write(produce())
    except ExplainError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0
