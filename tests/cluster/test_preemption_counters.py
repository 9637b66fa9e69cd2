"""Restart-safe preemption counters: `topowatch_preemptions_total` moves only for preemptions
this process saw happen. What a restarted service rebuilds from Workload conditions and Events
is in the ledger and the API, marked `observed: history`, and counts nothing, so Prometheus'
`increase()` across a restart (a counter reset) equals the preemptions that really happened.

The rule is `ClusterModel.observed_live`: a copy in a kind's first (start-up) list is history; a
copy from a watch or a later re-list is live unless the preemption is older than the watch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cluster.informers import InformerSet
from exporter.cluster.model import LIVE_SLACK_S, ClusterModel
from exporter.cluster.run import kube_api_client
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import preemptions_view
from exporter.sim import synthetic as s
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.crds import assert_valid_kueue

S = 1_795_000_000.0  # when the model under test begins to watch
NS = "hyperpod-ns-alpha"
CQ = "hyperpod-ns-alpha-clusterqueue"


# --- what Prometheus stores and what its increase() makes of it ------------------------------

PREEMPTIONS = "topowatch_preemptions_total"
TARGET = (("job", "topowatch-cluster"), ("instance", "10.1.0.5:9403"))  # one pod, restarted

Series = tuple[tuple[str, str], ...]
Scrape = dict[Series, float]


def scrape(service: ClusterService) -> Scrape:
    """The counter's series in one scrape of /metrics, with the target's labels (a family
    without samples is not rendered at all)."""
    text = service.metrics_body(False).decode()
    return {
        tuple(sorted(sample.labels.items())) + TARGET: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PREEMPTIONS
    }


def reset_aware_increase(scrapes: list[Scrape], first: int) -> float:
    """Prometheus' increase() over scrapes[first:] when the range starts and ends on a sample
    (no extrapolation): per series, last - first plus the value before each reset."""
    total = 0.0
    for series in {k for scrape in scrapes[first:] for k in scrape}:
        values = [scrape[series] for scrape in scrapes[first:] if series in scrape]
        if len(values) < 2:
            continue
        total += values[-1] - values[0]
        total += sum(prev for prev, cur in pairwise(values) if cur < prev)
    return total


# --- the model, one informer delivery at a time -----------------------------------------------


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


def victim(name: str, at: float) -> dict[str, Any]:
    """An admitted low-priority workload (rv 1)."""
    return kueue(
        s.workload(
            NS,
            name,
            1,
            8,
            at,
            priority=1,
            conditions=s.admitted_conditions(CQ, at),
            cluster_queue=CQ,
            assignment=[(("n1",), 1)],
        )
    )


def urgent(name: str, at: float) -> dict[str, Any]:
    """A pending high-priority workload that will preempt."""
    return kueue(s.workload(NS, name, 1, 8, at, priority=1000))


@dataclass(frozen=True)
class Preemption:
    """One preemption as the API server shows it: the victim Workload with its Evicted and
    Preempted conditions, and Kueue's `Preempted` Event on it."""

    workload: dict[str, Any]
    event: dict[str, Any]


def preempt(victim_obj: dict[str, Any], preemptor: dict[str, Any], at: float) -> Preemption:
    text = s.preemption_message_by(
        preemptor, f"/{CQ}", f"/{CQ}", "prioritization in the ClusterQueue"
    )
    updated = dict(victim_obj)
    updated["metadata"] = {**victim_obj["metadata"], "resourceVersion": f"{at:.0f}"}
    updated["status"] = {
        **victim_obj["status"],
        "conditions": [
            *victim_obj["status"]["conditions"],
            *s.preempted_conditions(text, "InClusterQueue", at),
        ],
    }
    return Preemption(
        kueue(updated), s.preemption_event(NS, victim_obj["metadata"]["name"], text, at)
    )


def repeated(event: dict[str, Any], at: float) -> dict[str, Any]:
    """The same Event folded again by the recorder: count 2, a new resourceVersion."""
    return {
        **event,
        "metadata": {**event["metadata"], "resourceVersion": "2"},
        "count": 2,
        "lastTimestamp": s.rfc3339(at),
    }


def start_up(
    model: ClusterModel, workloads: list[dict[str, Any]], events: list[dict[str, Any]]
) -> None:
    """The informers' first lists, as a (re)started service gets them at S."""
    model.replace("Node", [s.node("n1", ("t", "m", "nn-a")), s.node("n2", ("t", "m", "nn-b"))], S)
    model.replace("LocalQueue", [kueue(s.local_queue(NS, CQ))], S)
    model.replace("Workload", workloads, S)
    model.replace("Event", events, S)


def counted(model: ClusterModel) -> int:
    return sum(model.preemption_counts.values())


def observed(model: ClusterModel) -> dict[str, str]:
    return {r.victim_name: r.observed for r in model.ledger}


def test_start_up_lists_are_ledgered_and_served_but_not_counted() -> None:
    old, recent, skewed = urgent("u-old", S - 4000), urgent("u-recent", S - 40), urgent("u-sk", S)
    history = [
        preempt(victim("v-old", S - 4000), old, S - 3600),
        preempt(victim("v-recent", S - 60), recent, S - 30),  # fresh enough to be judged again
        # Stamped after the watch began (the API server's clock ahead of ours), but already
        # there when the Workloads were first listed: history all the same.
        preempt(victim("v-skewed", S - 60), skewed, S + 5),
    ]
    model = ClusterModel()
    start_up(
        model,
        [p.workload for p in history] + [old, recent, skewed],
        [p.event for p in history],
    )
    assert observed(model) == {"v-old": "history", "v-recent": "history", "v-skewed": "history"}
    assert counted(model) == 0
    served = preemptions_view(model, 0)
    assert [(r["victim"], r["preemptor"], r["observed"]) for r in served] == [
        (f"{NS}/v-old", f"{NS}/u-old", "history"),
        (f"{NS}/v-recent", f"{NS}/u-recent", "history"),
        (f"{NS}/v-skewed", f"{NS}/u-sk", "history"),
    ]

    # Now one happens while we watch.
    live_victim, live_urgent = victim("v-live", S + 10), urgent("u-live", S + 50)
    model.apply("Workload", "ADDED", live_victim, S + 10)
    model.apply("Workload", "ADDED", live_urgent, S + 50)
    now = preempt(live_victim, live_urgent, S + 60)
    model.apply("Workload", "MODIFIED", now.workload, S + 60)
    model.apply("Event", "ADDED", now.event, S + 61)
    assert counted(model) == 1
    assert observed(model)["v-live"] == "live"
    assert preemptions_view(model, S + 50)[0]["observed"] == "live"


@pytest.mark.parametrize(
    "order",
    ["condition, event", "event, condition", "event, preemptor, condition"],
)
def test_a_live_preemption_counts_once_whichever_copy_arrives_first(order: str) -> None:
    v, u = victim("v", S - 600), urgent("u", S + 5)
    model = ClusterModel()
    start_up(model, [v], [])
    p = preempt(v, u, S + 10)
    copies: dict[str, tuple[str, dict[str, Any]]] = {
        "preemptor": ("Workload", u),
        "condition": ("Workload", p.workload),
        "event": ("Event", p.event),
    }
    if "preemptor" not in order:
        model.apply("Workload", "ADDED", u, S + 5)
    seen = []
    for step, name in enumerate(order.split(", ")):
        kind, obj = copies[name]
        model.apply(kind, "ADDED" if name != "condition" else "MODIFIED", obj, S + 10 + step)
        seen.append(counted(model))
    # Not before its preemptor is known (its labels must be settled), then exactly once.
    assert seen[-1] == 1 and max(seen) == 1
    if order.startswith("event, preemptor"):
        assert seen[0] == 0
    # The recorder folding the Event again, a later status write: still one.
    model.apply("Event", "MODIFIED", repeated(p.event, S + 40), S + 40)
    rewritten = {**p.workload, "metadata": {**p.workload["metadata"], "resourceVersion": "99"}}
    model.apply("Workload", "MODIFIED", rewritten, S + 41)
    assert counted(model) == 1
    assert len(model.ledger) == 1


def test_a_re_list_after_410_counts_only_what_happened_while_the_watch_was_broken() -> None:
    h_victim, h_urgent = victim("v-hist", S - 900), urgent("u-hist", S - 700)
    hist = preempt(h_victim, h_urgent, S - 600)
    model = ClusterModel()
    start_up(model, [hist.workload, h_urgent], [hist.event])

    # Watched: one preemption, counted.
    v1, u1 = victim("v1", S + 1), urgent("u1", S + 5)
    for obj, at in ((v1, S + 1), (u1, S + 5)):
        model.apply("Workload", "ADDED", obj, at)
    p1 = preempt(v1, u1, S + 10)
    model.apply("Workload", "MODIFIED", p1.workload, S + 10)
    model.apply("Event", "ADDED", p1.event, S + 10)
    assert counted(model) == 1

    # The watch breaks; meanwhile another preemption happens, the historical victim's status
    # is rewritten, p1's Event is folded again, and an Event of an hour ago is folded again
    # too (an old object updated, not a preemption happening).
    v2, u2 = victim("v2", S + 2), urgent("u2", S + 30)
    p2 = preempt(v2, u2, S + 40)
    ancient = {
        **preempt(victim("v-ancient", S - 7200), urgent("u-gone", S - 7200), S - 3600).event,
        "count": 2,
        "lastTimestamp": s.rfc3339(S + 45),
    }
    rewritten = {**hist.workload, "metadata": {**hist.workload["metadata"], "resourceVersion": "7"}}
    workloads = [rewritten, h_urgent, p1.workload, u1, p2.workload, u2]
    events = [hist.event, repeated(p1.event, S + 45), p2.event, ancient]
    # 410 Gone: the informers list again, twice over for good measure.
    for relist_at in (S + 60, S + 90):
        model.replace("Workload", workloads, relist_at)
        model.replace("Event", events, relist_at)
        assert counted(model) == 2, relist_at
    assert observed(model) == {
        "v-hist": "history",
        "v1": "live",
        "v2": "live",
        "v-ancient": "history",
    }


@pytest.mark.parametrize("listed_first", ["Event", "Workload", "Workload without preemptor"])
def test_a_preemption_between_two_start_up_lists_is_counted_once(listed_first: str) -> None:
    """The informers list one kind after another: a preemption in between is in the second
    kind's first list (history) and reaches the first kind by its watch (live): count it."""
    v, u = victim("v", S - 600), urgent("u", S - 300)
    p = preempt(v, u, S + 1)
    model = ClusterModel()
    model.replace("Node", [s.node("n1", ("t", "m", "nn-a"))], S)
    model.replace("LocalQueue", [kueue(s.local_queue(NS, CQ))], S)
    if listed_first == "Event":
        model.replace("Event", [], S)
        model.replace("Workload", [p.workload, u], S + 2)
        assert counted(model) == 0 and observed(model) == {"v": "history"}
        model.apply("Event", "ADDED", p.event, S + 2)
    elif listed_first == "Workload":
        model.replace("Workload", [v, u], S)
        model.replace("Event", [p.event], S + 2)
        assert counted(model) == 0 and observed(model) == {"v": "history"}
        model.apply("Workload", "MODIFIED", p.workload, S + 2)
    else:  # the preemptor was created after the Workloads were listed
        model.replace("Workload", [v], S)
        model.replace("Event", [p.event], S + 2)  # its preemptor unknown yet
        model.apply("Workload", "ADDED", u, S + 2)  # named now, still history: not counted
        assert counted(model) == 0 and observed(model) == {"v": "history"}
        assert next(iter(model.ledger)).preemptor == f"{NS}/u"
        model.apply("Workload", "MODIFIED", p.workload, S + 3)
    assert counted(model) == 1 and observed(model) == {"v": "live"}
    model.apply("Event", "MODIFIED", repeated(p.event, S + 20), S + 20)
    assert counted(model) == 1


def test_a_live_preemption_whose_preemptor_never_shows_is_counted_once_after_a_minute() -> None:
    """Made live while it still waits for its preemptor (gone already): counted when the wait
    ends, once, with the cause it could be given."""
    v, gone = victim("v", S - 600), urgent("gone", S - 300)
    p = preempt(v, gone, S + 1)
    model = ClusterModel()
    model.replace("Node", [s.node("n1", ("t", "m", "nn-a"))], S)
    model.replace("LocalQueue", [kueue(s.local_queue(NS, CQ))], S)
    model.replace("Event", [], S)
    model.replace("Workload", [p.workload], S + 2)  # history, waiting for its preemptor
    model.apply("Event", "ADDED", p.event, S + 2)  # live now, still waiting
    assert counted(model) == 0 and observed(model) == {"v": "live"}
    model.apply("Node", "MODIFIED", s.node("n1", ("t", "m", "nn-a"), rv="2"), S + 100)
    assert model.preemption_counts == {(CQ, CQ, "InClusterQueue", "unknown"): 1}
    model.apply("Event", "MODIFIED", repeated(p.event, S + 110), S + 110)
    assert counted(model) == 1


def test_a_preemption_stamped_just_before_the_watch_began_is_live_when_watched() -> None:
    """Timestamps have whole seconds and a kind's list may be taken a moment before the model's
    first event: within LIVE_SLACK_S before the watch began, a watched copy is live; older,
    it is an old object updated."""
    just, stale = victim("v-just", S - 600), victim("v-stale", S - 600)
    u1, u2 = urgent("u1", S - 300), urgent("u2", S - 300)
    model = ClusterModel()
    start_up(model, [just, stale, u1, u2], [])
    model.apply("Workload", "MODIFIED", preempt(just, u1, S - LIVE_SLACK_S + 1).workload, S)
    model.apply("Workload", "MODIFIED", preempt(stale, u2, S - LIVE_SLACK_S - 60).workload, S)
    assert observed(model) == {"v-just": "live", "v-stale": "history"}
    assert counted(model) == 1


def test_history_waiting_for_its_preemptor_is_named_but_never_counted() -> None:
    known, gone = urgent("u-known", S - 900), urgent("u-gone", S - 900)
    named = preempt(victim("v-named", S - 1000), known, S - 300)
    orphan = preempt(victim("v-orphan", S - 1000), gone, S - 200)
    model = ClusterModel()
    model.replace("Node", [s.node("n1", ("t", "m", "nn-a"))], S)
    model.replace("LocalQueue", [kueue(s.local_queue(NS, CQ))], S)
    model.replace("Event", [named.event, orphan.event], S)  # Events listed before Workloads
    model.replace("Workload", [named.workload, orphan.workload, known], S + 1)
    model.apply("Node", "MODIFIED", s.node("n1", ("t", "m", "nn-a"), rv="2"), S + 300)
    assert {r.victim_name: r.preemptor for r in model.ledger} == {
        "v-named": f"{NS}/u-known",
        "v-orphan": f"uid:{gone['metadata']['uid']}",  # its preemptor never appeared
    }
    assert counted(model) == 0


def test_a_restarted_model_keeps_the_ledger_and_counts_only_new_preemptions() -> None:
    """Three preemptions, a restart 30 s after the last (recent enough to be judged again,
    so counting it again would land on the same series), then one more: Prometheus sees the
    counter reset, and increase() from the first preemption on shows the three since."""
    first = ClusterModel()
    start_up(first, [], [])
    state: dict[str, dict[str, Any]] = {}  # what the API server holds, by name
    events: list[dict[str, Any]] = []
    scrapes = []
    for i, at in enumerate((S + 100, S + 200, S + 300)):
        v, u = victim(f"v{i}", at - 50), urgent(f"u{i}", at - 10)
        p = preempt(v, u, at)
        first.apply("Workload", "ADDED", v, at - 50)
        first.apply("Workload", "ADDED", u, at - 10)
        first.apply("Workload", "MODIFIED", p.workload, at)
        first.apply("Event", "ADDED", p.event, at)
        state |= {f"v{i}": p.workload, f"u{i}": u}
        events.append(p.event)
        scrapes.append(scrape(ClusterService(first)))
    assert counted(first) == 3

    # The restart: a new model lists the same API server state.
    second = ClusterModel()
    restart = S + 330
    second.replace("Node", [s.node("n1", ("t", "m", "nn-a"))], restart)
    second.replace("LocalQueue", [kueue(s.local_queue(NS, CQ))], restart)
    second.replace("Workload", list(state.values()), restart)
    second.replace("Event", events, restart)
    scrapes.append(scrape(ClusterService(second)))
    v, u = victim("v3", restart + 10), urgent("u3", restart + 20)
    p = preempt(v, u, restart + 30)
    second.apply("Workload", "ADDED", v, restart + 10)
    second.apply("Workload", "ADDED", u, restart + 20)
    second.apply("Event", "ADDED", p.event, restart + 30)
    second.apply("Workload", "MODIFIED", p.workload, restart + 31)
    scrapes.append(scrape(ClusterService(second)))

    assert reset_aware_increase(scrapes, 0) == 3  # v1, v2, v3: v0 is the window's baseline
    assert counted(first) + counted(second) == 4  # every real preemption, once
    assert scrapes[3] == {}  # the restarted process starts from zero
    assert observed(second) == {"v0": "history", "v1": "history", "v2": "history", "v3": "live"}


# --- the service on the simulated API server, restarted mid-scenario ---------------------------

SIM_START = 1_795_000_000.0
SIM_NS = "hyperpod-ns-a"


class Clock:
    """Simulated time shared by the cluster, its API server and the service."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Process:
    """One run of the cluster service: its own model, fed by the production informers."""

    def __init__(self, url: str, clock: Clock) -> None:
        self.service = ClusterService(clock=clock)
        self.informers = InformerSet(kube_api_client(url), self.service)
        self.service.attach(self.informers)
        self.informers.start()
        assert self.informers.wait_synced(30), "the informers did not sync"

    def stop(self) -> None:
        self.informers.stop()

    def scrape(self) -> Scrape:
        return scrape(self.service)

    def has_seen(self, preemptor: str) -> bool:
        """The preemption by `preemptor` is ledgered, named and live, and its victim's
        condition has arrived too."""
        with self.service.lock:
            model = self.service.model
            for record in model.ledger:
                if record.preemptor_name != preemptor or record.observed != "live":
                    continue
                state = model.workload_state(record.victim_namespace, record.victim_name)
                cond = state.workload.condition("Preempted") if state else None
                return (
                    cond is not None
                    and cond.status == "True"
                    and preemptor_uid_in(model, preemptor, cond.message)
                )
        return False

    def wait_seen(self, preemptor: str) -> None:
        eventually(lambda: self.has_seen(preemptor), f"the preemption by {preemptor}")

    def relisted(self, kinds: tuple[str, ...], before: dict[str, tuple[int, int]]) -> bool:
        now = {st.kind: (st.lists, st.relists_gone) for st in self.informers.status()}
        return all(now[k][0] > before[k][0] and now[k][1] > before[k][1] for k in kinds)

    def informer_counts(self) -> dict[str, tuple[int, int]]:
        return {st.kind: (st.lists, st.relists_gone) for st in self.informers.status()}


def preemptor_uid_in(model: ClusterModel, name: str, message: str) -> bool:
    state = model.workload_state(SIM_NS, name)
    return state is not None and state.workload.uid in message


def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


class World:
    """A one-team cluster (8 p5 nodes, 64 GPUs) filled by 16 fine-tuning jobs of 4 GPUs, each
    a victim-in-waiting for an inference job of 4 GPUs."""

    def __init__(self) -> None:
        self.clock = Clock(SIM_START)
        self.store = ObjectStore(clock=self.clock)
        shape = ClusterShape(
            p5_nodes=8,
            ultraserver_nodes=0,
            teams=("a",),
            arrivals_per_minute=0.0,
            initial_workloads=0,
        )
        self.cluster = SimulatedCluster(self.store, shape, seed=4, start=SIM_START)
        self.cluster.bootstrap()
        for i in range(16):
            self.cluster.submit(
                "a", f"bulk-{i}", 4, 1, "fine-tuning-priority", now=SIM_START, runtime_s=1e7
            )
        self.cluster.step(SIM_START + 1)
        # No bookmarks: an informer's resourceVersion is that of the last object of its kind.
        self.server = FakeApiServer(self.store, bookmark_interval=3600.0).start()
        self.preemptions = 0

    def minute(self, m: int) -> float:
        self.clock.now = SIM_START + 60 * m
        return self.clock.now

    def preempt(self, name: str) -> str:
        """An inference job arrives now and preempts one fine-tuning job; its Workload name."""
        at = self.clock.now
        job = self.cluster.submit("a", name, 4, 1, "inference-priority", now=at, runtime_s=1e7)
        before = self.preempted_events()
        self.cluster.step(at + 1)  # the victim is evicted
        self.cluster.step(at + 2)  # the preemptor is admitted
        assert self.preempted_events() == before + 1, "the scenario meant one preemption"
        self.preemptions += 1
        return job

    def preempted_events(self) -> int:
        return sum(1 for e in self.store.items("events") if e.get("reason") == "Preempted")

    def close(self) -> None:
        self.server.stop()


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.close()


def promtool_increase_test(scrapes: list[Scrape], first: int, expected: int, tmp: Path) -> str:
    """A `promtool test rules` file: one scrape a minute, a series absent from a scrape is
    `_` before it first appeared and `stale` after (the restart); asserts that
    sum(increase(topowatch_preemptions_total[...])) from scrape `first` to the last is
    `expected`. Returns promtool's complaints ('' when it passes)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    series = []
    for key in sorted({k for scrape in scrapes for k in scrape}):
        values, seen = [], False
        for scrape in scrapes:
            if key in scrape:
                values.append(f"{scrape[key]:g}")
                seen = True
            else:
                values.append("stale" if seen else "_")
        labels = ",".join(f'{k}="{v}"' for k, v in key)
        series.append({"series": f"{PREEMPTIONS}{{{labels}}}", "values": " ".join(values)})
    last = len(scrapes) - 1
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"sum(increase({PREEMPTIONS}[{last - first}m]))",
                        "eval_time": f"{last}m",
                        "exp_samples": [{"labels": "{}", "value": expected}],
                    }
                ],
            }
        ],
    }
    path = tmp / "increase_test.yaml"
    path.write_text(json.dumps(test, indent=1))  # JSON is YAML
    proc = subprocess.run(
        [binary, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


@pytest.mark.real_component
def test_increase_across_a_restart_equals_the_real_preemptions(
    world: World, tmp_path: Path
) -> None:
    world.minute(0)
    world.preempt("before-any")  # before topowatch ran: history for both processes
    scrapes: list[Scrape] = []

    world.minute(1)
    first = Process(world.server.url, world.clock)
    scrapes.append(first.scrape())
    assert scrapes[-1] == {}  # the preemption before it started is not counted
    window_start = len(scrapes)
    for m, name in ((2, "live-1"), (3, "live-2"), (4, "live-3"), (5, "live-4")):
        world.minute(m)
        first.wait_seen(world.preempt(name))
        scrapes.append(first.scrape())
    before_restart = sum(scrapes[-1].values())
    assert before_restart == 4

    # The restart (a container restart: same target, a new process, counters from zero).
    world.minute(6)
    first.stop()
    world.clock.now += 30  # live-4 is 90 s old now: recent enough to be judged again
    second = Process(world.server.url, world.clock)
    scrapes.append(second.scrape())
    assert scrapes[-1] == {}, "history rebuilt at start-up moved the counter"
    served = second.service.preemptions(0)
    assert len(served) == 5  # before-any and live-1..4, all still listed
    assert {r["observed"] for r in served} == {"history"}
    assert all(r["preemptor"].startswith(f"{SIM_NS}/") for r in served)

    world.minute(7)
    second.wait_seen(world.preempt("live-5"))
    scrapes.append(second.scrape())

    # 410 Gone: move the store's resourceVersion past every Workload and Event the informers
    # saw (a Node write), forget the watch history, cut the watches; a preemption happens
    # while they reconnect (it reaches the model in the re-list or right after it).
    world.minute(8)
    informers_before = second.informer_counts()
    world.cluster.cordon(world.cluster.nodes()[0].name, "Schedulable")
    world.store.compact()
    world.server.drop_watches()
    job = world.preempt("during-relist")
    eventually(
        lambda: second.relisted(("Workload", "Event"), informers_before),
        "410 Gone and a re-list of Workloads and Events",
    )
    second.wait_seen(job)
    scrapes.append(second.scrape())

    world.minute(9)
    second.wait_seen(world.preempt("live-7"))
    scrapes.append(second.scrape())
    time.sleep(0.3)  # any late copy (a second Event, a re-delivered condition) would land now
    world.minute(10)
    scrapes.append(second.scrape())
    second.stop()

    after_restart = sum(scrapes[-1].values())
    lived = world.preemptions - 1  # all but the one before topowatch ran
    assert before_restart + after_restart == lived == 7
    in_window = lived - 1  # the window starts on the scrape that counted live-1
    assert reset_aware_increase(scrapes, window_start) == in_window
    assert promtool_increase_test(scrapes, window_start, in_window, tmp_path) == ""
    assert len(second.service.preemptions(0)) == 1 + lived
