"""RFC 7386 JSON merge patch, shared by the quota advisor's emitter and the simulated API server."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what the API server stores after `kubectl patch --type=merge`
    with one of the patches above. A null deletes a member, an object merges member by member,
    anything else (an array too) replaces. Neither input is changed, and the result shares no
    mutable value with them.

    The one implementation in the tree: the quota advisor's emitted patches are checked with it
    and the simulated API server applies merge patches with it (exporter.sim.kubeapi.patch).
    Hand-written on purpose, unlike RFC 6902 there (python-json-patch):
    `json-merge-patch` 0.3.0, the only PyPI package that does just this, merges into its
    target in place and returns it, and puts the patch's own values into the result, so a
    caller has to deep-copy both first; it ships no type information, and with those copies
    it saves nothing over this.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    return _merge_into(copy.deepcopy(target), patch)


def _merge_into(target: Any, patch: Any) -> Any:
    """`merge_patch` into `target`, a copy that is ours to change."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge_into(target.get(key), value)
    return target
