"""Informers against the simulated API server, through the official client and real HTTP.

The promise to the cluster service: the sink ends up holding exactly what the API server
holds, whatever happened on the way (a server down at start, dropped streams, 410 Gone,
errors), and the informers say how they are doing without ever crashing.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.cluster import informers as informers_module
from exporter.cluster.informers import WATCHED, InformerSet, InformerStatus, Watched
from exporter.sim.kubeapi.server import Exchange, FakeApiServer, ObjectStore
from exporter.sim.kubeapi.store import CORE_RESOURCES, KUEUE_RESOURCES
from tests.conftest import free_port
from tests.sim.test_sim_apiserver import pod, workload_v1beta2

PLURALS = {w.kind: w.plural for w in WATCHED}
FAST: dict[str, Any] = {"backoff_initial": 0.05, "backoff_max": 0.2, "watch_timeout_s": 5}


class Sink:
    """A thread-safe mirror of what the informers delivered, per kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self.replaced: dict[str, int] = {}
        self.applied: list[tuple[str, str, str]] = []

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.state[kind] = {_key(o): o for o in items}
            self.replaced[kind] = self.replaced.get(kind, 0) + 1

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        with self.lock:
            objects = self.state.setdefault(kind, {})
            if event_type == "DELETED":
                objects.pop(_key(obj), None)
            else:
                objects[_key(obj)] = obj
            self.applied.append((kind, event_type, obj["metadata"]["name"]))

    def versions(self, kind: str) -> dict[tuple[str, str], str]:
        with self.lock:
            return {
                k: o["metadata"]["resourceVersion"] for k, o in self.state.get(kind, {}).items()
            }


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def stored_versions(store: ObjectStore, kind: str) -> dict[tuple[str, str], str]:
    return {_key(o): o["metadata"]["resourceVersion"] for o in store.items(PLURALS[kind])}


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def status_of(informers: InformerSet, kind: str) -> InformerStatus:
    return next(s for s in informers.status() if s.kind == kind)


def running_threads(informers: InformerSet) -> list[str]:
    return [i.watched.kind for i in informers._informers if i._thread.is_alive()]


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """(kind, seconds) of every backoff pause an informer starts, in order; the pauses still
    happen (on the informers' stop event)."""
    pauses: list[tuple[str, float]] = []
    sleep = informers_module._Informer._sleep

    def recording(self: Any, seconds: float) -> None:
        pauses.append((self.watched.kind, seconds))
        sleep(self, seconds)

    monkeypatch.setattr(informers_module._Informer, "_sleep", recording)
    return pauses


def only(*kinds: str) -> list[Watched]:
    return [w for w in WATCHED if w.kind in kinds]


# ---- the protocol exchange, as the simulated API server logged it ----


def of_verb(exchanges: list[Exchange], verb: str) -> list[Exchange]:
    return [e for e in exchanges if e.verb == verb]


def served_410(exchange: Exchange) -> bool:
    """Whether the server answered 410: an HTTP 410 (a list whose continue token expired) or,
    on a watch, an ERROR event carrying a 410 Status, which is how kube-apiserver answers a
    watch from a resourceVersion older than its history (the stream itself is a 200)."""
    return exchange.status == 410 or ("ERROR", "410") in exchange.events


def newest_rv_served(exchanges: list[Exchange]) -> str:
    """The newest resourceVersion these exchanges gave their client: a complete list's, or
    the last event's (bookmarks included) of a watch after it. A reflector that lost its
    watch must resume from exactly this one."""
    rv = ""
    for e in exchanges:
        if e.verb == "LIST" and e.status == 200 and not e.continue_token:
            rv = e.resource_version
        elif e.verb == "WATCH":
            rv = next((v for t, v in reversed(e.events) if t != "ERROR"), rv)
    return rv


@pytest.fixture
def store() -> ObjectStore:
    store = ObjectStore()
    store.upsert("nodes", {"metadata": {"name": "n1", "labels": {"zone": "a"}}})
    for i in range(12):
        store.upsert("pods", pod(f"p{i:02d}", namespace=f"team-{i % 3}", node="n1"))
    store.upsert("workloads", workload_v1beta2())
    store.upsert("clusterqueues", {"metadata": {"name": "team-a-cq"}, "spec": {"cohortName": "c"}})
    return store


@pytest.fixture
def server(store: ObjectStore) -> Iterator[FakeApiServer]:
    with FakeApiServer(store, bookmark_interval=0.1) as srv:
        yield srv


@pytest.fixture
def informers(
    server: FakeApiServer,
) -> Iterator[Callable[..., tuple[InformerSet, Sink]]]:
    made: list[tuple[InformerSet, kc.ApiClient]] = []

    def make(
        watched: list[Watched] | tuple[Watched, ...] = WATCHED,
        url: str | None = None,
        **options: Any,
    ) -> tuple[InformerSet, Sink]:
        api = kc.ApiClient(kc.Configuration(host=url or server.url))
        sink = Sink()
        informer_set = InformerSet(api, sink, watched, **{**FAST, **options}).start()
        made.append((informer_set, api))
        return informer_set, sink

    yield make
    for informer_set, api in made:
        informer_set.stop()
        api.close()


def test_first_sync_mirrors_every_kind(
    store: ObjectStore, informers: Callable[..., tuple[InformerSet, Sink]]
) -> None:
    informer_set, sink = informers()
    assert informer_set.wait_synced(5)
    assert informer_set.synced()
    for kind in PLURALS:
        assert sink.versions(kind) == stored_versions(store, kind), kind
    first_pod = next(iter(sink.state["Pod"].values()))
    assert (first_pod["kind"], first_pod["apiVersion"]) == ("Pod", "v1")  # added to list items
    workload = sink.state["Workload"][("team-a", "job-1")]
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    statuses = {s.kind: s for s in informer_set.status()}
    assert statuses["Workload"].version == "v1beta2" and statuses["Pod"].version == "v1"
    assert all(s.synced and s.lists == 1 and not s.last_error for s in statuses.values())


def test_watch_delivers_changes_in_order(
    store: ObjectStore, informers: Callable[..., tuple[InformerSet, Sink]]
) -> None:
    informer_set, sink = informers(only("Pod", "Workload"))
    assert informer_set.wait_synced(5)
    store.upsert("pods", pod("new", namespace="team-9"))
    store.upsert("pods", pod("p00", namespace="team-0", node="n1", phase="done"))
    store.delete("pods", "team-1", "p01")
    store.delete("workloads", "team-a", "job-1")
    assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
    assert eventually(lambda: sink.state["Workload"] == {})
    assert [a for a in sink.applied if a[0] == "Pod"] == [
        ("Pod", "ADDED", "new"),
        ("Pod", "MODIFIED", "p00"),
        ("Pod", "DELETED", "p01"),
    ]
    assert status_of(informer_set, "Pod").events == 3


def test_lists_in_pages(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    informer_set, sink = informers(only("Pod"), page_size=5)
    assert informer_set.wait_synced(5)
    assert eventually(lambda: bool(of_verb(server.exchanges("pods"), "WATCH")))
    exchanges = server.exchanges("pods")
    pages = of_verb(exchanges, "LIST")
    assert [p.query.get("limit") for p in pages] == ["5", "5", "5"]
    assert all(p.status == 200 for p in pages)
    assert "continue" not in pages[0].query  # the first page starts the list...
    for before, page in itertools.pairwise(pages):
        assert before.continue_token  # ...each page but the last hands out a token...
        assert page.query["continue"] == before.continue_token  # ...which the next follows
    assert pages[-1].continue_token == ""
    # One consistent snapshot, and the watch starts where it stood.
    assert {p.resource_version for p in pages} == {pages[0].resource_version}
    first_watch = of_verb(exchanges, "WATCH")[0]
    assert first_watch.seq > pages[-1].seq
    assert first_watch.query["resourceVersion"] == pages[0].resource_version
    assert server.requests["LIST pods"] == 3  # 12 pods, 5 a page
    assert sink.versions("Pod") == stored_versions(store, "Pod")


def test_410_after_compaction_relists_and_reconciles_deletions(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    informer_set, sink = informers(only("Pod"))
    assert informer_set.wait_synced(5)
    assert eventually(lambda: server.open_watches == 1)
    port = server.port
    server.stop()  # the informer loses its watch and cannot get back
    store.delete("pods", "team-0", "p00")
    store.delete("pods", "team-1", "p01")
    store.upsert("pods", pod("while-away", namespace="team-0"))
    store.compact()  # ...and the history it would resume from is gone
    compacted_at = store.resource_version
    with FakeApiServer(store, port=port, bookmark_interval=0.1) as back:
        assert eventually(lambda: any(served_410(e) for e in back.exchanges("pods")))
        assert eventually(lambda: len(back.exchanges("pods")) >= 3)
        gone, relist, rewatch = back.exchanges("pods")[:3]
        last_seen = newest_rv_served(server.exchanges("pods"))  # by the first server
        assert int(last_seen) < compacted_at
        # The informer came back watching from the last resourceVersion it had seen, and
        # was told 410 Expired on the watch stream...
        assert (gone.verb, gone.query["resourceVersion"]) == ("WATCH", last_seen)
        assert gone.status == 200 and gone.events == (("ERROR", "410"),)
        # ...so it listed again, from the start and at the latest state...
        assert relist.verb == "LIST" and relist.status == 200
        assert "continue" not in relist.query and relist.query.get("resourceVersion", "") == ""
        assert int(relist.resource_version) >= compacted_at
        # ...and watched from the new list's resourceVersion, which the server could serve.
        assert rewatch.verb == "WATCH"
        assert rewatch.query["resourceVersion"] == relist.resource_version
        assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
        exchanges = back.exchanges("pods")
    assert [e.verb for e in exchanges].count("LIST") == back.requests["LIST pods"] == 1
    assert [served_410(e) for e in exchanges] == [True] + [False] * (len(exchanges) - 1)
    # The relist reconciled the gap: both deletions and the creation.
    assert ("team-0", "p00") not in sink.state["Pod"]
    assert ("team-1", "p01") not in sink.state["Pod"]
    assert ("team-0", "while-away") in sink.state["Pod"]
    assert sink.replaced["Pod"] == 2
    status = status_of(informer_set, "Pod")
    assert status.lists == 2 and status.relists_gone == 1 and status.errors["gone"] == 1


def test_a_list_outpaced_by_churn_finishes_unpaged() -> None:
    store = ObjectStore(history=2)  # continue tokens expire after a couple of changes
    for i in range(40):
        store.upsert("pods", pod(f"p{i:02d}"))
    stop_churn = threading.Event()

    def churn() -> None:
        step = 0
        while not stop_churn.is_set():
            store.upsert("pods", pod("busy", step=str(step)))
            step += 1
            time.sleep(0.001)

    churner = threading.Thread(target=churn)
    with FakeApiServer(store, bookmark_interval=0.1) as server:
        api = kc.ApiClient(kc.Configuration(host=server.url))
        sink = Sink()
        churner.start()
        informer_set = InformerSet(api, sink, only("Pod"), page_size=1, **FAST).start()
        try:
            assert informer_set.wait_synced(5)
            assert eventually(lambda: bool(of_verb(server.exchanges("pods"), "WATCH")))
            stop_churn.set()
            churner.join()
            assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
            exchanges = server.exchanges("pods")
            expired_continue = status_of(informer_set, "Pod").errors.get("expired_continue", 0)
        finally:
            stop_churn.set()
            informer_set.stop()
            api.close()
    first_watch = of_verb(exchanges, "WATCH")[0]
    lists = [e for e in of_verb(exchanges, "LIST") if e.seq < first_watch.seq]
    expired = [i for i, e in enumerate(lists) if served_410(e)]
    assert len(expired) == 1, "one continue token, and only one, should have expired"
    paged, gone, fallback = lists[: expired[0]], lists[expired[0]], lists[expired[0] + 1 :]
    # Paged, one item a page, each page following the token the one before handed out...
    assert paged and "continue" not in paged[0].query
    assert all(e.query.get("limit") == "1" and e.status == 200 for e in paged)
    assert all(e.continue_token for e in paged)
    for before, page in itertools.pairwise([*paged, gone]):
        assert page.query["continue"] == before.continue_token
    # ...until the token outlived the history: 410 Expired, offering a token for the rest...
    assert (gone.status, gone.reason, gone.query.get("limit")) == (410, "Expired", "1")
    assert gone.continue_token
    # ...which, like client-go's pager, the informer does not take: it lists again whole, in
    # one unpaged request, and watches from that list's resourceVersion.
    assert len(fallback) == 1
    (whole,) = fallback
    assert "continue" not in whole.query and whole.query.get("limit", "0") in ("", "0")
    assert whole.status == 200 and whole.continue_token == ""
    assert first_watch.query["resourceVersion"] == whole.resource_version
    assert expired_continue >= 1  # later relists may meet churn again


def test_dropped_watch_resumes_without_relisting_and_misses_nothing(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    informer_set, sink = informers(only("Pod", "Node"))
    assert informer_set.wait_synced(5)
    for round_ in range(3):
        assert eventually(lambda: server.open_watches == 2)
        server.drop_watches()
        store.upsert("pods", pod(f"during-drop-{round_}", namespace="team-0"))
        store.delete("pods", "team-2", f"p{round_ * 3 + 2:02d}")
        store.upsert("nodes", {"metadata": {"name": "n1", "labels": {"round": str(round_)}}})
    assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
    assert eventually(lambda: sink.versions("Node") == stored_versions(store, "Node"))
    assert server.requests["LIST pods"] == 1 and server.requests["LIST nodes"] == 1
    status = status_of(informer_set, "Pod")
    assert status.relists_gone == 0 and status.watch_restarts >= 3
    assert status.errors.get("dropped", 0) >= 1


def test_bookmarks_keep_the_informer_from_relisting(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    informer_set, sink = informers(only("Pod"))
    assert informer_set.wait_synced(5)
    assert eventually(lambda: bool(of_verb(server.exchanges("pods"), "WATCH")))
    (listed, watch) = server.exchanges("pods")[:2]
    assert (listed.verb, watch.verb) == ("LIST", "WATCH")
    assert watch.query["resourceVersion"] == listed.resource_version
    assert watch.query.get("allowWatchBookmarks") == "true"  # the informer asks for bookmarks
    for i in range(5):  # changes to other kinds move the global resourceVersion on
        store.upsert("nodes", {"metadata": {"name": f"other-{i}"}})
    newest = str(store.resource_version)
    assert int(newest) > int(listed.resource_version)

    def bookmarks_at_newest() -> int:
        return sum(
            w.events.count(("BOOKMARK", newest)) for w in of_verb(server.exchanges("pods"), "WATCH")
        )

    # Two: the stream wrote the first before it logged the second, so the informer has it.
    assert eventually(lambda: bookmarks_at_newest() >= 2)
    store.compact()  # nothing older than the bookmark can be watched from any more
    server.drop_watches()
    created = store.upsert("pods", pod("after-compaction"))
    assert eventually(lambda: ("team-a", "after-compaction") in sink.versions("Pod"))
    exchanges = server.exchanges("pods")
    watches = of_verb(exchanges, "WATCH")
    assert all(w.query.get("allowWatchBookmarks") == "true" for w in watches)
    first_bookmarked = next(i for i, w in enumerate(watches) if ("BOOKMARK", newest) in w.events)
    resumed = watches[first_bookmarked + 1 :]
    assert resumed, "the informer never watched again after the drop"
    # Every watch since resumed from the bookmark's resourceVersion, not the older list's...
    assert {w.query["resourceVersion"] for w in resumed} == {newest}
    assert not any(served_410(e) for e in exchanges)  # ...which the compaction left servable
    added = ("ADDED", created["metadata"]["resourceVersion"])
    assert any(added in w.events for w in resumed)
    assert status_of(informer_set, "Pod").relists_gone == 0
    assert server.requests["LIST pods"] == 1


def test_server_down_at_start_then_up(store: ObjectStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.cluster.informers")
    port = free_port()
    api = kc.ApiClient(kc.Configuration(host=f"http://127.0.0.1:{port}"))
    sink = Sink()
    informer_set = InformerSet(api, sink, only("Pod", "Workload"), **FAST).start()
    try:
        assert eventually(lambda: status_of(informer_set, "Pod").errors.get("unreachable", 0) > 1)
        assert not informer_set.synced()
        assert "127.0.0.1" in status_of(informer_set, "Pod").last_error
        with FakeApiServer(store, port=port):
            assert informer_set.wait_synced(5)
            assert sink.versions("Pod") == stored_versions(store, "Pod")
            assert eventually(lambda: status_of(informer_set, "Pod").last_error == "")
            # Read while the server is up: stopping it breaks the watch, which is logged too.
            pod_logs = [r for r in caplog.records if "informer Pod" in r.getMessage()]
        # Logged once when the condition began and once when it ended, not per retry.
        assert [r.levelno for r in pod_logs] == [logging.WARNING, logging.INFO]
        assert status_of(informer_set, "Pod").errors["unreachable"] > 1
    finally:
        informer_set.stop()
        api.close()


def test_server_errors_back_off_then_recover(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
    backoffs: list[tuple[str, float]],
) -> None:
    server.fail_next(3, 500)
    informer_set, sink = informers(only("Pod"), backoff_initial=0.1, backoff_max=5.0)
    assert informer_set.wait_synced(5)
    # Three failures, each followed by a pause that doubles: 0.1, 0.2, 0.4 s, jittered down to
    # no less than half.
    first_three = [seconds for _, seconds in backoffs[:3]]
    assert len(first_three) == 3
    for seconds, full in zip(first_three, (0.1, 0.2, 0.4), strict=True):
        assert full / 2 <= seconds <= full
    status = status_of(informer_set, "Pod")
    assert status.errors == {"http_500": 3}
    assert status.last_error == ""
    assert sink.versions("Pod") == stored_versions(store, "Pod")


def test_old_kueue_is_read_at_v1beta1(
    store: ObjectStore, informers: Callable[..., tuple[InformerSet, Sink]]
) -> None:
    with FakeApiServer(store, kueue_versions=("v1beta1",)) as old_kueue:
        informer_set, sink = informers(only("Workload", "ClusterQueue"), url=old_kueue.url)
        assert informer_set.wait_synced(5)
        assert status_of(informer_set, "Workload").version == "v1beta1"
        workload = sink.state["Workload"][("team-a", "job-1")]
        assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        assignment = workload["status"]["admission"]["podSetAssignments"][0]
        assert [d["count"] for d in assignment["topologyAssignment"]["domains"]] == [7, 3]
        assert sink.state["ClusterQueue"][("", "team-a-cq")]["spec"]["cohort"] == "c"
        store.upsert("workloads", {**workload_v1beta2("job-2")})
        assert eventually(lambda: ("team-a", "job-2") in sink.state["Workload"])
        assert "domains" in str(sink.state["Workload"][("team-a", "job-2")])


def test_an_absent_optional_crd_counts_as_synced_and_says_so(
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    """HyperPod's training operator may not be installed: its kind must not hold readiness
    (nor the preemption verdicts that wait for every required kind's first list)."""
    bare = ObjectStore(resources=CORE_RESOURCES + KUEUE_RESOURCES)
    bare.upsert("nodes", {"metadata": {"name": "n1"}})
    with FakeApiServer(bare) as server:
        informer_set, sink = informers(url=server.url)
        assert informer_set.wait_synced(10)
        status = status_of(informer_set, "HyperPodPyTorchJob")
        assert status.absent and status.version is None
        assert status.errors["not_served"] >= 1
        assert "HyperPodPyTorchJob" not in informer_set.required_kinds
        assert "HyperPodPyTorchJob" not in sink.state  # nothing listed, nothing invented
        assert all(not s.absent for s in informer_set.status() if s.kind != "HyperPodPyTorchJob")


def test_without_kueue_core_informers_sync_and_kueue_ones_say_why(
    store: ObjectStore,
    informers: Callable[..., tuple[InformerSet, Sink]],
    backoffs: list[tuple[str, float]],
) -> None:
    core = ("Node", "Pod", "Event", "HyperPodPyTorchJob")  # the store serves HyperPod's CRD
    with FakeApiServer(store, kueue_versions=()) as no_kueue:
        # Long watches: were stop() not to cut them, they would hold their threads for minutes.
        informer_set, sink = informers(url=no_kueue.url, watch_timeout_s=300)
        assert eventually(
            lambda: all(
                s.synced if s.kind in core else s.errors.get("not_served", 0) >= 1
                for s in informer_set.status()
            ),
            timeout=10,
        )
        assert not informer_set.synced()
        statuses = {s.kind: s for s in informer_set.status()}
        for kind, status in statuses.items():
            if kind in core:
                assert status.synced, kind
            else:
                assert not status.synced and status.version is None, kind
                assert "not served" in status.last_error
                assert status.errors["not_served"] >= 1
        assert sink.versions("Pod") == stored_versions(store, "Pod")
        discovery_calls = no_kueue.requests["DISCOVERY /apis/kueue.x-k8s.io"]
        kueue_pauses = [seconds for kind, seconds in backoffs if kind not in core]
        # Retrying discovery must back off, not spin: after its first try, each of the 7 Kueue
        # informers asks again only after a pause of at least half of backoff_initial.
        assert discovery_calls <= 7 + len(kueue_pauses), "retrying discovery must back off"
        assert all(seconds >= FAST["backoff_initial"] / 2 for seconds in kueue_pauses)
        informer_set.stop(timeout=30)
        # Prompt: no thread is left in a 300 s watch or a backoff pause.
        assert running_threads(informer_set) == [] and informer_set.stopped
        synced: list[bool] = []
        waiter = threading.Thread(
            target=lambda: synced.append(informer_set.wait_synced(60)), daemon=True
        )
        waiter.start()
        waiter.join(10)
        assert synced == [False]  # answered at once once stopped, not after the 60 s allowed


def test_a_failing_sink_is_counted_and_does_not_stop_the_informer(
    store: ObjectStore,
    server: FakeApiServer,
) -> None:
    class Fussy(Sink):
        def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
            if obj["metadata"]["name"].startswith("bad"):
                raise RuntimeError("cannot digest this")
            super().apply(kind, event_type, obj)

    api = kc.ApiClient(kc.Configuration(host=server.url))
    sink = Fussy()
    informer_set = InformerSet(api, sink, only("Pod"), **FAST).start()
    try:
        assert informer_set.wait_synced(5)
        store.upsert("pods", pod("bad-1"))
        store.upsert("pods", pod("bad-2"))
        store.upsert("pods", pod("good"))
        assert eventually(lambda: ("team-a", "good") in sink.versions("Pod"))
        status = status_of(informer_set, "Pod")
        assert status.errors == {"sink": 2} and status.events == 3
    finally:
        informer_set.stop()
        api.close()


def test_stop_is_prompt_with_open_watches(
    server: FakeApiServer, informers: Callable[..., tuple[InformerSet, Sink]]
) -> None:
    informer_set, _ = informers(watch_timeout_s=300)
    assert informer_set.wait_synced(5)
    assert eventually(lambda: server.open_watches == len(WATCHED))
    informer_set.stop(timeout=30)
    # Every thread ended, though each was blocked reading a watch that could last 300 s more.
    assert running_threads(informer_set) == []
    assert eventually(lambda: server.open_watches == 0)
