"""Prometheus families of the goodput ledger (issue 29): interruptions, goodput per team and per
job, the GPU-second ledger, fleet reliability.

Cardinality is bounded by what the cluster is made of, never by its history:
- team, cause, component, flavor, category, reason, scope: small vocabularies or the cluster's
  own queues and flavors;
- per job (`topowatch_job_*`): only jobs live or finished within `RECENT_S`, the largest (GPUs)
  first, at most `cap`; how many were left out is `topowatch_goodput_job_series_dropped`. The
  job's name is the label `job_name`: Prometheus owns `job` (the scrape job) and would rename
  ours to `exported_job`;
- per node: only nodes with a hardware incident in the repeat-offender window, and the repeat
  offenders themselves; MTBF is per instance type, layer-3 domain and UltraServer, never per
  node.

`topowatch_interruptions_total` counts, like `topowatch_preemptions_total`, only what this process
saw happen, once its labels are settled: an interruption rebuilt from the history store at
start-up is in the ledger (and the lost GPU-hours) only, so a restart starts the counter at zero.
The book keeps that count as entries settle (`GoodputBook.interruptions_total`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from exporter.cluster.goodput import (
    CATEGORIES,
    CAUSES,
    COMPONENTS,
    IDLE_REASONS,
    GoodputBook,
    Interruption,
    JobKey,
)
from exporter.cluster.goodput.gpu_seconds import to_ms
from exporter.cluster.goodput.jobs import UNCOUNTED, JobTrack
from exporter.core.exposition import COUNTER, GAUGE, Family

RECENT_S: Final = 3600.0  # a finished job keeps its per-job series this long
DEFAULT_JOB_CAP: Final = 500
MTBF_SCOPES: Final = ("instance_type", "domain", "ultraserver")  # never "node": unbounded
LOST_CAUSES: Final = tuple(c for c in CAUSES if c != "completed")  # completion loses nothing
# (cause, component) of topowatch_interruptions_total: a component only for causes of a node.
SERIES: Final[tuple[tuple[str, str], ...]] = tuple(
    (cause, component)
    for cause in LOST_CAUSES
    for component in (COMPONENTS if cause in ("node_fault", "remediation") else ("",))
)


class LiveInterruptions:
    """The interruptions this process saw settle, by (cause, component, team): the book counts
    them as they settle (`GoodputBook.interruptions_total`; what it restored at start-up is
    never counted), so this only hands its count on."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def exclude(self, entries: Iterable[Interruption]) -> None:
        """Entries that happened before this process watched (restored): the book never
        counts them (`GoodputBook.restore`); nothing to do here."""

    def update(self, book: GoodputBook) -> Counter[tuple[str, str, str]]:
        self.counts = book.interruptions_total
        return self.counts


@dataclass(slots=True)
class JobFigures:
    """What the metrics need of one job, read straight off its track: `ettr.job_goodput`'s
    arithmetic without the per-phase views (a scrape reads every job the ledger holds)."""

    key: JobKey
    team: str
    gpus: int
    live: bool  # not finished
    finished_at: float | None
    running_s: float
    wall_s: float
    excluded_s: float  # suspended and unobserved: left out of ETTR's denominator
    interruptions: int
    lost_gpu_seconds_by_cause: dict[str, float]

    @property
    def ettr(self) -> float | None:
        denominator = self.wall_s - self.excluded_s
        return self.running_s / denominator if denominator > 0 else None


def job_figures(track: JobTrack, now: float) -> JobFigures:
    """The figures of one admitted job at `now` (its end, once finished)."""
    end = track.finished_at if track.finished_at is not None else now
    end_ms = to_ms(end)
    ms = track.phase_ms
    phase = track.phase
    extra = 0
    if phase not in UNCOUNTED and end_ms > track.phase_since_ms:
        extra = end_ms - track.phase_since_ms
    running = ms.get("running", 0)
    excluded = ms.get("suspended", 0) + ms.get("unobserved", 0)
    if phase == "running":
        running += extra
    elif phase == "suspended" or phase == "unobserved":
        excluded += extra
    lost: dict[str, float] = {}
    counted = 0
    for entry in track.interruptions:
        if entry.counted:
            counted += 1
            lost[entry.cause] = lost.get(entry.cause, 0.0) + entry.lost_gpu_seconds(end)
    return JobFigures(
        track.key,
        track.team,
        track.gpus,
        not track.ended,
        track.finished_at,
        running / 1000,
        (sum(ms.values()) + extra) / 1000,
        excluded / 1000,
        counted,
        lost,
    )


class FigureCache:
    """The figures of ended jobs, kept between scrapes: a job that ended no longer moves (its
    end is fixed), so of the day of ended jobs the ledger keeps only those whose ledger
    changed since (an attribution settling, a restore) are read again. Memory follows the
    book's: what it lets go is let go here."""

    def __init__(self) -> None:
        self._ended: dict[JobKey, tuple[tuple[float, int, int], JobFigures]] = {}

    def figures(self, book: GoodputBook, now: float) -> list[JobFigures]:
        out: list[JobFigures] = []
        cache = self._ended
        for key, track in book.jobs.items():
            if track.first_admitted is None:
                continue
            if not track.ended or track.finished_at is None:
                out.append(job_figures(track, now))
                continue
            token = (track.finished_at, track.phase_since_ms, len(track.interruptions))
            found = cache.get(key)
            if found is not None and found[0] == token:
                out.append(found[1])
                continue
            figures = job_figures(track, now)
            if all(e.settled for e in track.interruptions):
                cache[key] = (token, figures)
            out.append(figures)
        for key in [k for k in cache if k not in book.jobs]:  # the book let it go
            del cache[key]
        return out


def render(
    book: GoodputBook,
    now: float,
    cap: int = DEFAULT_JOB_CAP,
    live: LiveInterruptions | None = None,
    cache: FigureCache | None = None,
) -> list[Family]:
    """Every goodput family at `now` (call under the service lock, as any model read).
    `live` and `cache` keep what a scrape needs of the previous ones."""
    if cache is not None:
        jobs = cache.figures(book, now)
    else:
        jobs = [job_figures(t, now) for t in book.jobs.values() if t.first_admitted is not None]
    teams = {j.team for j in jobs}
    return [
        _interruptions(live.update(book) if live is not None else Counter(), teams),
        *_teams(jobs),
        *_per_job(jobs, now, cap),
        *_gpu_seconds(book, now),
        *_reliability(book, now),
    ]


def _interruptions(counts: Counter[tuple[str, str, str]], teams: Iterable[str]) -> Family:
    family = Family(
        "topowatch_interruptions",
        COUNTER,
        "Running jobs that stopped running, seen happening by this process once their cause "
        "was settled, by cause (preempted, node_fault, remediation, elastic_scale_down, user, "
        "unknown), the failing component for node faults and remediation (gpu, hbm, nvlink, "
        'network, host, software, unknown; "" otherwise) and team. Interruptions rebuilt from '
        "history at start-up are in the ledger only, so a restart starts this at zero.",
    )
    # Every team with jobs gets each series from 0: `increase` sees no first increment of a
    # counter that appears at 1.
    seeded: Counter[tuple[str, str, str]] = Counter(
        {(c, p, t): 0 for t in teams for c, p in SERIES}
    )
    seeded.update(counts)
    for (cause, component, team), count in sorted(seeded.items()):
        family.add([("cause", cause), ("component", component), ("team", team)], count)
    return family


def _teams(jobs: list[JobFigures]) -> list[Family]:
    lost = Family(
        "topowatch_goodput_lost_gpu_seconds",
        GAUGE,
        "GPU-seconds lost to interruptions over the retained ledger (GPUs held idle or torn down "
        "x time until the job ran again; open interruptions up to now), by cause and team.",
    )
    ettr = Family(
        "topowatch_goodput_ettr_ratio",
        GAUGE,
        "Effective training time ratio of a team's live and recent jobs: running time over "
        "wall time since first admission, less the time the owners chose to wait (suspended) "
        "and time no process watched (absent before any such time).",
    )
    running = Family(
        "topowatch_goodput_running_seconds",
        GAUGE,
        "Seconds a team's live and recent jobs ran (the numerator of ETTR; sum it across teams "
        "and divide by topowatch_goodput_effective_wall_seconds).",
    )
    wall = Family(
        "topowatch_goodput_effective_wall_seconds",
        GAUGE,
        "Wall seconds of a team's live and recent jobs since their first admission, less "
        "suspended and unobserved time (the denominator of ETTR).",
    )
    sums: dict[str, list[float]] = {}
    lost_by: dict[str, dict[str, float]] = {}
    for job in jobs:
        row = sums.setdefault(job.team, [0.0, 0.0])
        row[0] += job.running_s
        row[1] += job.wall_s - job.excluded_s
        if job.lost_gpu_seconds_by_cause:
            into = lost_by.setdefault(job.team, {})
            for cause, value in job.lost_gpu_seconds_by_cause.items():
                into[cause] = into.get(cause, 0.0) + value
    for name in sorted(sums):
        run_s, effective = sums[name]
        team = [("team", name)]
        per = lost_by.get(name, {})
        for cause in LOST_CAUSES:
            lost.add([("cause", cause), *team], per.get(cause, 0.0))
        if effective > 0:
            ettr.add(team, run_s / effective)
        running.add(team, run_s)
        wall.add(team, max(0.0, effective))
    return [lost, ettr, running, wall]


def _per_job(jobs: list[JobFigures], now: float, cap: int) -> list[Family]:
    ettr = Family(
        "topowatch_job_ettr_ratio",
        GAUGE,
        "A live or recently finished job's effective training time ratio (its largest jobs, "
        "up to the series cap; absent before any running or waiting time).",
    )
    count = Family(
        "topowatch_job_interruptions",
        GAUGE,
        "Times a live or recently finished job stopped running (completion excluded).",
    )
    dropped = Family(
        "topowatch_goodput_job_series_dropped",
        GAUGE,
        "Live and recent jobs left without per-job series by the series cap.",
    )
    shown = [
        j for j in jobs if j.live or (j.finished_at is not None and now - j.finished_at <= RECENT_S)
    ]
    # Largest first; among equals the ledger's order, which holds from one scrape to the
    # next (a sort by name as well costs a third of the scrape at 10,000 jobs).
    shown.sort(key=attrgetter("gpus"), reverse=True)
    named: set[tuple[str, str]] = set()
    left_out = 0
    for job in shown:
        name = (job.key[0], job.key[2])
        if len(named) >= cap or name in named:  # two kinds, one name: the larger one speaks
            left_out += 1
            continue
        named.add(name)
        labels = [("namespace", name[0]), ("job_name", name[1]), ("team", job.team)]
        value = job.ettr
        if value is not None:
            ettr.add(labels, value)
        count.add(labels, job.interruptions)
    dropped.add([], left_out)
    return [ettr, count, dropped]


def _gpu_seconds(book: GoodputBook, now: float) -> list[Family]:
    ledger = Family(
        "topowatch_gpu_seconds",
        COUNTER,
        "The GPU-second ledger: every GPU-second of every node, by ResourceFlavor and category "
        "(running, restarting, absorbed by an elastic job above its minimum, idle, "
        "unavailable:finding|remediation|deep_health_check|maintenance|cordoned). The "
        "categories of a flavor add up to its capacity x time.",
    )
    idle = Family(
        "topowatch_gpu_idle_seconds_by_reason",
        COUNTER,
        "The ledger's idle GPU-seconds of each ResourceFlavor by what keeps them idle "
        "(claimable, topology, quota, no_demand); they add up to its idle category.",
    )
    totals = book.gpu_seconds(now)
    by_flavor = totals.by("flavor")
    for flavor in sorted(by_flavor):
        seconds = by_flavor[flavor]
        for category in CATEGORIES:
            ledger.add([("flavor", flavor), ("category", category)], seconds.get(category, 0.0))
    reasons: dict[str, dict[str, int]] = {}
    for (flavor, reason), ms in totals.idle_reasons.items():
        reasons.setdefault(flavor, {})[reason] = ms
    for flavor in sorted(set(reasons) | set(by_flavor)):
        per = reasons.get(flavor, {})
        for reason in IDLE_REASONS:
            idle.add([("flavor", flavor), ("reason", reason)], per.get(reason, 0) / 1000)
    return [ledger, idle]


def _reliability(book: GoodputBook, now: float) -> list[Family]:
    # Counts and exposure rather than a rate per 1,000 node-days: base units in the name
    # (DESIGN, promtool), and Prometheus can sum them over clusters before dividing.
    rate = Family(
        "topowatch_fleet_interruptions",
        GAUGE,
        "Job interruptions caused by a node (node fault or remediation) over the retained "
        "ledger, by the failing component (unknown: cause unknown). Per 1,000 node-days: "
        "divide by topowatch_fleet_observed_node_seconds / 86400 / 1000.",
    )
    exposure = Family(
        "topowatch_fleet_observed_node_seconds",
        GAUGE,
        "Node-seconds the interruption ledger has observed (every node, the same window as "
        "topowatch_fleet_interruptions).",
    )
    mtbf = Family(
        "topowatch_fleet_mtbf_seconds",
        GAUGE,
        "Mean node-seconds between hardware incidents, per instance type, layer-3 network "
        "domain and UltraServer (scope, name); absent where no incident was recorded.",
    )
    offender = Family(
        "topowatch_node_repeat_offender",
        GAUGE,
        "1 for a node with repeated hardware incidents within the repeat-offender window "
        "(default 2 in 7 days): replace it rather than reboot it. Only such nodes are listed.",
    )
    incidents = Family(
        "topowatch_node_hardware_incidents",
        GAUGE,
        "Hardware incidents of a node within the repeat-offender window (only nodes with one).",
    )
    summary = book.reliability(now)
    for component in COMPONENTS:
        rate.add([("component", component)], summary.interruptions_by_component.get(component, 0))
    exposure.add([], summary.node_days * 86_400)
    for scope in MTBF_SCOPES:
        for found in summary.mtbf.get(scope, []):
            if found.name and found.mtbf_hours is not None:
                mtbf.add([("scope", scope), ("name", found.name)], found.mtbf_hours * 3600)
    for node in sorted(o.node for o in summary.repeat_offenders):
        offender.add([("node", node)], 1)
    for node, count in sorted(hardware_incidents(book, now).items()):
        incidents.add([("node", node)], count)
    return [rate, exposure, mtbf, offender, incidents]


def hardware_incidents(book: GoodputBook, now: float) -> dict[str, int]:
    """Incidents per node within the repeat-offender window (nodes with at least one)."""
    return book.hardware_incidents(now)
