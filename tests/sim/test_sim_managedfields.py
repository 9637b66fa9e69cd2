"""The simulated API server keeps metadata.managedFields as the real one does for non-apply
writes: over HTTP, the writer's field manager owns what it changed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from exporter.sim.kubeapi import managedfields
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sources.kubeapi import KubeApi

PATH = "/api/v1/nodes/n1"


@pytest.fixture
def setup() -> Iterator[tuple[KubeApi, ObjectStore]]:
    store = ObjectStore()
    store.upsert("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    with FakeApiServer(store) as server, KubeApi(server.url) as api:
        yield api, store


def owned(store: ObjectStore) -> dict[tuple[str, str], Any]:
    obj = store.get("nodes", "", "n1")
    assert obj is not None
    return {
        (e["manager"], e.get("subresource", "")): e["fieldsV1"]
        for e in obj["metadata"].get("managedFields", [])
    }


def note(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


def test_a_change_moves_ownership_and_the_same_value_does_not(
    setup: tuple[KubeApi, ObjectStore],
) -> None:
    api, store = setup
    api.patch(PATH + "?fieldManager=alice", note("a", "1"))
    api.patch(PATH + "?fieldManager=alice", note("b", "1"))
    assert owned(store) == {
        ("alice", ""): {"f:metadata": {"f:annotations": {"f:a": {}, "f:b": {}}}}
    }
    api.patch(PATH + "?fieldManager=bob", note("a", "1"))  # same value: alice keeps it
    assert ("bob", "") not in owned(store)
    api.patch(PATH + "?fieldManager=bob", note("a", "2"))
    assert owned(store) == {
        ("alice", ""): {"f:metadata": {"f:annotations": {"f:b": {}}}},
        ("bob", ""): {"f:metadata": {"f:annotations": {"f:a": {}}}},
    }
    api.patch(PATH + "?fieldManager=carol", note("b", None))  # removed: owned by no one
    assert set(owned(store)) == {("bob", "")}


def test_the_default_manager_is_the_user_agents_product(
    setup: tuple[KubeApi, ObjectStore],
) -> None:
    api, store = setup
    api.patch(PATH, note("a", "1"))  # KubeApi says User-Agent: topowatch
    assert set(owned(store)) == {("topowatch", "")}
    assert managedfields.manager_of({}, "kubectl/v1.30.2 (linux/amd64)") == "kubectl"
    assert managedfields.manager_of({"fieldManager": "x"}, "kubectl/v1") == "x"


def test_status_writes_get_their_own_entry(setup: tuple[KubeApi, ObjectStore]) -> None:
    api, store = setup
    api.patch(PATH + "/status?fieldManager=agent", {"status": {"phase": "Running"}})
    assert owned(store) == {("agent", "status"): {"f:status": {"f:phase": {}}}}


def test_clients_may_rewrite_or_clear_managed_fields(setup: tuple[KubeApi, ObjectStore]) -> None:
    api, store = setup
    api.patch(PATH + "?fieldManager=alice", note("a", "1"))
    claimed = [
        {
            "manager": "mallory",
            "operation": "Update",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:a": {}}}},
        }
    ]
    api.patch(PATH + "?fieldManager=alice", {"metadata": {"managedFields": claimed}})
    assert set(owned(store)) == {("mallory", "")}  # what the client said, as the real server
    api.patch(PATH, {"metadata": {"managedFields": [{}]}})
    assert owned(store) == {}
