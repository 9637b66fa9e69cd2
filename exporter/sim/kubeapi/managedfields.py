"""metadata.managedFields as the API server keeps them for creates, updates and patches.

Every write records which field manager changed which fields (Kubernetes' server-side field
management): the manager is the request's `fieldManager` parameter, else its User-Agent up to
the first "/"; there is one entry per manager, operation and subresource, listing its fields in
the FieldsV1 format (`{"f:metadata": {"f:annotations": {"f:x": {}}}}`). A write that changes a
field moves it to the writer; a write of the same value moves nothing; a field that is gone is
owned by no one. A client that sends managedFields other than the stored ones replaces them
(a single empty entry, `[{}]`, clears them), as the real server allows: managedFields say who
*claimed* a write, not who was authenticated.

Simplifications: every write is an "Update" (no server-side apply); lists are atomic (the real
server keys map-lists such as `status.conditions` by their key); maps get no "." entries.
"""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]
Path = tuple[str, ...]
MAX_MANAGER_CHARS = 128

# Fields the server sets or that identify the object: never owned by a manager.
_IGNORED: frozenset[Path] = frozenset(
    {
        ("apiVersion",),
        ("kind",),
        ("metadata", "name"),
        ("metadata", "namespace"),
        ("metadata", "uid"),
        ("metadata", "resourceVersion"),
        ("metadata", "generation"),
        ("metadata", "creationTimestamp"),
        ("metadata", "deletionTimestamp"),
        ("metadata", "deletionGracePeriodSeconds"),
        ("metadata", "selfLink"),
        ("metadata", "managedFields"),
    }
)


def manager_of(query: dict[str, str], user_agent: str) -> str:
    """The request's field manager: `fieldManager=`, else the User-Agent's product name."""
    given = query.get("fieldManager")
    if given:
        return given[:MAX_MANAGER_CHARS]
    return (user_agent.split("/", 1)[0].strip() or "unknown")[:MAX_MANAGER_CHARS]


def track(old: Obj | None, new: Obj, manager: str, subresource: str | None, now: str) -> Obj:
    """`new` with its managedFields updated for a write of `old` -> `new` by `manager`."""
    meta = new["metadata"] = dict(new.get("metadata") or {})
    stored = (old or {}).get("metadata", {}).get("managedFields")
    sent = meta.get("managedFields")
    if sent == [{}]:  # the documented way to clear them
        meta.pop("managedFields", None)
        return new
    base = sent if sent and sent != stored else stored
    before, after = _leaves(old or {}), _leaves(new)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    entries: list[tuple[Obj, set[Path]]] = []
    for entry in base if isinstance(base, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("manager"), str):
            owned = {p for p in _paths(entry.get("fieldsV1")) if _exists(new, p)}
            entries.append((entry, owned - changed))
    key = (manager, "Update", subresource or "")
    mine = next((e for e in entries if _key(e[0]) == key), None)
    if mine is None and changed:
        mine = ({}, set())
        entries.append(mine)
    if mine is not None:
        mine[1].update(changed)
        entry = {"manager": manager, "operation": "Update", "apiVersion": _api_version(new)}
        entry["time"] = now if changed else mine[0].get("time", now)
        if subresource:
            entry["subresource"] = subresource
        mine[0].clear()
        mine[0].update(entry)
    kept = [
        {**entry, "fieldsType": "FieldsV1", "fieldsV1": _fields(owned)}
        for entry, owned in entries
        if owned
    ]
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)
    return new


def _key(entry: Obj) -> tuple[str, str, str]:
    return (
        str(entry.get("manager")),
        str(entry.get("operation") or "Update"),
        str(entry.get("subresource") or ""),
    )


def _api_version(obj: Obj) -> str:
    return str(obj.get("apiVersion") or "v1")


def _leaves(obj: Any, prefix: Path = ()) -> dict[Path, str]:
    """Every leaf path (lists and empty maps are leaves) with its value, JSON-encoded."""
    out: dict[Path, str] = {}
    if isinstance(obj, dict) and (obj or not prefix):
        for k, v in obj.items():
            path = (*prefix, str(k))
            if path not in _IGNORED:
                out.update(_leaves(v, path))
    else:
        out[prefix] = json.dumps(obj, sort_keys=True)
    return out


def _exists(obj: Any, path: Path) -> bool:
    for step in path:
        if not isinstance(obj, dict) or step not in obj:
            return False
        obj = obj[step]
    return True


def _paths(fields: Any, prefix: Path = ()) -> set[Path]:
    """FieldsV1 -> owned paths. A key other than `f:...` (".", "k:{...}", "v:...") owns the
    map or list it sits in."""
    out: set[Path] = set()
    if not isinstance(fields, dict):
        return out
    if not fields and prefix:
        out.add(prefix)
    for k, v in fields.items():
        if k.startswith("f:"):
            out |= _paths(v, (*prefix, k[2:]))
        elif prefix:
            out.add(prefix)
    return out


def _fields(paths: set[Path]) -> Obj:
    """Owned paths -> FieldsV1."""
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for step in path:
            node = node.setdefault(f"f:{step}", {})
    return root
