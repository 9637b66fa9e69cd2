"""Slurm nodes as slurmctld reports them: `sinfo --json` (22.05) or `scontrol show nodes --json`.

Both print `{"nodes": [...]}` with the same fields; the shapes moved between data_parser versions:
- openapi v0.0.38 (21.08-22.05): `state` is the base state in lower case ("idle") and
  `state_flags` a list ("DRAIN"); `features` a comma string; numbers plain.
- v0.0.39+ (23.02+): `state` is a list whose first item is the base state, the rest flags
  (["IDLE", "DRAIN"]); `features`/`active_features` lists from v0.0.40; numbers may be
  `{"set": true, "infinite": false, "number": N}`.
Node states and flags: https://slurm.schedmd.com/sinfo.html#SECTION_NODE-STATE-CODES.
A node that cannot be read is a problem string, never an exception: one bad entry must not hide
the rest of the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BASE_STATES = frozenset({"unknown", "down", "idle", "allocated", "error", "mixed", "future"})
# Flags that take a node out of service (scheduling nothing new): sinfo's DRAIN/DRNG/DRAINED,
# FAIL/FAILING, and a node that stopped answering.
OUT_OF_SERVICE_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE"})
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    address: str  # NodeAddr: where its agent answers
    hostname: str
    state: str  # the base state, lower case: idle, allocated, mixed, down, ...
    flags: frozenset[str]  # upper case: DRAIN, FAIL, NOT_RESPONDING, REBOOT_REQUESTED, ...
    reason: str
    reason_set_by: str
    reason_changed_at: float | None
    partitions: tuple[str, ...]
    features: frozenset[str]  # available and active features together
    gpus: int  # GPUs in its gres (0: none declared)
    cpus: int = 0
    boot_time: float | None = None  # when the host last booted (slurmd reports it)

    @property
    def out_of_service(self) -> bool:
        """DOWN, or DRAIN/FAIL (drained or draining), or not responding: slurmctld schedules
        nothing new there, so it is someone's node to mend, never ours to touch again."""
        return self.state == "down" or bool(self.flags & OUT_OF_SERVICE_FLAGS)

    @property
    def free(self) -> bool:
        """Schedulable and running nothing: `idle` with no flag taking it out of service."""
        return self.state == "idle" and not self.out_of_service

    def describe(self) -> str:
        words = [self.state.upper(), *sorted(self.flags)]
        said = "+".join(words)
        return f"{said} ({self.reason})" if self.reason else said


def parse_nodes(text: str) -> tuple[list[SlurmNode], list[str]]:
    """Every node that can be read (by name, first wins), and a note per one that cannot."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return [], [f"node list is not JSON: {exc}"]
    raw = document.get("nodes") if isinstance(document, Mapping) else None
    if not isinstance(raw, list):
        return [], ["node list has no `nodes` array"]
    nodes: dict[str, SlurmNode] = {}
    problems: list[str] = []
    for index, entry in enumerate(raw):
        try:
            node = _node(entry)
        except ValueError as exc:
            problems.append(f"nodes[{index}]: {exc}")
            continue
        nodes.setdefault(node.name, node)
    for error in document.get("errors") or []:
        if isinstance(error, Mapping):
            problems.append(
                f"slurm says: {error.get('description') or error.get('error') or error}"
            )
    return list(nodes.values()), problems


def _node(entry: Any) -> SlurmNode:
    if not isinstance(entry, Mapping):
        raise ValueError(f"not an object: {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("no name")
    state, flags = _state(entry.get("state"), entry.get("state_flags"))
    features = _words(entry.get("features")) | _words(entry.get("active_features"))
    partitions = entry.get("partitions")
    return SlurmNode(
        name=name,
        address=_text(entry.get("address")) or name,
        hostname=_text(entry.get("hostname")) or name,
        state=state,
        flags=flags,
        reason=_text(entry.get("reason")),
        reason_set_by=_text(entry.get("reason_set_by_user")),
        reason_changed_at=_number(entry.get("reason_changed_at")),
        partitions=tuple(p for p in partitions if isinstance(p, str))
        if isinstance(partitions, list)
        else tuple(_words(partitions)),
        features=features,
        gpus=gpus_in_gres(_text(entry.get("gres"))),
        cpus=int(_number(entry.get("cpus")) or 0),
        boot_time=_number(entry.get("boot_time")) or None,
    )


def _state(state: Any, state_flags: Any) -> tuple[str, frozenset[str]]:
    if isinstance(state, list):  # v0.0.39+: base state first, then flags
        words = [w.upper() for w in state if isinstance(w, str)]
        if not words:
            raise ValueError("empty state")
        base, flags = words[0].lower(), set(words[1:])
    elif isinstance(state, str) and state:
        base, flags = state.lower(), set()
    else:
        raise ValueError(f"state {state!r} is not a string or a list")
    if isinstance(state_flags, list):
        flags |= {f.upper() for f in state_flags if isinstance(f, str)}
    if base not in BASE_STATES:
        raise ValueError(f"unknown base state {base!r}")
    return base, frozenset(flags)


def gpus_in_gres(gres: str) -> int:
    """GPUs in a gres string: "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a:4,gpu:b:4" → 8."""
    return sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres))


def _words(value: Any) -> frozenset[str]:
    if isinstance(value, list):
        return frozenset(w for w in value if isinstance(w, str) and w)
    if isinstance(value, str):
        return frozenset(w.strip() for w in value.split(",") if w.strip())
    return frozenset()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    """A plain number, or v0.0.40's {"set", "infinite", "number"}; None when unset."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
