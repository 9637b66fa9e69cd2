"""The PATCH bodies the simulated API server accepts: JSON merge patch and JSON patch.

`application/merge-patch+json` is RFC 7386 (a null deletes a key, objects merge, anything
else replaces). `application/json-patch+json` is RFC 6902. Strategic merge patch, which
only built-in types accept, is applied as a merge patch: identical for maps such as labels
and annotations, but lists are replaced instead of merged by key. A patch that cannot be
applied raises `PatchError` (the server answers 422, or 400 for a body of the wrong shape).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that is malformed or does not apply to the object."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: the result of applying `patch` to `target` (neither is changed)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: apply a list of operations to a copy of `target`."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or not isinstance(operation.get("op"), str):
            raise PatchError(f"malformed JSON patch operation: {operation!r}")
        doc = _apply(doc, operation)
    return doc


def _apply(doc: Any, operation: dict[str, Any]) -> Any:
    op = operation["op"]
    path = _pointer(operation.get("path"))
    if op == "add":
        return _add(doc, path, copy.deepcopy(_required(operation, "value")))
    if op == "remove":
        return _remove(doc, path)[0]
    if op == "replace":
        doc, _ = _remove(doc, path)
        return _add(doc, path, copy.deepcopy(_required(operation, "value")))
    if op == "test":
        if _get(doc, path) != _required(operation, "value"):
            raise PatchError(f"test failed at {operation.get('path')!r}")
        return doc
    source = _pointer(operation.get("from"))
    if op == "move":
        doc, value = _remove(doc, source)
        return _add(doc, path, value)
    if op == "copy":
        return _add(doc, path, copy.deepcopy(_get(doc, source)))
    raise PatchError(f"unknown JSON patch operation {op!r}")


def _required(operation: dict[str, Any], key: str) -> Any:
    if key not in operation:
        raise PatchError(f"JSON patch operation {operation['op']!r} needs {key!r}")
    return operation[key]


def _pointer(raw: object) -> list[str]:
    if not isinstance(raw, str) or (raw and not raw.startswith("/")):
        raise PatchError(f"invalid JSON pointer {raw!r}")
    if raw == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in raw[1:].split("/")]


def _parent(doc: Any, path: list[str]) -> Any:
    node = doc
    for part in path[:-1]:
        node = _child(node, part)
    return node


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        if part not in node:
            raise PatchError(f"path element {part!r} does not exist")
        return node[part]
    if isinstance(node, list):
        return node[_index(node, part, allow_end=False)]
    raise PatchError(f"cannot descend into {type(node).__name__} at {part!r}")


def _index(node: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(node)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"invalid array index {part!r}")
    index = int(part)
    if index > len(node) or (index == len(node) and not allow_end):
        raise PatchError(f"array index {index} out of range")
    return index


def _get(doc: Any, path: list[str]) -> Any:
    node = doc
    for part in path:
        node = _child(node, part)
    return node


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _parent(doc, path)
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise PatchError(f"cannot add to {type(parent).__name__}")
    return doc


def _remove(doc: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, path)
    last = path[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path element {last!r} does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, allow_end=False))
    raise PatchError(f"cannot remove from {type(parent).__name__}")
