"""`topowatch cluster` end to end: the simulated cluster behind the list/watch API server, the
production informers through the official client, the model, and the HTTP API and metrics.

These are the answers an admin asks for: who preempted this job and was it quota or topology,
why is this one pending, and does the service keep answering when the API server misbehaves.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exporter.cluster.informers import WATCHED
from exporter.cluster.run import explain_live
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.server import Exchange, FakeApiServer, ObjectStore
from healthcheck.remediation.controller import RemediationController
from tests.cluster.test_informers import newest_rv_served, served_410
from tests.conftest import free_port, promtool_lint, serving

L3 = "topology.k8s.aws/network-node-layer-3"
NS = "hyperpod-ns-a"


class RunningService:
    """serve_cluster in a thread (`tests.conftest.serving`), for tests that start and stop it
    outside a `with` block; `get` reads its HTTP API."""

    def __init__(
        self,
        url: str,
        workload_cap: int = 2000,
        quota_min_observed_s: float = 0,
        controller: RemediationController | None = None,
    ) -> None:
        self._serving = serving(
            url,
            workload_cap=workload_cap,
            quota_min_observed_s=quota_min_observed_s,
            controller=controller,
        )
        self.port, self.service = self._serving.__enter__()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as response:
                body, status, ctype = response.read(), response.status, response.headers
        except urllib.error.HTTPError as exc:
            body, status, ctype = exc.read(), exc.code, exc.headers
        if "json" in ctype.get("Content-Type", ""):
            return status, json.loads(body)
        return status, body

    def stop(self) -> None:
        self._serving.__exit__(None, None, None)


def eventually(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what or check}: last {last!r}")


def scripted(teams: tuple[str, ...] = ("a",)) -> ClusterShape:
    return ClusterShape(
        p5_nodes=8, ultraserver_nodes=0, teams=teams, arrivals_per_minute=0.0, initial_workloads=0
    )


World = tuple[SimulatedCluster, ObjectStore, FakeApiServer, float]


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """One team by default (it owns all 64 GPUs); `@pytest.mark.teams("a", "b")` for a cohort."""
    marker = request.node.get_closest_marker("teams")
    teams = tuple(marker.args) if marker else ("a",)
    start = time.time()
    store = ObjectStore()
    cluster = SimulatedCluster(store, scripted(teams), seed=2, start=start)
    cluster.bootstrap()
    server = FakeApiServer(store, bookmark_interval=0.2).start()
    yield cluster, store, server, start
    server.stop()


@pytest.fixture
def service(
    world: World,
) -> Iterator[RunningService]:
    running = RunningService(world[2].url)
    eventually(lambda: running.get("/readyz")[0] == 200, what="readyz")
    yield running
    running.stop()


def model_sees(running: RunningService, namespace: str, name: str, status: str) -> bool:
    code, view = running.get(f"/api/v1/workloads/{namespace}/{name}")
    return code == 200 and view["status"] == status


def test_topology_driven_preemption_explained_end_to_end(
    world: World, service: RunningService
) -> None:
    cluster, _, _, start = world
    first = cluster.submit("a", "ft-1", 8, 3, "fine-tuning-priority", ("required", L3), start)
    cluster.step(start + 1)
    second = cluster.submit("a", "ft-2", 8, 3, "fine-tuning-priority", ("required", L3), start + 1)
    cluster.step(start + 2)
    eventually(lambda: model_sees(service, NS, second, "admitted"), what="ft-2 admitted")
    train = cluster.submit("a", "train", 8, 2, "training-priority", ("required", L3), start + 2)
    cluster.step(start + 3)  # no layer-3 domain has 2 free nodes: ft-2 is preempted
    cluster.step(start + 4)  # train lands in one domain
    eventually(lambda: model_sees(service, NS, train, "admitted"), what="train admitted")

    # The record appears at the preemption; its freed GPUs grow as the victim's pods are
    # deleted, one watch event each: wait for the last of the three (on a loaded machine the
    # first read can land between two of them).
    def settled() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = service.get("/api/v1/preemptions")[1]
        return found if found and found[0]["gpus_freed"] >= 24 else None

    records = eventually(settled, what="a preemption whose three victim pods are gone")
    (record,) = records
    assert record["victim"] == f"{NS}/{second}"
    assert record["preemptor"] == f"{NS}/{train}"
    assert record["reason"] == "InClusterQueue"
    assert record["verdict"] == "topology", record["verdict_detail"]
    assert record["gpus_freed"] == 24

    code, view = service.get(f"/api/v1/workloads/{NS}/{second}")
    assert code == 200 and view["preemptions_suffered"][0]["preemptor"] == f"{NS}/{train}"
    code, view = service.get(f"/api/v1/workloads/{NS}/{train}")
    assert view["locality"]["domains"]["network-node-layer-3"] == 1
    assert view["locality"]["topology"] == {
        "mode": "required",
        "level": "network-node-layer-3",
        "met": True,
    }
    assert view["preemptions_caused"][0]["victim"] == f"{NS}/{second}"
    assert first  # untouched: only one victim was needed

    text = explain_live(service.base, f"{NS}/{second}", False, False)
    assert f"by {NS}/{train}" in text and "topology-driven" in text

    code, body = service.get("/metrics")
    assert code == 200
    assert promtool_lint(body) == ""
    assert (
        'topowatch_preemptions_total{cluster_queue="hyperpod-ns-a-clusterqueue",'
        'preempting_cluster_queue="hyperpod-ns-a-clusterqueue",reason="InClusterQueue",'
        'cause="topology"} 1' in body.decode()
    )


@pytest.mark.teams("a", "b")
def test_cohort_reclamation_is_quota_driven_and_names_both_queues(
    world: World, service: RunningService
) -> None:
    cluster, _, _, start = world
    borrower = cluster.submit("b", "borrow", 8, 4, "training-priority", now=start)
    cluster.step(start + 1)
    eventually(lambda: model_sees(service, "hyperpod-ns-b", borrower, "admitted"))
    claim = cluster.submit("a", "claim", 8, 5, "fine-tuning-priority", now=start + 1)
    cluster.step(start + 2)
    cluster.step(start + 3)
    eventually(lambda: model_sees(service, NS, claim, "admitted"), what="claim admitted")
    (record,) = eventually(lambda: service.get("/api/v1/preemptions")[1], what="preemption")
    assert record["reason"] == "InCohortReclamation"
    assert record["victim_cluster_queue"] == "hyperpod-ns-b-clusterqueue"
    assert record["preemptor_cluster_queue"] == "hyperpod-ns-a-clusterqueue"
    assert record["verdict"] == "quota"


def test_pending_on_topology_is_explained_with_the_largest_free_domain(
    world: World, service: RunningService
) -> None:
    cluster, _, _, start = world
    cluster.submit("a", "small", 8, 1, "fine-tuning-priority", now=start)
    cluster.step(start + 1)
    wide = cluster.submit("a", "wide", 8, 5, "inference-priority", ("required", L3), start + 1)
    cluster.step(start + 2)

    def topology_pending() -> Any:
        code, view = service.get(f"/api/v1/workloads/{NS}/{wide}")
        return view if code == 200 and (view["pending"] or {}).get("cause") == "topology" else None

    view = eventually(topology_pending, what="topology pending cause")
    assert (
        "fits 4 of 5 pods of 8 GPUs in the largest free network-node-layer-3 domain"
        in (view["pending"]["summary"])
    )
    assert any("room for 1 more pod of 8 GPUs" in fix for fix in view["would_run_if"])
    _, body = service.get("/metrics")
    assert (
        'topowatch_pending_workloads{cluster_queue="hyperpod-ns-a-clusterqueue",cause="topology"} 1'
        in body.decode()
    )


def test_api_rejects_bad_queries_clearly(service: RunningService) -> None:
    code, body = service.get("/api/v1/preemptions?since=yesterday-ish")
    assert code == 400 and "since" in body["error"]
    code, body = service.get("/api/v1/workloads/nowhere/nothing")
    assert code == 404 and "nowhere/nothing" in body["error"]
    code, body = service.get("/api/v1/preemptions?since=15m")
    assert code == 200 and body == []
    code, listed = service.get("/api/v1/workloads?status=pending")
    assert code == 200 and listed == []
    code, topo = service.get("/api/v1/topology")
    assert code == 200
    assert {f["level"] for f in topo["fragmentation"]} >= {"network-node-layer-3", "node"}


def test_api_server_down_at_start_then_up(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    store = ObjectStore()
    SimulatedCluster(store, scripted(), seed=1).bootstrap()
    running = RunningService(f"http://127.0.0.1:{port}")
    try:
        code, state = running.get("/readyz")
        assert code == 503 and not state["ready"]
        assert running.get("/healthz")[0] == 200
        code, body = running.get("/metrics")  # still serving, saying why
        assert code == 200 and b'topowatch_cluster_informer_synced{kind="Node"} 0' in body
        server = FakeApiServer(store, port=port, bookmark_interval=0.2).start()
        try:
            eventually(lambda: running.get("/readyz")[0] == 200, timeout=30, what="recovery")
            _, topo = running.get("/api/v1/topology")
            assert topo["fragmentation"][-1]["free"] == 64
            _, body = running.get("/metrics")
            assert (
                b'topowatch_cluster_informer_errors_total{kind="Node",reason="unreachable"}' in body
            )
        finally:
            server.stop()
    finally:
        running.stop()


def test_dropped_watches_and_410_gone_lose_nothing(world: World, service: RunningService) -> None:
    """Every informer, with the log of what the API server served it: a dropped watch resumes
    where it was; after an outage that outlived the history, each informer is told 410 on its
    watch, lists again and watches from that list, and the model holds what changed meanwhile,
    deletions included."""
    cluster, store, server, start = world
    plurals = [w.plural for w in WATCHED]

    def pods_bound(name: str) -> bool:
        code, view = service.get(f"/api/v1/workloads/{NS}/{name}")
        return code == 200 and len(view["pods"]) == 2 and all(p["node"] for p in view["pods"])

    def since(mark: int, plural: str) -> list[Exchange]:
        return [e for e in server.exchanges(plural) if e.seq > mark]

    def until(mark: int, plural: str) -> list[Exchange]:
        return [e for e in server.exchanges(plural) if e.seq <= mark]

    short = cluster.submit("a", "short", 8, 2, "training-priority", now=start, runtime_s=1)
    cluster.step(start + 1)
    eventually(lambda: pods_bound(short), what="the short job running")

    # Dropped watches: each informer watches again from the newest resourceVersion it was
    # served, without listing, and is never told 410.
    dropped_at = server.exchanges()[-1].seq
    server.drop_watches()
    eventually(
        lambda: all(any(e.verb == "WATCH" for e in since(dropped_at, p)) for p in plurals),
        what="every informer watching again",
    )
    for plural in plurals:
        after = since(dropped_at, plural)
        assert [e.verb for e in after][:1] == ["WATCH"], plural
        assert after[0].query["resourceVersion"] == newest_rv_served(until(dropped_at, plural))
        assert not any(e.verb == "LIST" or served_410(e) for e in after), plural

    # An outage that outlives the history: meanwhile the short job ends, its pods are deleted
    # and 300 s later its Workload too, and another job starts.
    server.stop()
    stopped_at = server.exchanges()[-1].seq
    job = cluster.submit("a", "after-gone", 8, 2, "training-priority", now=start + 1)
    cluster.step(start + 400)
    assert store.get("workloads", NS, short) is None
    store.compact()
    compacted_at = store.resource_version
    server.start()

    eventually(
        lambda: all(len(since(stopped_at, p)) >= 3 for p in plurals),
        what="every informer back with three requests",
    )
    for plural in plurals:
        last_seen = newest_rv_served(until(stopped_at, plural))
        assert int(last_seen) < compacted_at, plural
        gone, relist, rewatch = since(stopped_at, plural)[:3]
        # Back, the informer watched from where it was; the server answered the stream with
        # an ERROR event carrying 410 Expired, as kube-apiserver does for a compacted version.
        assert (gone.verb, gone.query["resourceVersion"]) == ("WATCH", last_seen), plural
        assert gone.status == 200 and gone.events == (("ERROR", "410"),), plural
        # It listed again, whole and at the latest state...
        assert (relist.verb, relist.status, relist.continue_token) == ("LIST", 200, ""), plural
        assert "continue" not in relist.query and relist.query.get("resourceVersion", "") == ""
        assert int(relist.resource_version) >= compacted_at, plural
        # ...then watched from that list's resourceVersion, and was not told 410 again.
        assert rewatch.verb == "WATCH", plural
        assert rewatch.query["resourceVersion"] == relist.resource_version, plural
        assert not any(served_410(e) for e in since(stopped_at, plural)[1:]), plural

    # What changed during the outage is in the model, deletions included.
    eventually(lambda: pods_bound(job), what="the new job's pods after 410")
    eventually(
        lambda: service.get(f"/api/v1/workloads/{NS}/{short}")[0] == 404,
        what="the Workload deleted during the outage gone from the model",
    )
    eventually(
        lambda: service.get("/api/v1/topology")[1]["fragmentation"][-1]["free"] == 64 - 16,
        what="the GPUs of the pods deleted during the outage free in the model",
    )


@pytest.mark.parametrize("versions", [("v1beta1",), ()], ids=["old-kueue", "no-kueue"])
def test_kueue_versions_served(versions: tuple[str, ...]) -> None:
    start = time.time()
    store = ObjectStore()
    cluster = SimulatedCluster(store, scripted(), seed=3, start=start)
    cluster.bootstrap()
    job = cluster.submit("a", "old", 8, 2, "training-priority", ("required", L3), start)
    cluster.step(start + 1)
    server = FakeApiServer(store, bookmark_interval=0.2, kueue_versions=versions).start()
    running = RunningService(server.url)
    try:
        if versions:
            eventually(lambda: running.get("/readyz")[0] == 200, what="synced on v1beta1")
            _, view = running.get(f"/api/v1/workloads/{NS}/{job}")
            assert view["api_version"] == "kueue.x-k8s.io/v1beta1"
            assert sum(d["count"] for d in view["assignment"][0]["domains"]) == 2
            assert view["locality"]["topology"]["met"] is True
        else:
            eventually(
                lambda: any(
                    i["kind"] == "Node" and i["synced"]
                    for i in running.get("/readyz")[1]["informers"]
                ),
                what="core informers synced",
            )
            code, state = running.get("/readyz")
            assert code == 503
            waiting = {i["kind"] for i in state["informers"] if not i["synced"]}
            assert "Workload" in waiting and "Node" not in waiting
            # Pods arrive on their own informer: wait for them rather than for Nodes alone.
            eventually(
                lambda: running.get("/api/v1/topology")[1]["fragmentation"][-1]["free"] == 64 - 16,
                what="the job's pods counted without Kueue",
            )
    finally:
        running.stop()
        server.stop()


def test_per_workload_series_are_capped_and_the_overflow_counted(
    world: World,
) -> None:
    cluster, _, server, start = world
    jobs = [cluster.submit("a", f"j{i}", 8, 1, "training-priority", now=start) for i in range(3)]
    cluster.step(start + 1)
    running = RunningService(server.url, workload_cap=1)
    try:
        eventually(lambda: running.get("/readyz")[0] == 200)
        eventually(lambda: all(model_sees(running, NS, j, "admitted") for j in jobs))
        _, body = running.get("/metrics")
        text = body.decode()
        assert text.count("topowatch_workload_worst_pair_hops{") == 1
        assert "topowatch_cluster_workload_series_dropped 2" in text
    finally:
        running.stop()


def test_quota_recommendations_are_served_after_sampling(world: World) -> None:
    """An idle team holding all 64 GPUs of quota is told to lend or shrink it."""
    _, _, server, _ = world
    running = RunningService(server.url)
    try:
        eventually(lambda: running.get("/readyz")[0] == 200)
        assert running.get("/api/v1/quota/recommendations") == (200, [])  # nothing sampled yet
        assert running.service is not None
        running.service.sample_quota()
        code, recs = running.get("/api/v1/quota/recommendations")
        assert code == 200 and recs
        assert {r["cluster_queue"] for r in recs} == {"hyperpod-ns-a-clusterqueue"}
        assert all(r["recommended"] < r["current"] or r["kind"] == "lending_limit" for r in recs)
        _, body = running.get("/metrics")
        assert b"topowatch_quota_recommended_gpus{" in body
        assert promtool_lint(body) == ""
    finally:
        running.stop()


def test_no_quota_advice_before_an_hour_of_history(world: World) -> None:
    running = RunningService(world[2].url, quota_min_observed_s=3600)
    try:
        eventually(lambda: running.get("/readyz")[0] == 200)
        assert running.service is not None
        running.service.sample_quota()
        assert running.get("/api/v1/quota/recommendations") == (200, [])
    finally:
        running.stop()
