"""The PATCH bodies the simulated API server accepts: JSON merge patch and JSON patch.

`application/merge-patch+json` is RFC 7386 (a null deletes a key, objects merge, anything
else replaces), applied by the quota emitter's `merge_patch`, the tree's one implementation
(its docstring says why it is not a library). `application/json-patch+json` is RFC 6902,
applied by python-json-patch (`jsonpatch`). Strategic merge patch, which only built-in types
accept, is applied as a merge patch: identical for maps such as labels and annotations, but
lists are replaced instead of merged by key. Neither changes the object it is given. A patch
that is malformed or cannot be applied raises `PatchError` (the server answers 422; a body
that is not JSON, or not a JSON object or array, it refuses with 400 before it gets here).
"""

from __future__ import annotations

from typing import Any

import jsonpatch

from exporter.core.mergepatch import merge_patch

__all__ = ["PatchError", "json_patch", "merge_patch"]


class PatchError(ValueError):
    """A patch that is malformed or does not apply to the object."""


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: apply a list of operations to a deep copy of `target` (which is not changed;
    the values the operations bring in are copied too). All or nothing: the copy is dropped
    when an operation fails."""
    if not isinstance(operations, list):  # jsonpatch would parse a string as a patch
        raise PatchError("a JSON patch must be a list of operations")
    try:
        return jsonpatch.JsonPatch(operations).apply(target)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
        # InvalidJsonPatch (malformed), JsonPatchConflict and JsonPatchPathNotFound (does not
        # apply), JsonPatchTestFailed, and JsonPointerException (a bad pointer or array index)
        raise PatchError(str(error)) from error
