"""Leases (coordination.k8s.io/v1) on the simulated kube-apiserver, through the official client.

Leader election is only as safe as the API server's optimistic concurrency: these tests pin
the semantics the elector relies on, as kube-apiserver has them: a resourceVersion on every
object, 409 Conflict for a write from a stale read, 409 AlreadyExists for a second create, an
update that must say which version it read, and discovery that lists the resource.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore

GROUP = "coordination.k8s.io"
NAMESPACE = "topowatch"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(ObjectStore(), bookmark_interval=0.1) as srv:
        yield srv


@pytest.fixture
def api(server: FakeApiServer) -> Iterator[kc.CoordinationV1Api]:
    config = kc.Configuration()
    config.host = server.url
    config.retries = False
    with kc.ApiClient(config) as client:
        yield kc.CoordinationV1Api(client)


def lease(name: str = "topowatch-cluster", holder: str = "a", transitions: int = 0) -> Any:
    now = datetime(2026, 11, 25, 1, 0, 0, 123456, tzinfo=UTC)
    return kc.V1Lease(
        metadata=kc.V1ObjectMeta(name=name, namespace=NAMESPACE),
        spec=kc.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=15,
            acquire_time=now,
            renew_time=now,
            lease_transitions=transitions,
        ),
    )


def status_of(error: kc.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


def test_discovery_lists_leases(server: FakeApiServer) -> None:
    config = kc.Configuration()
    config.host = server.url
    with kc.ApiClient(config) as client:
        groups = kc.ApisApi(client).get_api_versions()
        group = next(g for g in groups.groups if g.name == GROUP)
        assert group.preferred_version.group_version == f"{GROUP}/v1"
        resources = kc.CoordinationV1Api(client).get_api_resources()
    leases = next(r for r in resources.resources if r.name == "leases")
    assert leases.kind == "Lease" and leases.namespaced is True
    assert {"get", "list", "watch", "create", "update", "delete"} <= set(leases.verbs)


def test_create_get_and_list_carry_resource_versions(api: kc.CoordinationV1Api) -> None:
    created = api.create_namespaced_lease(NAMESPACE, lease())
    assert created.metadata.resource_version
    assert created.metadata.uid and created.metadata.creation_timestamp
    got = api.read_namespaced_lease("topowatch-cluster", NAMESPACE)
    assert got.metadata.resource_version == created.metadata.resource_version
    assert got.spec.holder_identity == "a" and got.spec.lease_duration_seconds == 15
    assert got.spec.renew_time == datetime(2026, 11, 25, 1, 0, 0, 123456, tzinfo=UTC)
    listed = api.list_namespaced_lease(NAMESPACE)
    assert [item.metadata.name for item in listed.items] == ["topowatch-cluster"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    assert api.list_namespaced_lease("elsewhere").items == []
    assert len(api.list_lease_for_all_namespaces().items) == 1


def test_list_items_of_a_built_in_type_leave_out_kind(
    server: FakeApiServer, api: kc.CoordinationV1Api
) -> None:
    """Like Pods, and unlike custom resources: a built-in type's list items have no kind."""
    api.create_namespaced_lease(NAMESPACE, lease())
    raw = api.api_client.call_api(
        "GET", f"{server.url}/apis/{GROUP}/v1/namespaces/{NAMESPACE}/leases"
    )
    raw.read()
    body = json.loads(raw.data)
    assert body["kind"] == "LeaseList" and body["apiVersion"] == f"{GROUP}/v1"
    assert "kind" not in body["items"][0]


def test_a_second_create_answers_already_exists(api: kc.CoordinationV1Api) -> None:
    api.create_namespaced_lease(NAMESPACE, lease(holder="a"))
    with pytest.raises(kc.ApiException) as caught:
        api.create_namespaced_lease(NAMESPACE, lease(holder="b"))
    assert caught.value.status == 409
    status = status_of(caught.value)
    assert status["kind"] == "Status" and status["reason"] == "AlreadyExists"
    assert status["details"] == {"name": "topowatch-cluster", "kind": "leases", "group": GROUP}
    assert api.read_namespaced_lease("topowatch-cluster", NAMESPACE).spec.holder_identity == "a"


def test_an_update_from_a_stale_read_answers_conflict(api: kc.CoordinationV1Api) -> None:
    """Two candidates read the same version; the first write wins, the second gets 409."""
    api.create_namespaced_lease(NAMESPACE, lease(holder=""))
    seen_by_a = api.read_namespaced_lease("topowatch-cluster", NAMESPACE)
    seen_by_b = api.read_namespaced_lease("topowatch-cluster", NAMESPACE)
    seen_by_a.spec.holder_identity = "a"
    won = api.replace_namespaced_lease("topowatch-cluster", NAMESPACE, seen_by_a)
    assert int(won.metadata.resource_version) > int(seen_by_b.metadata.resource_version)
    seen_by_b.spec.holder_identity = "b"
    with pytest.raises(kc.ApiException) as caught:
        api.replace_namespaced_lease("topowatch-cluster", NAMESPACE, seen_by_b)
    assert caught.value.status == 409
    status = status_of(caught.value)
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    assert api.read_namespaced_lease("topowatch-cluster", NAMESPACE).spec.holder_identity == "a"
    # re-read, and the write goes through
    fresh = api.read_namespaced_lease("topowatch-cluster", NAMESPACE)
    fresh.spec.lease_transitions = 1
    assert api.replace_namespaced_lease(
        "topowatch-cluster", NAMESPACE, fresh
    ).spec.lease_transitions


def test_an_update_must_say_which_version_it_read(api: kc.CoordinationV1Api) -> None:
    """A Lease's strategy refuses unconditional updates: without a resourceVersion, 422."""
    api.create_namespaced_lease(NAMESPACE, lease())
    with pytest.raises(kc.ApiException) as caught:
        api.replace_namespaced_lease("topowatch-cluster", NAMESPACE, lease(holder="b"))
    assert caught.value.status == 422


def test_racing_writers_from_one_read_exactly_one_wins(api: kc.CoordinationV1Api) -> None:
    api.create_namespaced_lease(NAMESPACE, lease(holder=""))
    reads = [api.read_namespaced_lease("topowatch-cluster", NAMESPACE) for _ in range(8)]
    outcomes: list[int] = []
    barrier = threading.Barrier(len(reads))

    def write(index: int) -> None:
        reads[index].spec.holder_identity = f"candidate-{index}"
        barrier.wait()
        try:
            api.replace_namespaced_lease("topowatch-cluster", NAMESPACE, reads[index])
            outcomes.append(200)
        except kc.ApiException as error:
            outcomes.append(error.status)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(reads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == [200] + [409] * (len(reads) - 1)


def test_watch_sees_changes_and_delete(server: FakeApiServer, api: kc.CoordinationV1Api) -> None:
    created = api.create_namespaced_lease(NAMESPACE, lease())
    created.spec.holder_identity = "b"
    api.replace_namespaced_lease("topowatch-cluster", NAMESPACE, created)
    api.delete_namespaced_lease("topowatch-cluster", NAMESPACE)
    with pytest.raises(kc.ApiException) as caught:
        api.read_namespaced_lease("topowatch-cluster", NAMESPACE)
    assert caught.value.status == 404
    response = api.list_namespaced_lease(
        NAMESPACE,
        watch=True,
        resource_version=created.metadata.resource_version,
        timeout_seconds=1,
        _preload_content=False,
    )
    events = [json.loads(line) for line in response.read().splitlines() if line]
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["spec"]["holderIdentity"] == "b"
    assert events[0]["object"]["kind"] == "Lease"


def test_other_kinds_are_unchanged(api: kc.CoordinationV1Api, server: FakeApiServer) -> None:
    """Core objects still update unconditionally and list without kind; custom resources
    still list with it (the new `builtin` flag follows the group for them)."""
    store = server.store
    assert store.resource("pods").builtin is True
    assert store.resource("workloads").builtin is False
    assert store.resource("hyperpodpytorchjobs").builtin is False
    assert store.resource("leases").builtin is True


def test_lease_times_must_be_micro_times(server: FakeApiServer, api: kc.CoordinationV1Api) -> None:
    """kube-apiserver decodes acquireTime/renewTime with RFC3339Micro: a whole second written
    by isoformat() ("...T01:00:00+00:00") is a 400, which the elector's LeaseLock avoids."""
    whole_second = lease()
    whole_second.spec.renew_time = datetime(2026, 11, 25, 1, 0, 0, tzinfo=UTC)
    with pytest.raises(kc.ApiException) as caught:
        api.create_namespaced_lease(NAMESPACE, whole_second)
    assert caught.value.status == 400 and "spec.renewTime" in status_of(caught.value)["message"]

    from exporter.sources.lease import LeaseLock, LeaseRecord

    lock = LeaseLock(api.api_client, NAMESPACE, "elected")
    stamp = datetime(2026, 11, 25, 1, 0, 0, tzinfo=UTC)
    written = lock.create(LeaseRecord("a", 15, stamp, stamp, 0), timeout=5)
    assert written.holder_identity == "a"
    assert (
        written.renew_time is not None and abs((written.renew_time - stamp).total_seconds()) < 1e-3
    )
