"""The simulated API server's PATCH bodies against the RFCs' own examples: RFC 6902 (JSON
Patch) Appendix A and RFC 7386 (JSON Merge Patch) Appendix A, through the adapter in
`exporter.sim.kubeapi.patch`; its merge patch is `exporter.core.mergepatch`, the quota emitter's
too."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import urllib3

from exporter.sim.kubeapi.patch import PatchError, json_patch, merge_patch
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore

# RFC 6902 Appendix A: (section, document, patch, result); the document is not changed.
RFC6902_APPLIES: list[tuple[str, Any, list[dict[str, Any]], Any]] = [
    (
        "A.1 adding an object member",
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux"}],
        {"baz": "qux", "foo": "bar"},
    ),
    (
        "A.2 adding an array element",
        {"foo": ["bar", "baz"]},
        [{"op": "add", "path": "/foo/1", "value": "qux"}],
        {"foo": ["bar", "qux", "baz"]},
    ),
    (
        "A.3 removing an object member",
        {"baz": "qux", "foo": "bar"},
        [{"op": "remove", "path": "/baz"}],
        {"foo": "bar"},
    ),
    (
        "A.4 removing an array element",
        {"foo": ["bar", "qux", "baz"]},
        [{"op": "remove", "path": "/foo/1"}],
        {"foo": ["bar", "baz"]},
    ),
    (
        "A.5 replacing a value",
        {"baz": "qux", "foo": "bar"},
        [{"op": "replace", "path": "/baz", "value": "boo"}],
        {"baz": "boo", "foo": "bar"},
    ),
    (
        "A.6 moving a value",
        {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
        [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
        {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
    ),
    (
        "A.7 moving an array element",
        {"foo": ["all", "grass", "cows", "eat"]},
        [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
        {"foo": ["all", "cows", "eat", "grass"]},
    ),
    (
        "A.8 testing a value: success",
        {"baz": "qux", "foo": ["a", 2, "c"]},
        [
            {"op": "test", "path": "/baz", "value": "qux"},
            {"op": "test", "path": "/foo/1", "value": 2},
        ],
        {"baz": "qux", "foo": ["a", 2, "c"]},
    ),
    (
        "A.10 adding a nested member object",
        {"foo": "bar"},
        [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
        {"foo": "bar", "child": {"grandchild": {}}},
    ),
    (
        "A.11 ignoring unrecognized elements",
        {"foo": "bar"},
        [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
        {"foo": "bar", "baz": "qux"},
    ),
    (
        "A.14 ~ escape ordering",
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": 10}],
        {"/": 9, "~1": 10},
    ),
    (
        "A.16 adding an array value",
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
        {"foo": ["bar", ["abc", "def"]]},
    ),
    (
        "copy (section 4.5)",
        {"foo": {"bar": [1]}},
        [{"op": "copy", "from": "/foo/bar", "path": "/baz"}],
        {"foo": {"bar": [1]}, "baz": [1]},
    ),
]

# RFC 6902 Appendix A's errors, and the other ways a patch fails to apply: (case, doc, patch).
RFC6902_FAILS: list[tuple[str, Any, list[dict[str, Any]]]] = [
    (
        "A.9 testing a value: error",
        {"baz": "qux"},
        [{"op": "test", "path": "/baz", "value": "bar"}],
    ),
    (
        "A.12 adding to a nonexistent target",
        {"foo": "bar"},
        [{"op": "add", "path": "/baz/bat", "value": "qux"}],
    ),
    (
        "A.15 comparing strings and numbers",
        {"/": 9, "~1": 10},
        [{"op": "test", "path": "/~01", "value": "10"}],
    ),
    (
        "4.1 array index past the end",
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/5", "value": "x"}],
    ),
    (
        "4.1 array index that is not a number",
        {"foo": ["bar"]},
        [{"op": "add", "path": "/foo/bar", "value": "x"}],
    ),
    ("remove a missing member", {"foo": "bar"}, [{"op": "remove", "path": "/baz"}]),
    ("replace a missing member", {"foo": "bar"}, [{"op": "replace", "path": "/baz", "value": 1}]),
    ("remove a missing index", {"foo": [1]}, [{"op": "remove", "path": "/foo/1"}]),
    (
        "copy from a missing member",
        {"foo": 1},
        [{"op": "copy", "from": "/nope", "path": "/bar"}],
    ),
    (
        "move from a missing member",
        {"foo": 1},
        [{"op": "move", "from": "/nope", "path": "/bar"}],
    ),
]

# Bodies of the wrong shape: a PatchError too (the server answers 400 before it gets that far
# for a body that is not JSON; these are JSON, but not a JSON patch).
RFC6902_MALFORMED: list[tuple[str, Any]] = [
    ("not a list", {"op": "add", "path": "/a", "value": 1}),
    ("an operation that is not an object", ["add"]),
    ("no op", [{"path": "/a", "value": 1}]),
    ("an unknown op", [{"op": "frobnicate", "path": "/a"}]),
    ("add without a value", [{"op": "add", "path": "/a"}]),
    ("a pointer without a leading slash", [{"op": "add", "path": "a", "value": 1}]),
    ("move without from", [{"op": "move", "path": "/a"}]),
]

# RFC 7386 Appendix A, every row: (original, patch, result).
RFC7386_EXAMPLES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(
    ("doc", "patch", "result"),
    [case[1:] for case in RFC6902_APPLIES],
    ids=[case[0] for case in RFC6902_APPLIES],
)
def test_json_patch_applies_the_rfc_examples(doc: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(doc)
    assert json_patch(doc, patch) == result
    assert doc == before


@pytest.mark.parametrize(
    ("doc", "patch"),
    [case[1:] for case in RFC6902_FAILS],
    ids=[case[0] for case in RFC6902_FAILS],
)
def test_json_patch_that_does_not_apply_is_a_patch_error(doc: Any, patch: Any) -> None:
    before = copy.deepcopy(doc)
    with pytest.raises(PatchError):
        json_patch(doc, patch)
    assert doc == before


@pytest.mark.parametrize(
    "patch", [case[1] for case in RFC6902_MALFORMED], ids=[case[0] for case in RFC6902_MALFORMED]
)
def test_malformed_json_patch_is_a_patch_error(patch: Any) -> None:
    with pytest.raises(PatchError):
        json_patch({"a": 0}, patch)


def test_json_patch_neither_changes_nor_shares_the_stored_object() -> None:
    stored = {"metadata": {"labels": {"a": "1"}}, "spec": {"taints": [{"key": "k"}]}}
    before = copy.deepcopy(stored)
    value = {"nested": ["x"]}
    patched = json_patch(
        stored,
        [
            {"op": "add", "path": "/metadata/labels/b", "value": value},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        ],
    )
    assert stored == before
    assert patched == {"metadata": {"labels": {"a": "1", "b": value}}, "spec": {"taints": []}}
    patched["metadata"]["labels"]["b"]["nested"].append("y")
    patched["metadata"]["labels"]["c"] = "3"
    assert value == {"nested": ["x"]}  # the patch's own value was copied in, not shared
    assert stored == before


def test_a_failed_json_patch_leaves_the_stored_object_alone() -> None:
    stored = {"metadata": {"labels": {"a": "1"}}}
    with pytest.raises(PatchError):
        json_patch(
            stored,
            [
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "test", "path": "/metadata/labels/a", "value": "nope"},
            ],
        )
    assert stored == {"metadata": {"labels": {"a": "1"}}}


@pytest.mark.parametrize(("original", "patch", "result"), RFC7386_EXAMPLES)
def test_merge_patch_rfc7386_appendix_a(original: Any, patch: Any, result: Any) -> None:
    before, patch_before = copy.deepcopy(original), copy.deepcopy(patch)
    assert merge_patch(original, patch) == result
    assert (original, patch) == (before, patch_before)


def test_merge_patch_neither_changes_nor_shares_its_inputs() -> None:
    stored = {"metadata": {"labels": {"a": "1", "gone": "x"}, "annotations": {"n": "1"}}}
    patch = {"metadata": {"labels": {"gone": None, "b": {"deep": ["v"]}}}}
    before, patch_before = copy.deepcopy(stored), copy.deepcopy(patch)
    patched = merge_patch(stored, patch)
    assert patched == {
        "metadata": {"labels": {"a": "1", "b": {"deep": ["v"]}}, "annotations": {"n": "1"}}
    }
    patched["metadata"]["labels"]["b"]["deep"].append("w")
    patched["metadata"]["labels"]["c"] = "3"
    assert (stored, patch) == (before, patch_before)


def test_merge_patch_result_shares_nothing_with_the_stored_object() -> None:
    """What the patch leaves alone is copied too: editing the result never reaches the store."""
    stored = {"metadata": {"labels": {"a": "1"}, "annotations": {"n": "1"}}, "spec": {"x": [1]}}
    before = copy.deepcopy(stored)
    patched = merge_patch(stored, {"metadata": {"labels": {"b": "2"}}})
    patched["metadata"]["annotations"]["m"] = "2"
    patched["spec"]["x"].append(2)
    assert stored == before


def test_the_server_answers_422_for_a_patch_that_does_not_apply_and_400_for_a_bad_body() -> None:
    store = ObjectStore(clock=lambda: 1_795_000_000.0)
    store.upsert("nodes", {"metadata": {"name": "n1", "labels": {"a": "1"}}})
    http = urllib3.PoolManager()

    def patch(body: bytes, media: str) -> tuple[int, Any]:
        response = http.request(
            "PATCH", f"{server.url}/api/v1/nodes/n1", body=body, headers={"Content-Type": media}
        )
        return response.status, json.loads(response.data)

    merge, jsonp = "application/merge-patch+json", "application/json-patch+json"
    with FakeApiServer(store) as server:
        status, body = patch(b'{"metadata": {"labels": {"a": null, "b": "2"}}}', merge)
        assert status == 200 and body["metadata"]["labels"] == {"b": "2"}
        ops = [
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "add", "path": "/metadata/labels/c", "value": "3"},
            {"op": "remove", "path": "/metadata/labels/b"},
        ]
        status, body = patch(json.dumps(ops).encode(), jsonp)
        assert status == 200 and body["metadata"]["labels"] == {"c": "3"}
        refused = {
            "test fails": [{"op": "test", "path": "/metadata/labels/c", "value": "4"}],
            "missing parent": [{"op": "add", "path": "/spec/taints/0", "value": {}}],
            "bad index": [{"op": "add", "path": "/metadata/labels/c/x", "value": 1}],
            "unknown op": [{"op": "frobnicate", "path": "/metadata"}],
            "not a list": {"op": "add", "path": "/metadata/labels/d", "value": "4"},
        }
        for what, ops_body in refused.items():
            status, body = patch(json.dumps(ops_body).encode(), jsonp)
            assert (status, body["kind"], body["code"]) == (422, "Status", 422), what
        assert patch(b"{nope", jsonp)[0] == 400
        assert patch(b'"a string"', merge)[0] == 400
    stored = store.get("nodes", "", "n1")
    assert stored is not None and stored["metadata"]["labels"] == {"c": "3"}
