"""The simulated kube-apiserver, driven by the official `kubernetes` client over real HTTP.

What matters to its users is that a client written for a real API server sees the documented
semantics: consistent paged lists, watches that resume exactly, bookmarks, 410 Gone, selectors,
conflicts, and Kueue objects readable and writable at both served versions.
"""

from __future__ import annotations

import calendar
import inspect
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import jsonschema
import kubernetes.client as kc
import pytest
import urllib3
import yaml

from exporter.sim.kubeapi import server as server_module
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sim.kueue.convert import convert, domains_from_slices
from tests.conftest import reference

KUEUE = "kueue.x-k8s.io"
T0 = float(calendar.timegm((2026, 11, 22, 10, 0, 0)))


def pod(name: str, namespace: str = "team-a", node: str = "", **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def workload_v1beta2(name: str = "job-1", namespace: str = "team-a") -> dict[str, Any]:
    """A Workload admitted by TAS, with the slices of Kueue's documented example."""
    example = json.loads(
        reference("kueue/examples/03_tas_topologyAssignment_v1beta2_slices.json").read_text()
    )["examples"][0]
    return {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": "team-a-queue",
            "priorityClassRef": {"group": KUEUE, "kind": "WorkloadPriorityClass", "name": "high"},
            "podSets": [{"name": "main", "count": 10, "template": {"spec": {"containers": []}}}],
        },
        "status": {
            "accumulatedPastExecutionTimeSeconds": 42,
            "admission": {
                "clusterQueue": "team-a-cq",
                "podSetAssignments": [{"name": "main", "count": 10, "topologyAssignment": example}],
            },
        },
    }


@pytest.fixture
def store() -> ObjectStore:
    return ObjectStore(clock=lambda: T0)


class ServerClock:
    """The simulated API server's `time` module, with a `monotonic()` the test sets: watch
    deadlines (timeoutSeconds) pass when the test says so, never on a slow machine's own."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def server_clock(monkeypatch: pytest.MonkeyPatch) -> ServerClock:
    clock = ServerClock()
    monkeypatch.setattr(server_module, "time", clock)
    return clock


@pytest.fixture
def server(store: ObjectStore) -> Iterator[FakeApiServer]:
    with FakeApiServer(store, bookmark_interval=0.1) as srv:
        yield srv


@pytest.fixture
def api(server: FakeApiServer) -> Iterator[kc.ApiClient]:
    with kc.ApiClient(kc.Configuration(host=server.url)) as client:
        yield client


def watch(response: Any, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Read `count` events (or until the stream ends) from a raw watch response."""
    events: list[dict[str, Any]] = []
    pending = b""
    deadline = time.monotonic() + timeout
    try:
        for chunk in response.stream(65536):
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            events.extend(json.loads(p) for p in parts if p.strip())
            if len(events) >= count or time.monotonic() > deadline:
                break
    finally:
        response.close()
    return events


def names(items: list[Any]) -> list[str]:
    return [i["metadata"]["name"] if isinstance(i, dict) else i.metadata.name for i in items]


# ---- the store ----


def test_store_fills_server_fields_and_keeps_identity_across_updates(store: ObjectStore) -> None:
    created = store.upsert("pods", pod("p1"))
    meta = created["metadata"]
    assert meta["creationTimestamp"] == "2026-11-22T10:00:00Z"
    assert meta["generation"] == 1 and len(meta["uid"]) == 36
    relabelled = store.upsert("pods", pod("p1", team="x"))
    assert relabelled["metadata"]["uid"] == meta["uid"]
    assert relabelled["metadata"]["creationTimestamp"] == meta["creationTimestamp"]
    assert int(relabelled["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert relabelled["metadata"]["generation"] == 1  # labels are not spec
    respec = store.upsert("pods", {**pod("p1"), "spec": {"containers": [], "nodeName": "n1"}})
    assert respec["metadata"]["generation"] == 2
    assert store.resource_version == int(respec["metadata"]["resourceVersion"])


def test_store_hands_out_copies(store: ObjectStore) -> None:
    given = pod("p1", app="a")
    store.upsert("pods", given)
    given["metadata"]["labels"]["app"] = "changed by the caller"
    copy = store.get("pods", "team-a", "p1")
    assert copy is not None and copy["metadata"]["labels"] == {"app": "a"}
    copy["metadata"]["labels"]["app"] = "changed again"
    assert store.items("pods")[0]["metadata"]["labels"] == {"app": "a"}


def test_store_delete_and_unknown_input(store: ObjectStore) -> None:
    store.upsert("pods", pod("p1"))
    deleted = store.delete("pods", "team-a", "p1")
    assert deleted is not None and deleted["metadata"]["name"] == "p1"
    assert store.get("pods", "team-a", "p1") is None
    assert store.delete("pods", "team-a", "p1") is None
    with pytest.raises(ValueError, match=r"metadata\.name"):
        store.upsert("pods", {"metadata": {}})
    with pytest.raises(ValueError, match="unknown resource"):
        store.upsert("deployments", pod("d"))
    before = store.resource_version
    with pytest.raises(ValueError, match="plain JSON"):
        store.upsert("pods", {**pod("p2"), "spec": {"started": object()}})
    with pytest.raises(ValueError, match="plain JSON"):
        store.upsert("pods", {**pod("p2"), "spec": {"ratio": float("nan")}})
    assert store.resource_version == before and store.get("pods", "team-a", "p2") is None


def test_store_keeps_kueue_objects_in_the_storage_version(store: ObjectStore) -> None:
    old = convert(workload_v1beta2(), "v1beta1")
    stored = store.upsert("workloads", old)
    assert stored["apiVersion"] == f"{KUEUE}/v1beta2"
    assert stored["spec"]["priorityClassRef"]["name"] == "high"
    assert "slices" in stored["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]


# ---- lists ----


def test_paged_list_is_a_consistent_snapshot(store: ObjectStore, api: kc.ApiClient) -> None:
    for i in range(25):
        store.upsert("pods", pod(f"p{i:02d}", app="old"))
    core = kc.CoreV1Api(api)
    first = core.list_pod_for_all_namespaces(limit=10)
    assert first.metadata.remaining_item_count == 15
    snapshot_rv = first.metadata.resource_version
    # Changes after the first page must not show in the later ones.
    store.upsert("pods", pod("p99", app="new"))
    store.upsert("pods", pod("p20", app="new"))
    store.delete("pods", "team-a", "p21")
    seen = names(first.items)
    token = first.metadata._continue
    labels = {}
    while token:
        page = core.list_pod_for_all_namespaces(limit=10, _continue=token)
        assert page.metadata.resource_version == snapshot_rv
        seen += names(page.items)
        labels.update({p.metadata.name: p.metadata.labels["app"] for p in page.items})
        token = page.metadata._continue
    assert seen == [f"p{i:02d}" for i in range(25)]
    assert labels["p20"] == "old"
    # A fresh list sees the present.
    assert "p99" in names(core.list_pod_for_all_namespaces().items)


def test_continue_token_after_compaction_is_expired(store: ObjectStore, api: kc.ApiClient) -> None:
    for i in range(5):
        store.upsert("pods", pod(f"p{i}"))
    core = kc.CoreV1Api(api)
    first = core.list_pod_for_all_namespaces(limit=2)
    store.upsert("pods", pod("p9"))
    store.compact()
    with pytest.raises(kc.ApiException) as caught:
        core.list_pod_for_all_namespaces(limit=2, _continue=first.metadata._continue)
    status = json.loads(caught.value.body)
    assert caught.value.status == 410 and status["reason"] == "Expired"
    # The Status offers a token for an inconsistent continuation, as the real server does.
    rest = core.list_pod_for_all_namespaces(_continue=status["metadata"]["continue"])
    assert names(rest.items) == ["p2", "p3", "p4", "p9"]


def test_list_parameters_are_validated(store: ObjectStore, api: kc.ApiClient) -> None:
    store.upsert("pods", pod("p1"))
    store.upsert("pods", pod("p2"))
    core = kc.CoreV1Api(api)
    assert core.list_pod_for_all_namespaces(limit=0).metadata._continue is None  # no limit
    page = core.list_pod_for_all_namespaces(limit=1)
    with pytest.raises(kc.ApiException) as both:
        core.list_pod_for_all_namespaces(
            limit=1, _continue=page.metadata._continue, resource_version="5"
        )
    assert both.value.status == 400
    with pytest.raises(kc.ApiException) as bogus:
        core.list_pod_for_all_namespaces(limit=1, _continue="not-a-token")
    assert bogus.value.status == 400
    raw = api.call_api("GET", f"{api.configuration.host}/api/v1/pods?limit=ten")
    assert raw.status == 400


def test_namespaced_list_and_get(store: ObjectStore, api: kc.ApiClient) -> None:
    store.upsert("pods", pod("a", namespace="team-a"))
    store.upsert("pods", pod("b", namespace="team-b"))
    store.upsert("pods", pod("c", namespace="team-a-long"))
    core = kc.CoreV1Api(api)
    assert names(core.list_namespaced_pod("team-a").items) == ["a"]
    assert core.read_namespaced_pod("b", "team-b").metadata.namespace == "team-b"
    with pytest.raises(kc.ApiException) as missing:
        core.read_namespaced_pod("b", "team-a")
    body = json.loads(missing.value.body)
    assert missing.value.status == 404
    assert (body["kind"], body["reason"], body["details"]["name"]) == ("Status", "NotFound", "b")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=train", ["p1", "p2"]),
        ("app==train,tier!=gold", ["p2"]),
        ("app in (train, serve)", ["p1", "p2", "p3"]),
        ("app notin (train)", ["p3", "p4"]),
        ("tier", ["p1"]),
        ("!tier", ["p2", "p3", "p4"]),
        ("size>3", ["p3"]),
    ],
)
def test_label_selectors(
    store: ObjectStore, api: kc.ApiClient, selector: str, expected: list[str]
) -> None:
    store.upsert("pods", pod("p1", app="train", tier="gold"))
    store.upsert("pods", pod("p2", app="train"))
    store.upsert("pods", pod("p3", app="serve", size="4"))
    store.upsert("pods", pod("p4", size="2"))
    found = kc.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=selector)
    assert names(found.items) == expected


def test_field_selectors(store: ObjectStore, api: kc.ApiClient) -> None:
    store.upsert("pods", pod("p1", node="n1"))
    store.upsert("pods", pod("p2", node="n2"))
    store.upsert("pods", pod("pending"))
    store.upsert(
        "events",
        {
            "metadata": {"name": "e1", "namespace": "team-a"},
            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "team-a"},
            "reason": "Preempted",
        },
    )
    core = kc.CoreV1Api(api)
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert names(on_n1.items) == ["p1"]
    unscheduled = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=")
    assert names(unscheduled.items) == ["pending"]
    not_p1 = core.list_namespaced_pod("team-a", field_selector="metadata.name!=p1")
    assert names(not_p1.items) == ["p2", "pending"]
    events = core.list_event_for_all_namespaces(
        field_selector="involvedObject.kind=Pod,involvedObject.name=p1"
    )
    assert names(events.items) == ["e1"]


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("label_selector", "app in (a"),
        ("label_selector", "app===b"),
        ("label_selector", "bad key!=1"),
        ("field_selector", "spec.unknownField=x"),
        ("field_selector", "nonsense"),
    ],
)
def test_bad_selectors_are_bad_requests(api: kc.ApiClient, param: str, value: str) -> None:
    with pytest.raises(kc.ApiException) as caught:
        kc.CoreV1Api(api).list_pod_for_all_namespaces(**{param: value})
    assert caught.value.status == 400
    assert json.loads(caught.value.body)["reason"] == "BadRequest"


def test_fifty_thousand_pods_in_pages_of_500(
    store: ObjectStore, api: kc.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50_000):
        store.upsert("pods", pod(f"p{i:05d}", namespace=f"ns-{i % 50}", node=f"n{i % 500}"))
    examined: list[int] = []  # per page: how many stored pods the store looked at
    list_page = store.list_page
    signature = inspect.signature(list_page)

    def counting(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        match: Callable[[Any], bool] = bound.arguments["match"]
        looked = 0

        def counted(entry: Any) -> bool:
            nonlocal looked
            looked += 1
            return match(entry)

        bound.arguments["match"] = counted
        try:
            return list_page(*bound.args, **bound.kwargs)
        finally:
            examined.append(looked)

    monkeypatch.setattr(store, "list_page", counting)
    core = kc.CoreV1Api(api)
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        raw = core.list_pod_for_all_namespaces(limit=500, _continue=token, _preload_content=False)
        page = json.loads(raw.data)
        seen += names(page["items"])
        pages += 1
        token = page["metadata"].get("continue")
        if not token:
            break
    assert pages == 100 and len(seen) == len(set(seen)) == 50_000
    # Fast because each page resumes at its continue key and looks at its own 500 pods only,
    # rather than scanning from the start: linear in the list, whatever the number of pages.
    assert examined == [500] * 100


# ---- watches ----


def test_watch_from_a_resource_version_sees_exactly_the_later_changes(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("pods", pod("before"))
    since = store.resource_version
    store.upsert("pods", pod("p1"))
    store.upsert("pods", pod("p1", app="x"))
    store.upsert("nodes", {"metadata": {"name": "n1"}})  # another resource: not in this watch
    store.delete("pods", "team-a", "p1")
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True, resource_version=str(since), timeout_seconds=1, _preload_content=False
    )
    events = watch(response, count=3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "p1"),
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > since
    assert events[0]["object"]["kind"] == "Pod"


def test_watch_streams_live_changes_to_the_official_watch_helper(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    from kubernetes import watch as kwatch

    rv = str(store.resource_version)
    seen: list[tuple[str, str]] = []

    def consume() -> None:
        w = kwatch.Watch()
        for event in w.stream(
            kc.CoreV1Api(api).list_namespaced_pod, "team-a", resource_version=rv, timeout_seconds=5
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 2:
                w.stop()

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(0.2)
    store.upsert("pods", pod("live"))
    store.upsert("pods", pod("elsewhere", namespace="team-b"))
    store.delete("pods", "team-a", "live")
    reader.join(5)
    assert seen == [("ADDED", "live"), ("DELETED", "live")]


def test_watch_without_resource_version_starts_with_the_current_state(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("pods", pod("a"))
    store.upsert("pods", pod("b"))
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True, timeout_seconds=1, _preload_content=False
    )
    events = watch(response, count=2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


def test_streaming_list_ends_its_initial_events_with_a_marked_bookmark(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("pods", pod("a"))
    store.upsert("pods", pod("b"))
    snapshot_rv = store.resource_version
    core = kc.CoreV1Api(api)
    response = core.list_pod_for_all_namespaces(
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=2,
        _preload_content=False,
    )
    events = watch(response, count=3)
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    marker = events[2]["object"]["metadata"]
    assert marker["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert marker["resourceVersion"] == str(snapshot_rv)
    with pytest.raises(kc.ApiException) as invalid:
        core.list_pod_for_all_namespaces(watch=True, send_initial_events=True)
    assert invalid.value.status == 422


def test_bookmarks_arrive_and_carry_the_newest_resource_version(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("pods", pod("p1"))
    since = store.resource_version
    for i in range(3):
        store.upsert("nodes", {"metadata": {"name": f"n{i}"}})
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True,
        resource_version=str(since),
        allow_watch_bookmarks=True,
        timeout_seconds=2,
        _preload_content=False,
    )
    events = watch(response, count=2)
    assert {e["type"] for e in events} == {"BOOKMARK"}
    bookmark = events[0]["object"]
    assert bookmark["kind"] == "Pod" and bookmark["apiVersion"] == "v1"
    assert int(bookmark["metadata"]["resourceVersion"]) == store.resource_version > since


def test_watch_from_a_compacted_version_gets_410_expired(
    store: ObjectStore, api: kc.ApiClient, server_clock: ServerClock
) -> None:
    store.upsert("pods", pod("p1"))
    old = store.resource_version
    store.upsert("pods", pod("p2"))
    store.compact()
    # The server's clock stands still: a stream left open after the error would never reach
    # its timeoutSeconds, and reading it would fail on the client's 30 s read timeout.
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True,
        resource_version=str(old),
        timeout_seconds=30,
        _preload_content=False,
        _request_timeout=(10, 30),
    )
    assert response.status == 200  # as kube-apiserver: the error travels inside the stream
    events = watch(response, count=10)  # returns with fewer only when the stream has ended
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    # The newest version is still fine to watch from.
    fresh = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True,
        resource_version=str(store.resource_version),
        timeout_seconds=1,
        _preload_content=False,
        _request_timeout=(10, 30),
    )
    server_clock.now += 1  # its timeoutSeconds pass
    assert watch(fresh, count=1) == []


def test_bounded_history_expires_old_versions() -> None:
    store = ObjectStore(history=4)
    store.upsert("pods", pod("p0"))
    old = store.resource_version
    for i in range(20):
        store.upsert("pods", pod(f"p{i + 1}"))
    with FakeApiServer(store) as server, kc.ApiClient(kc.Configuration(host=server.url)) as api:
        response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
            watch=True, resource_version=str(old), timeout_seconds=1, _preload_content=False
        )
        assert watch(response, count=1)[0]["object"]["code"] == 410


def test_watch_timeout_ends_the_stream_cleanly(
    store: ObjectStore,
    server: FakeApiServer,
    api: kc.ApiClient,
    server_clock: ServerClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polls = threading.Semaphore(0)  # released each time the watch loop waits for events
    next_events = store.next_events

    def counting(*args: Any, **kwargs: Any) -> Any:
        polls.release()
        return next_events(*args, **kwargs)

    monkeypatch.setattr(store, "next_events", counting)
    started = server_clock.now
    response = kc.CoreV1Api(api).list_node(
        watch=True,
        resource_version="1",
        timeout_seconds=1,
        _preload_content=False,
        _request_timeout=(10, 30),
    )
    for now in (started, started + 0.9):  # not over before its timeoutSeconds...
        server_clock.now = now
        # Two more waits: the second comes after a look at the clock as it now stands.
        assert polls.acquire(timeout=10) and polls.acquire(timeout=10)
        assert server.open_watches == 1
    server_clock.now = started + 1.0  # ...and over once they have passed
    assert watch(response, count=1) == []  # a clean end of the chunked body, no error


def test_watch_with_selector_sees_objects_enter_and_leave(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("pods", pod("p1", app="web"))
    since = store.resource_version
    store.upsert("pods", pod("p1", app="train"))  # enters the selection
    store.upsert("pods", pod("p1", app="train", step="2"))  # stays in it
    store.upsert("pods", pod("p1", app="web"))  # leaves it
    store.upsert("pods", pod("p2", app="web"))  # never in it
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True,
        resource_version=str(since),
        label_selector="app=train",
        timeout_seconds=1,
        _preload_content=False,
    )
    events = watch(response, count=3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[2]["object"]["metadata"]["labels"] == {"app": "web"}


def test_drop_watches_cuts_streams_abruptly(
    store: ObjectStore, server: FakeApiServer, api: kc.ApiClient
) -> None:
    response = kc.CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True,
        resource_version=str(store.resource_version),
        timeout_seconds=30,
        _preload_content=False,
    )
    deadline = time.monotonic() + 5
    while server.open_watches == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.drop_watches()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in response.stream(1024):
            pass


# ---- writes ----


def test_create_update_conflict_and_delete(api: kc.ApiClient, store: ObjectStore) -> None:
    core = kc.CoreV1Api(api)
    created = core.create_namespaced_pod("team-a", pod("p1"))
    assert created.metadata.uid and created.metadata.resource_version
    with pytest.raises(kc.ApiException) as exists:
        core.create_namespaced_pod("team-a", pod("p1"))
    assert exists.value.status == 409
    assert json.loads(exists.value.body)["reason"] == "AlreadyExists"
    created.metadata.labels = {"app": "x"}
    updated = core.replace_namespaced_pod("p1", "team-a", created)
    assert updated.metadata.labels == {"app": "x"}
    with pytest.raises(kc.ApiException) as stale:
        core.replace_namespaced_pod("p1", "team-a", created)  # the old resourceVersion
    assert stale.value.status == 409
    assert json.loads(stale.value.body)["reason"] == "Conflict"
    core.delete_namespaced_pod("p1", "team-a")
    assert store.get("pods", "team-a", "p1") is None
    with pytest.raises(kc.ApiException) as gone:
        core.delete_namespaced_pod("p1", "team-a")
    assert gone.value.status == 404


def test_invalid_writes_are_refused_with_status_bodies(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    store.upsert("nodes", {"metadata": {"name": "n1"}})
    host = api.configuration.host
    url = f"{host}/api/v1/nodes/n1"
    json_type = {"Content-Type": "application/json"}
    http = urllib3.PoolManager()  # raw bodies: the client would re-encode a string as JSON
    refused = {
        "not JSON": http.request("PUT", url, body=b"{nope", headers=json_type),
        "NaN": http.request(
            "PUT", url, body=b'{"metadata": {"name": "n1"}, "x": NaN}', headers=json_type
        ),
        "other name": http.request(
            "PUT", url, body=b'{"metadata": {"name": "n2"}}', headers=json_type
        ),
        "apply patch": http.request(
            "PATCH", url, body=b"{}", headers={"Content-Type": "application/apply-patch+yaml"}
        ),
        "create everywhere": http.request(
            "POST", f"{host}/api/v1/pods", body=b"{}", headers=json_type
        ),
    }
    codes = {}
    for what, response in refused.items():
        body = json.loads(response.data)
        assert body["kind"] == "Status" and body["status"] == "Failure", what
        codes[what] = response.status
    assert codes == {
        "not JSON": 400,
        "NaN": 422,
        "other name": 400,
        "apply patch": 415,
        "create everywhere": 405,
    }
    assert store.get("nodes", "", "n1") is not None


def test_generate_name_and_status_subresource(api: kc.ApiClient) -> None:
    core = kc.CoreV1Api(api)
    body = pod("")
    body["metadata"] = {"generateName": "trainer-", "namespace": "team-a"}
    body["status"] = {"phase": "Running"}
    created = core.create_namespaced_pod("team-a", body)
    name = created.metadata.name
    assert name.startswith("trainer-") and len(name) == len("trainer-") + 5
    assert created.status is None or created.status.phase is None  # status is not settable here
    created.status = kc.V1PodStatus(phase="Running")
    after = core.replace_namespaced_pod_status(name, "team-a", created)
    assert after.status.phase == "Running"
    created.metadata.resource_version = after.metadata.resource_version
    created.status = kc.V1PodStatus(phase="Failed")
    created.metadata.labels = {"changed": "yes"}
    again = core.replace_namespaced_pod(name, "team-a", created)
    assert again.status.phase == "Running" and again.metadata.labels == {"changed": "yes"}


def test_patching_node_labels_and_workloads(store: ObjectStore, api: kc.ApiClient) -> None:
    store.upsert("nodes", {"metadata": {"name": "n1", "labels": {"keep": "1", "drop": "1"}}})
    patched = kc.CoreV1Api(api).patch_node(
        "n1", {"metadata": {"labels": {"drop": None, "new": "2"}}}
    )
    assert patched.metadata.labels == {"keep": "1", "new": "2"}
    json_patched = kc.CoreV1Api(api).patch_node(
        "n1", [{"op": "add", "path": "/metadata/labels/topowatch.io~1remediation", "value": "off"}]
    )
    assert json_patched.metadata.labels["topowatch.io/remediation"] == "off"
    store.upsert("workloads", workload_v1beta2())
    custom = kc.CustomObjectsApi(api)
    result = custom.patch_namespaced_custom_object(
        KUEUE, "v1beta1", "team-a", "workloads", "job-1", {"spec": {"active": False}}
    )
    assert result["apiVersion"] == f"{KUEUE}/v1beta1" and result["spec"]["active"] is False
    stored = store.get("workloads", "team-a", "job-1")
    assert stored is not None and stored["spec"]["active"] is False
    assert stored["spec"]["priorityClassRef"]["name"] == "high"  # survived the v1beta1 trip


def test_finalizers_defer_deletion(store: ObjectStore, api: kc.ApiClient) -> None:
    store.upsert(
        "workloads",
        {
            **workload_v1beta2(),
            "metadata": {
                "name": "job-1",
                "namespace": "team-a",
                "finalizers": ["kueue.x-k8s.io/resource-in-use"],
            },
        },
    )
    custom = kc.CustomObjectsApi(api)
    custom.delete_namespaced_custom_object(KUEUE, "v1beta2", "team-a", "workloads", "job-1")
    pending = store.get("workloads", "team-a", "job-1")
    assert pending is not None and pending["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(
        KUEUE, "v1beta2", "team-a", "workloads", "job-1", {"metadata": {"finalizers": None}}
    )
    assert store.get("workloads", "team-a", "job-1") is None


# ---- discovery and versions ----


def test_discovery_for_the_official_client(api: kc.ApiClient) -> None:
    assert kc.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: g for g in kc.ApisApi(api).get_api_versions().groups}
    kueue = groups[KUEUE]
    assert kueue.preferred_version.version == "v1beta2"
    assert [v.version for v in kueue.versions] == ["v1beta2", "v1beta1"]
    core = kc.CoreV1Api(api).get_api_resources()
    assert {"nodes", "pods", "events", "namespaces", "pods/status"} <= {
        r.name for r in core.resources
    }


@pytest.mark.parametrize(("served", "preferred"), [(("v1beta1",), "v1beta1"), ((), None)])
def test_older_or_absent_kueue(
    store: ObjectStore, served: tuple[str, ...], preferred: str | None
) -> None:
    store.upsert("workloads", workload_v1beta2())
    with (
        FakeApiServer(store, kueue_versions=served) as server,
        kc.ApiClient(kc.Configuration(host=server.url)) as api,
    ):
        groups = {g.name: g for g in kc.ApisApi(api).get_api_versions().groups}
        custom = kc.CustomObjectsApi(api)
        with pytest.raises(kc.ApiException) as v1beta2:
            custom.list_cluster_custom_object(KUEUE, "v1beta2", "workloads")
        assert v1beta2.value.status == 404
        if preferred is None:
            assert KUEUE not in groups
            return
        assert groups[KUEUE].preferred_version.version == preferred
        listed = custom.list_cluster_custom_object(KUEUE, "v1beta1", "workloads")
        assignment = listed["items"][0]["status"]["admission"]["podSetAssignments"][0]
        assert assignment["topologyAssignment"]["domains"][0] == {
            "values": ["kind-worker"],
            "count": 7,
        }


@cache
def _schema(crd: str, version: str) -> dict[str, Any]:
    text = reference(f"kueue/crds/kueue.x-k8s.io_{crd}.yaml").read_text()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = yaml.load(text, Loader=loader)
    for served in document["spec"]["versions"]:
        if served["name"] == version:
            schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(version)


def _valid(obj: dict[str, Any], crd: str) -> None:
    version = obj["apiVersion"].rpartition("/")[2]
    jsonschema.validate(obj, _schema(crd, version))


def test_workload_read_at_v1beta1_and_written_back_round_trips(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    original = store.upsert("workloads", workload_v1beta2())
    custom = kc.CustomObjectsApi(api)
    old = custom.get_namespaced_custom_object(KUEUE, "v1beta1", "team-a", "workloads", "job-1")
    _valid(old, "workloads")
    assert old["spec"]["priorityClassName"] == "high"
    assert old["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"
    assert old["status"]["accumulatedPastExexcutionTimeSeconds"] == 42
    assignment = old["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert assignment["domains"] == [
        {"values": ["kind-worker"], "count": 7},
        {"values": ["kind-worker2"], "count": 3},
    ]
    # An old client writes spec and status back at v1beta1: nothing is lost on the way.
    old["spec"]["active"] = True
    old = custom.replace_namespaced_custom_object(
        KUEUE, "v1beta1", "team-a", "workloads", "job-1", old
    )
    old["status"] = custom.get_namespaced_custom_object(
        KUEUE, "v1beta1", "team-a", "workloads", "job-1"
    )["status"]
    custom.replace_namespaced_custom_object_status(
        KUEUE, "v1beta1", "team-a", "workloads", "job-1", old
    )
    stored = store.get("workloads", "team-a", "job-1")
    assert stored is not None
    _valid(stored, "workloads")
    assert stored["spec"] == {**original["spec"], "active": True}
    assert stored["status"] == original["status"]


def test_workload_written_at_v1beta1_is_compacted_into_slices(
    store: ObjectStore, api: kc.ApiClient
) -> None:
    example = next(
        yaml.safe_load_all(
            reference("kueue/examples/04_tas_topologyAssignment_v1beta1_domains.yaml").read_text()
        )
    )["topologyAssignment"]
    old = convert(workload_v1beta2(), "v1beta1")
    status = old.pop("status")
    status["admission"]["podSetAssignments"][0].update(count=6, topologyAssignment=example)
    custom = kc.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(KUEUE, "v1beta1", "team-a", "workloads", old)
    created["status"] = status
    custom.replace_namespaced_custom_object_status(
        KUEUE, "v1beta1", "team-a", "workloads", "job-1", created
    )
    stored = store.get("workloads", "team-a", "job-1")
    assert stored is not None
    _valid(stored, "workloads")
    ta = stored["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert ta["slices"] == [
        {
            "domainCount": 2,
            "valuesPerLevel": [
                {"universal": "block-1"},
                {"individual": {"prefix": "rack-", "roots": ["1", "2"]}},
            ],
            "podCounts": {"individual": [4, 2]},
        }
    ]
    back = custom.get_namespaced_custom_object(KUEUE, "v1beta1", "team-a", "workloads", "job-1")
    assert back["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] == example


def test_slices_with_suffixes_universal_counts_and_bad_parts() -> None:
    slices = [
        {
            "domainCount": 3,
            "valuesPerLevel": [
                {"individual": {"prefix": "n-", "roots": ["1", "2", "3"], "suffix": "-x"}}
            ],
            "podCounts": {"universal": 2},
        },
        {
            "domainCount": 2,
            "valuesPerLevel": [{"universal": "n-9-x"}],
            "podCounts": {"individual": [1]},
        },  # malformed: one count for two domains
        "not a slice",
    ]
    assert list(domains_from_slices(slices)) == [
        (("n-1-x",), 2),
        (("n-2-x",), 2),
        (("n-3-x",), 2),
    ]


def test_cluster_and_local_queue_conversions() -> None:
    cq = {
        "apiVersion": f"{KUEUE}/v1beta1",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {
            "cohort": "all",
            "admissionChecks": ["prov"],
            "flavorFungibility": {"whenCanBorrow": "Borrow"},
        },
        "status": {"pendingWorkloadsStatus": {"lastChangeTime": "2026-01-01T00:00:00Z"}},
    }
    up = convert(cq, "v1beta2")
    _valid(up, "clusterqueues")
    assert up["spec"]["cohortName"] == "all"
    assert up["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "prov"}]}
    assert up["spec"]["flavorFungibility"]["whenCanBorrow"] == "MayStopSearch"
    assert "pendingWorkloadsStatus" not in up["status"]
    assert convert(up, "v1beta1")["spec"]["cohort"] == "all"
    lq = {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "lq", "namespace": "team-a"},
        "spec": {"clusterQueue": "cq"},
        "status": {"flavorsUsage": [{"name": "f", "resources": [{"name": "cpu", "total": "1"}]}]},
    }
    down = convert(lq, "v1beta1")
    _valid(down, "localqueues")
    assert down["status"]["flavorUsage"][0]["name"] == "f"
    assert convert(down, "v1beta2") == lq


# ---- faults and robustness ----


def test_fail_next_answers_with_status_bodies(
    store: ObjectStore, server: FakeApiServer, api: kc.ApiClient
) -> None:
    core = kc.CoreV1Api(api)
    server.fail_next(2, 503)
    for _ in range(2):
        with pytest.raises(kc.ApiException) as failed:
            core.list_node()
        assert failed.value.status == 503
        assert json.loads(failed.value.body)["reason"] == "ServiceUnavailable"
    assert core.list_node().items == []
    assert server.requests["LIST nodes"] == 3


def test_client_hang_ups_and_garbage_print_no_tracebacks(
    store: ObjectStore, server: FakeApiServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for i in range(200):
        store.upsert("pods", pod(f"p{i}"))
    port = server.port
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n\r\n")  # and leave at once
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /api/v1/namespaces/a/pods HTTP/1.1\r\nContent-Length: 5\r\n\r\n{nope")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /api/v1/pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(100)
    time.sleep(0.3)
    assert "Traceback" not in capfd.readouterr().err


def test_only_loopback(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeApiServer(store, host="0.0.0.0")
