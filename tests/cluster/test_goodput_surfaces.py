"""Issue 29 part 5, where people look: the goodput ledger's metrics (bounded), its API (shapes
and 400s), `topowatch explain NS/JOB`, the pages (timeline drawn, escaped), and a restart that
keeps the ledger (the history store on SQLite).

The cluster is the goodput harness's (tests/cluster/goodput/harness.py): a real ClusterModel
fed hand-built objects on a hand-held clock, with the production ClusterService over it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import build_parser
from exporter.cluster.explain import goodput_text
from exporter.cluster.goodput.attribution import SETTLE_S
from exporter.cluster.history.feed import open_history
from exporter.cluster.metrics import goodput as goodput_metrics
from exporter.cluster.run import explain_live
from exporter.cluster.service import ClusterService
from exporter.cluster.ui import pages as ui
from exporter.cluster.ui.svg import timeline_svg
from exporter.cluster.views.workloads import iso
from exporter.sim import synthetic as syn
from tests.cluster.goodput.harness import CQ, NS, T0, World, xid79
from tests.conftest import ServedCluster

TEAM = "llm"  # team_of(hyperpod-ns-llm-clusterqueue)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def interrupted_world() -> World:
    """`train` (2 nodes, 16 GPUs) loses node a to XID 79 at +100, a is replaced and back at
    +900, the job runs again at +960; `eval` (8 GPUs on c) starts at +960 and runs."""
    w = World()
    for name in ("a", "b", "c"):
        w.node(name)
    w.run_job("train", ["a", "b"])
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("train-0")
    w.delete_pod("train-1")
    w.at(T0 + 130).node("a", findings=[xid79(T0 + 100)], health="UnschedulablePendingReplacement")
    w.at(T0 + 900).node("a", findings=[])
    w.at(T0 + 930)
    w.pod("train-2", "a", "train", "train", ready=False)
    w.pod("train-3", "b", "train", "train", ready=False)
    w.at(T0 + 960)
    w.pod("train-2", "a", "train", "train")
    w.pod("train-3", "b", "train", "train")
    w.run_job("eval", ["c"])
    settle(w, T0 + 1200)
    return w


def settle(w: World, t: float) -> None:
    w.at(t)
    w.book.tick(t)


def service_of(w: World, **kwargs: Any) -> ClusterService:
    return ClusterService(model=w.model, goodput=w.book, clock=lambda: w.now, **kwargs)


def samples(service: ClusterService) -> Samples:
    text = service.metrics_body(False).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def series(found: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in found.items() if n == name}


def nonzero(found: dict[frozenset[tuple[str, str]], float]) -> dict[Any, float]:
    return {labels: value for labels, value in found.items() if value}


def key(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[World, ClusterService, ServedCluster]]:
    w = interrupted_world()
    service = service_of(w)
    running = ServedCluster(service)
    try:
        yield w, service, running
    finally:
        running.stop()


def get(port: int, path: str) -> tuple[int, dict[str, str], Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            body = response.read()
            kind = response.headers.get("Content-Type", "")
            value = json.loads(body) if "json" in kind else body.decode()
            return response.status, dict(response.headers), value
    except urllib.error.HTTPError as exc:
        body = exc.read()
        kind = exc.headers.get("Content-Type", "")
        return exc.code, dict(exc.headers), json.loads(body) if "json" in kind else body.decode()


# --- metrics --------------------------------------------------------------------------------


def test_metric_families_carry_the_ledger_with_bounded_labels() -> None:
    w = interrupted_world()
    found = samples(service_of(w))
    counted = series(found, "topowatch_interruptions_total")
    assert nonzero(counted) == {key(cause="node_fault", component="gpu", team=TEAM): 1}
    # every series of the team from 0 (increase() sees no first increment otherwise), and a
    # component only for the causes of a node
    assert len(counted) == len(goodput_metrics.SERIES) == 4 + 2 * 7
    assert key(cause="preempted", component="", team=TEAM) in counted
    lost = series(found, "topowatch_goodput_lost_gpu_seconds")
    assert lost[key(cause="node_fault", team=TEAM)] == pytest.approx(16 * 860)
    assert {dict(k)["cause"] for k in lost} == set(goodput_metrics.LOST_CAUSES)
    # ETTR of the team: train ran 100 + 240 s, eval 240 s, of 1200 + 240 s of wall time
    running = series(found, "topowatch_goodput_running_seconds")[key(team=TEAM)]
    wall = series(found, "topowatch_goodput_effective_wall_seconds")[key(team=TEAM)]
    assert running == pytest.approx(100 + 240 + 240)
    assert wall == pytest.approx(1200 + 240)
    ettr = series(found, "topowatch_goodput_ettr_ratio")[key(team=TEAM)]
    assert ettr == pytest.approx(running / wall)
    jobs = series(found, "topowatch_job_ettr_ratio")
    train = key(namespace=NS, job_name="train", team=TEAM)
    assert jobs[train] == pytest.approx(340 / 1200)
    assert series(found, "topowatch_job_interruptions")[train] == 1
    assert (
        series(found, "topowatch_job_interruptions")[key(namespace=NS, job_name="eval", team=TEAM)]
        == 0
    )
    assert not any("job" in dict(k) for k in jobs), "job is the scrape's label, not ours"
    assert series(found, "topowatch_goodput_job_series_dropped") == {key(): 0}


def test_the_scrapes_lean_figures_are_the_ledgers_own_goodput() -> None:
    """/metrics reads every job per scrape, so it sums the tracks itself: the same figures as
    the book's `job_goodput` and `goodput_by`, for running, interrupted, finished and
    suspended jobs alike."""
    w = interrupted_world()
    w.at(T0 + 1300).workload(
        "eval",
        1,
        conditions=[syn.condition("Finished", "True", "Succeeded", "done", T0 + 1300)],
    )
    w.at(T0 + 1400).workload("paused", 1, active=False)
    settle(w, T0 + 2000)
    by_team = {g.name: g for g in w.book.goodput_by("team", w.now)}
    for track in w.book.jobs.values():
        if track.first_admitted is None:
            continue
        figures = goodput_metrics.job_figures(track, w.now)
        good = w.book.job_goodput(track.key[0], track.key[2], w.now)
        assert good is not None
        assert figures.running_s == pytest.approx(good.seconds["running"])
        assert figures.wall_s == pytest.approx(good.wall)
        assert figures.ettr == pytest.approx(good.ettr)
        assert figures.interruptions == good.interruptions
        assert figures.lost_gpu_seconds_by_cause == pytest.approx(good.lost_gpu_seconds_by_cause)
    # ended jobs' figures, kept between scrapes, are what a fresh reading gives
    cache = goodput_metrics.FigureCache()
    fresh = [goodput_metrics.job_figures(t, w.now) for t in w.book.jobs.values()]
    for later in (w.now, w.now + 600):
        assert sorted(cache.figures(w.book, later), key=lambda f: f.key) == sorted(
            (goodput_metrics.job_figures(t, later) for t in w.book.jobs.values()),
            key=lambda f: f.key,
        )
    assert len(fresh) == len(w.book.jobs)
    found = samples(service_of(w))
    team = by_team[TEAM]
    assert series(found, "topowatch_goodput_ettr_ratio")[key(team=TEAM)] == pytest.approx(team.ettr)
    assert series(found, "topowatch_goodput_effective_wall_seconds")[
        key(team=TEAM)
    ] == pytest.approx(team.wall_s - team.excluded_s)


def test_the_gpu_second_ledger_adds_up_to_capacity_times_time() -> None:
    w = interrupted_world()
    found = samples(service_of(w))
    ledger = series(found, "topowatch_gpu_seconds_total")
    assert {dict(k)["category"] for k in ledger} == set(goodput_metrics.CATEGORIES)
    totals = w.book.gpu_seconds(w.now)
    by_flavor: dict[str, float] = {}
    for labels, value in ledger.items():
        flavor = dict(labels)["flavor"]
        by_flavor[flavor] = by_flavor.get(flavor, 0.0) + value
    capacity: dict[str, float] = {}
    for (flavor, _), ms in totals.capacity.items():
        capacity[flavor] = capacity.get(flavor, 0.0) + ms / 1000
    assert by_flavor == pytest.approx(capacity)
    idle = series(found, "topowatch_gpu_idle_seconds_by_reason_total")
    for flavor in by_flavor:
        reasons = sum(v for k, v in idle.items() if dict(k)["flavor"] == flavor)
        assert reasons == pytest.approx(ledger[key(flavor=flavor, category="idle")])


def test_per_job_series_stop_at_the_cap_largest_first_and_say_how_many_were_dropped() -> None:
    w = interrupted_world()
    found = samples(service_of(w, goodput_job_cap=1))
    assert set(series(found, "topowatch_job_interruptions")) == {
        key(namespace=NS, job_name="train", team=TEAM)
    }
    assert series(found, "topowatch_goodput_job_series_dropped") == {key(): 1}


def test_a_job_finished_long_ago_has_no_per_job_series() -> None:
    w = interrupted_world()
    w.at(T0 + 1300).workload(
        "eval",
        1,
        conditions=[syn.condition("Finished", "True", "Succeeded", "done", T0 + 1300)],
    )
    settle(w, T0 + 1300 + goodput_metrics.RECENT_S / 2)
    recent = series(samples(service_of(w)), "topowatch_job_interruptions")
    assert key(namespace=NS, job_name="eval", team=TEAM) in recent
    settle(w, T0 + 1300 + goodput_metrics.RECENT_S + 60)
    later = series(samples(service_of(w)), "topowatch_job_interruptions")
    assert key(namespace=NS, job_name="eval", team=TEAM) not in later
    assert key(namespace=NS, job_name="train", team=TEAM) in later


def test_the_counter_moves_only_once_the_cause_is_settled_and_never_twice() -> None:
    w = World()
    for name in ("a", "b"):
        w.node(name)
    w.run_job("train", ["a"])
    service = service_of(w)
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("train-0")
    assert nonzero(series(samples(service), "topowatch_interruptions_total")) == {}
    settle(w, T0 + 100 + SETTLE_S + 1)
    counted = {key(cause="node_fault", component="gpu", team=TEAM): 1}
    assert nonzero(series(samples(service), "topowatch_interruptions_total")) == counted
    assert nonzero(series(samples(service), "topowatch_interruptions_total")) == counted


def test_reliability_families_name_offenders_and_never_a_node_in_mtbf() -> None:
    w = World()
    w.node("a", findings=[xid79(T0)])
    w.at(T0 + 3600).node("a", findings=[xid79(T0), xid79(T0 + 3600, gpu=5)])
    w.at(T0 + 7200).node("b")
    service = service_of(w)
    found = samples(service)
    assert series(found, "topowatch_node_repeat_offender") == {key(node="a"): 1}
    # what the remediation ladder is told (serve_cluster wires it to the controller)
    assert service.repeat_offender("a", w.now) == (
        "repeat offender: 2 hardware incidents (gpu) in 7 days"
    )
    assert service.repeat_offender("b", w.now) == ""
    assert series(found, "topowatch_node_hardware_incidents") == {key(node="a"): 2}
    components = series(found, "topowatch_fleet_interruptions")
    assert {dict(k)["component"] for k in components} == set(goodput_metrics.COMPONENTS)
    assert series(found, "topowatch_fleet_observed_node_seconds")[key()] > 0
    mtbf = series(found, "topowatch_fleet_mtbf_seconds")
    assert {dict(k)["scope"] for k in mtbf} <= set(goodput_metrics.MTBF_SCOPES)
    assert key(scope="domain", name="nn-3a") in mtbf


# --- API ------------------------------------------------------------------------------------


def test_interruptions_api_lists_the_ledger_newest_first_with_filters(
    served: tuple[World, ClusterService, ServedCluster],
) -> None:
    _, _, running = served
    status, headers, body = get(running.port, "/api/v1/interruptions")
    assert status == 200 and headers["X-Topowatch-Source"] == "live"
    (entry,) = body
    assert entry["id"] == f"{NS}/Job/train#1"
    assert (entry["cause"], entry["component"], entry["gpus"]) == ("node_fault", "gpu", 16)
    assert entry["evidence"]["node"] == "a" and entry["evidence"]["check"] == "xid"
    assert entry["stopped_at"] == iso(T0 + 100)
    assert entry["resumed_at"] is not None and entry["open"] is False
    assert entry["lost_gpu_hours"] == pytest.approx(16 * 860 / 3600, abs=1e-6)
    for query, count in (
        (f"?namespace={NS}&job=train", 1),
        ("?job=eval", 0),
        ("?cause=preempted", 0),
        ("?cause=node_fault&since=1795000000&until=2026-12-01T00:00:00Z", 1),
        (f"?until={T0 + 50:.0f}", 0),
        ("?limit=1", 1),
    ):
        status, _, found = get(running.port, f"/api/v1/interruptions{query}")
        assert status == 200 and len(found) == count, query


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/api/v1/interruptions?cause=gremlins", "cause='gremlins': expected one of preempted"),
        ("/api/v1/interruptions?since=yesterday", "since='yesterday'"),
        ("/api/v1/interruptions?until=soon", "until='soon'"),
        ("/api/v1/interruptions?limit=ten", "limit='ten': expected a whole number"),
        ("/api/v1/interruptions?limit=0", "limit=0: expected 1 to 10000"),
        ("/api/v1/goodput?group=planet", "group='planet': expected one of team, cluster_queue"),
        (f"/api/v1/goodput/{NS}/train?timeline=maybe", "timeline='maybe': expected 1 or 0"),
    ],
)
def test_bad_query_parameters_are_a_400_that_says_what_was_expected(
    served: tuple[World, ClusterService, ServedCluster], path: str, says: str
) -> None:
    status, _, body = get(served[2].port, path)
    assert status == 400
    assert says in body["error"]


def test_goodput_api_groups_and_one_job(
    served: tuple[World, ClusterService, ServedCluster],
) -> None:
    port = served[2].port
    status, _, body = get(port, "/api/v1/goodput")
    assert status == 200 and body["group"] == "team"
    (team,) = body["groups"]
    assert team["name"] == TEAM and team["jobs"] == 2 and team["interruptions"] == 1
    assert team["lost_gpu_hours_by_cause"] == {"node_fault": pytest.approx(16 * 860 / 3600)}
    assert body["cluster"]["ettr"] == pytest.approx(team["ettr"])
    assert body["gpu_seconds"]["residual_ms"] == 0
    for group in ("cluster_queue", "namespace", "flavor"):
        status, _, grouped = get(port, f"/api/v1/goodput?group={group}")
        assert status == 200 and grouped["group"] == group
    assert get(port, "/api/v1/goodput?group=cluster_queue")[2]["groups"][0]["name"] == CQ
    status, _, job = get(port, f"/api/v1/goodput/{NS}/train")
    assert status == 200
    assert (job["kind"], job["phase"], job["gpus"], job["interruption_count"]) == (
        "Job",
        "running",
        16,
        1,
    )
    assert job["ettr"] == pytest.approx(340 / 1200)
    assert job["seconds"]["waiting"] == 830 and job["seconds"]["restarting"] == 30
    phases = [(b["phase"], round(b["seconds"])) for b in job["timeline"]]
    assert phases == [
        ("running", 100),
        ("waiting", 830),
        ("restarting", 30),
        ("running", 240),
    ]
    status, _, plain = get(port, f"/api/v1/goodput/{NS}/train?timeline=0")
    assert status == 200 and "timeline" not in plain
    assert plain["interruptions"] == job["interruptions"]
    status, _, missing = get(port, f"/api/v1/goodput/{NS}/no-such-job")
    assert status == 404 and "not in the goodput ledger" in missing["error"]
    status, _, reliability = get(port, "/api/v1/reliability")
    assert status == 200 and reliability["repeat_offender_rule"]["incidents"] == 2


def test_a_workloads_view_carries_its_jobs_goodput(
    served: tuple[World, ClusterService, ServedCluster],
) -> None:
    status, _, view = get(served[2].port, f"/api/v1/workloads/{NS}/train")
    assert status == 200
    assert view["goodput"]["interruption_count"] == 1
    assert "timeline" not in view["goodput"]


# --- explain --------------------------------------------------------------------------------


def test_explain_names_each_interruption_its_evidence_and_the_gpu_hours_lost(
    served: tuple[World, ClusterService, ServedCluster],
) -> None:
    _, service, running = served
    text = explain_live(f"http://127.0.0.1:{running.port}", f"{NS}/train", False, False)
    lines = text.splitlines()
    assert any(line.startswith("Goodput of Job train: ETTR 28.3%") for line in lines), text
    assert "Interrupted 1 time: 1 node fault (gpu)" in lines
    (entry,) = [line for line in lines if line.startswith(f"  {iso(T0 + 100)}")]
    assert "node fault (gpu): " in entry and "16 GPUs, 3.82 GPU-hours lost" in entry
    assert any(
        f"detected {iso(T0 + 100)} -> action replace {iso(T0 + 130)} -> node back "
        f"{iso(T0 + 900)} -> running again {iso(T0 + 960)}" in line
        for line in lines
    ), text
    view = service.goodput_job(NS, "eval")
    assert view is not None
    assert "Not interrupted." in goodput_text(view)


def test_explain_of_a_job_name_no_workload_carries_asks_the_goodput_ledger() -> None:
    w = World()
    w.node("a")
    w.workload("train-abc12", 1, owner="trainer")
    w.pod("trainer-0", "a", "trainer", "train-abc12")
    settle(w, T0 + 600)
    running = ServedCluster(service_of(w))
    try:
        text = explain_live(f"http://127.0.0.1:{running.port}", f"{NS}/trainer", False, False)
        as_json = json.loads(
            explain_live(f"http://127.0.0.1:{running.port}", f"{NS}/trainer", False, True)
        )
    finally:
        running.stop()
    assert text.startswith(f"{NS}/trainer (Job, {CQ}): running, 8 GPUs, team {TEAM}\n")
    assert "ETTR 100.0%" in text and "Not interrupted." in text
    assert as_json["name"] == "trainer" and as_json["kind"] == "Job"


def test_explain_with_fifty_interruptions_lists_them_all() -> None:
    w = World()
    w.node("a")
    w.run_job("flaky", ["a"])
    t = T0
    for n in range(50):
        t += 600
        w.at(t).delete_pod(f"flaky-{n}")
        w.at(t + 60)
        w.pod(f"flaky-{n + 1}", "a", "flaky", "flaky")
    settle(w, t + 600)
    view = service_of(w).goodput_job(NS, "flaky")
    assert view is not None
    text = goodput_text(view)
    assert "Interrupted 50 times:" in text
    assert len(view["interruptions"]) == 50


# --- pages ----------------------------------------------------------------------------------


def test_job_page_draws_the_timeline_and_marks_each_interruption_with_its_cause(
    served: tuple[World, ClusterService, ServedCluster],
) -> None:
    port = served[2].port
    status, _, page = get(port, f"/ui/goodput/{NS}/train")
    assert status == 200
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="goodput-timeline"' in page
    for phase in ("running", "waiting", "restarting"):
        assert f'class="band {phase}"' in page
    assert page.count('<g class="interruption" data-cause="node_fault"') == 1
    assert f"<title>#1 {iso(T0 + 100)}: node_fault (gpu): " in page
    assert 'id="interruption-1"' in page and 'href="#interruption-1"' in page
    status, _, fleet = get(port, "/ui/goodput")
    assert status == 200
    assert f'<tr data-team="{TEAM}">' in fleet
    assert '<tr data-cause="node_fault">' in fleet
    assert f'href="/ui/goodput/{NS}/train"' in fleet
    assert '<a href="/ui/goodput">Goodput</a>' in fleet  # in every page's navigation
    status, _, missing = get(port, f"/ui/goodput/{NS}/nothing")
    assert status == 404 and "not known" in missing


def test_pages_escape_what_the_cluster_wrote() -> None:
    evil = '<script>alert("x")</script>'
    entry = {
        "stopped_at": "2026-01-01T00:00:00Z",
        "stopped_at_s": 100.0,
        "cause": "unknown",
        "component": "",
        "detail": "",
        "missing": evil,
        "uncertain": evil,
        "gpus": 8,
        "lost_gpu_hours": 1.0,
        "open": False,
        "settled": True,
        "evidence": {"action": evil},
    }
    job = {
        "namespace": evil,
        "name": evil,
        "kind": "Job",
        "team": evil,
        "cluster_queue": evil,
        "gpus": 8,
        "phase": "running",
        "ettr": 0.5,
        "lost_gpu_hours": 1.0,
        "wall_s": 200.0,
        "effective_wall_s": 200.0,
        "seconds": {"running": 100.0, "waiting": 100.0},
        "interruptions": [entry],
        "timeline": [
            {"phase": "running", "start": 0.0, "end": 100.0, "from": evil, "to": evil},
            {"phase": evil, "start": 100.0, "end": 200.0, "from": evil, "to": evil},
        ],
    }
    page = ui.goodput_job_page(job)
    assert "<script>" not in page and "&lt;script&gt;" in page
    fleet = ui.goodput_page(
        {
            "as_of": evil,
            "cluster": {"ettr": None, "lost_gpu_hours_by_cause": {evil: 1.0}},
            "teams": [
                {
                    "name": evil,
                    "jobs": 1,
                    "ettr": 0.5,
                    "running_s": 1.0,
                    "effective_wall_s": 2.0,
                    "interruptions": 1,
                    "lost_gpu_hours": 1.0,
                }
            ],
            "gpu_seconds": {"by_flavor": {evil: {"idle": 1.0}}},
            "reliability": {
                "interruptions_by_component": {},
                "mtbf": {"domain": [{"name": evil, "node_days": 1, "incidents": 1}]},
                "repeat_offenders": [
                    {
                        "node": evil,
                        "incidents": 2,
                        "first": evil,
                        "last": evil,
                        "components": [evil],
                    }
                ],
            },
            "jobs": [job],
            "jobs_total": 1,
        }
    )
    assert "<script>" not in fleet and "&lt;script&gt;" in fleet


def test_the_timeline_svg_spans_the_job_and_titles_every_band() -> None:
    bands = [
        {"phase": "running", "start": 0.0, "end": 50.0, "from": "a", "to": "b"},
        {"phase": "preempted", "start": 50.0, "end": 100.0, "from": "b", "to": "c"},
    ]
    marks = [{"stopped_at_s": 50.0, "cause": "preempted", "stopped_at": "b", "detail": "by x"}]
    svg = timeline_svg(bands, marks, 0.0, 100.0)
    assert svg.count('<rect class="band') == 2
    assert 'x="10.0" y="22" width="540.0"' in svg  # half of the drawing's width
    assert "<title>preempted from b to c (50s)</title>" in svg
    assert "<title>#1 b: preempted: by x; 0.00 GPU-hours lost</title>" in svg


# --- restart --------------------------------------------------------------------------------


def test_a_restart_keeps_the_ledger_through_the_history_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/history.db"
    w = interrupted_world()
    first = service_of(w, history=open_history(url, "replica-1"))
    feed = first.history
    assert feed is not None
    feed.attach(first.model, goodput=first.goodput, clock=first.clock)
    feed.writer.start()
    before = samples(first)
    feed.pump(first.lock)
    assert feed.writer.flush(10.0)
    feed.writer.stop()
    feed.store.close()
    good = first.goodput_job(NS, "train")
    assert good is not None

    # A new process on the same file, a minute later, before its first list.
    w2 = World()
    w2.now = w.now + 60
    second = service_of(w2, history=open_history(url, "replica-1"))
    assert second.history is not None
    second.history.attach(second.model, goodput=second.goodput, clock=second.clock)
    assert second.restore_goodput() == 0
    try:
        (entry,) = second.goodput.interruptions_of(NS, "train")
        assert (entry.cause, entry.component, entry.node) == ("node_fault", "gpu", "a")
        assert entry.resumed_at == T0 + 960
        after = samples(second)
        lost = key(cause="node_fault", team=TEAM)
        assert series(after, "topowatch_goodput_lost_gpu_seconds")[lost] == pytest.approx(
            series(before, "topowatch_goodput_lost_gpu_seconds")[lost]
        )
        # rebuilt from history: in the ledger, not counted as seen happening
        assert nonzero(series(after, "topowatch_interruptions_total")) == {}
        restored = second.goodput_job(NS, "train")
        assert restored is not None
        assert restored["seconds"]["running"] >= good["seconds"]["running"]
        assert restored["seconds"]["unobserved"] == pytest.approx(60, abs=1)
        ledger = series(after, "topowatch_gpu_seconds_total")
        assert sum(ledger.values()) == pytest.approx(
            sum(series(before, "topowatch_gpu_seconds_total").values())
        )
    finally:
        second.history.store.close()

    # A job the ledger in memory no longer holds is answered from the store.
    w3 = World()
    third = service_of(w3, history=open_history(url, "replica-1"))
    assert third.history is not None
    running = ServedCluster(third)
    try:
        status, headers, stored = get(running.port, f"/api/v1/goodput/{NS}/train")
    finally:
        running.stop()
        third.history.store.close()
    assert status == 200 and headers["X-Topowatch-Source"] == "history"
    assert (stored["kind"], stored["interruption_count"]) == ("Job", 1)
    assert stored["interruptions"][0]["cause"] == "node_fault"
    assert stored["ettr"] == pytest.approx(good["ettr"])


# --- flags ------------------------------------------------------------------------------------


def test_cluster_flags_for_the_goodput_ledger() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "cluster",
            "--goodput-checkpoint-key",
            "example.com/ckpt",
            "--repeat-offender",
            "3/36h",
            "--goodput-job-series-cap",
            "50",
        ]
    )
    assert args.goodput_checkpoint_key == "example.com/ckpt"
    assert args.repeat_offender == (3, 36 * 3600.0)
    assert args.goodput_job_series_cap == 50
    defaults = parser.parse_args(["cluster"])
    assert defaults.repeat_offender == (2, 7 * 86_400.0)
    assert defaults.goodput_job_series_cap == 500
    for bad in (
        ["--repeat-offender", "2"],
        ["--repeat-offender", "0/7d"],
        ["--repeat-offender", "2/week"],
        ["--goodput-job-series-cap", "0"],
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(["cluster", *bad])
