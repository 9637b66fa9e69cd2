"""Informers against the simulated API server, through the official client and real HTTP.

The promise to the cluster service: the sink ends up holding exactly what the API server
holds, whatever happened on the way (a server down at start, dropped streams, 410 Gone,
errors), and the informers say how they are doing without ever crashing.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.cluster.informers import WATCHED, InformerSet, InformerStatus, Watched
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.test_sim_apiserver import pod, workload_v1beta2

PLURALS = {w.kind: w.plural for w in WATCHED}
FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "watch_timeout_s": 5}


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


def only(*kinds: str) -> list[Watched]:
    return [w for w in WATCHED if w.kind in kinds]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
    assert server.requests["LIST pods"] == 3  # 12 pods, 5 a page
    assert sink.versions("Pod") == stored_versions(store, "Pod")


def test_410_after_compaction_relists_and_reconciles_deletions(
    store: ObjectStore,
    server: FakeApiServer,
    informers: Callable[..., tuple[InformerSet, Sink]],
) -> None:
    informer_set, sink = informers(only("Pod"))
    assert informer_set.wait_synced(5)
    port = server.port
    server.stop()  # the informer loses its watch and cannot get back
    store.delete("pods", "team-0", "p00")
    store.delete("pods", "team-1", "p01")
    store.upsert("pods", pod("while-away", namespace="team-0"))
    store.compact()  # ...and the history it would resume from is gone
    with FakeApiServer(store, port=port, bookmark_interval=0.1) as back:
        assert eventually(lambda: status_of(informer_set, "Pod").relists_gone == 1)
        assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
        assert back.requests["LIST pods"] == 1
    assert sink.replaced["Pod"] == 2
    status = status_of(informer_set, "Pod")
    assert status.lists == 2 and status.errors["gone"] == 1


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
            assert status_of(informer_set, "Pod").errors["expired_continue"] >= 1
            stop_churn.set()
            churner.join()
            assert eventually(lambda: sink.versions("Pod") == stored_versions(store, "Pod"))
        finally:
            stop_churn.set()
            informer_set.stop()
            api.close()


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
    for i in range(5):  # changes to other kinds move the global resourceVersion on
        store.upsert("nodes", {"metadata": {"name": f"other-{i}"}})
    time.sleep(0.3)  # a few bookmark intervals
    store.compact()
    server.drop_watches()
    store.upsert("pods", pod("after-compaction"))
    assert eventually(lambda: ("team-a", "after-compaction") in sink.versions("Pod"))
    assert status_of(informer_set, "Pod").relists_gone == 0  # resumed from the bookmark's RV
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
) -> None:
    server.fail_next(3, 500)
    started = time.monotonic()
    informer_set, sink = informers(only("Pod"), backoff_initial=0.1, backoff_max=5.0)
    assert informer_set.wait_synced(5)
    # Three failures: waits of at least 0.05 + 0.1 + 0.2 s (jittered halves of 0.1, 0.2, 0.4).
    assert time.monotonic() - started >= 0.35
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


def test_without_kueue_core_informers_sync_and_kueue_ones_say_why(
    store: ObjectStore, informers: Callable[..., tuple[InformerSet, Sink]]
) -> None:
    with FakeApiServer(store, kueue_versions=()) as no_kueue:
        informer_set, sink = informers(url=no_kueue.url)
        assert not informer_set.wait_synced(1.0)
        statuses = {s.kind: s for s in informer_set.status()}
        for kind, status in statuses.items():
            if kind in ("Node", "Pod", "Event"):
                assert status.synced, kind
            else:
                assert not status.synced and status.version is None, kind
                assert "not served" in status.last_error
                assert status.errors["not_served"] >= 1
        assert sink.versions("Pod") == stored_versions(store, "Pod")
        discovery_calls = no_kueue.requests["DISCOVERY /apis/kueue.x-k8s.io"]
        assert discovery_calls < 7 * 12, "retrying discovery must back off, not spin"
        started = time.monotonic()
        informer_set.stop()
        assert not informer_set.wait_synced(5) and informer_set.stopped
        assert time.monotonic() - started < 2


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
    started = time.monotonic()
    informer_set.stop()
    assert time.monotonic() - started < 2
    assert eventually(lambda: server.open_watches == 0)
