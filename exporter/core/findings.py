"""What a health check found, and its JSON form in the Node annotation `topowatch.io/findings`.

The node agent writes the annotation; the remediation controller (in the cluster service) reads
it back, possibly from an agent of another version, so the JSON form is a contract:

    [{"check": "xid", "component": "gpu3", "severity": "fatal", "action": "replace",
      "evidence": "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
      "firstSeen": "2026-11-22T10:00:00Z", "lastSeen": "2026-11-22T10:00:05Z",
      "actionable": true, "uuid": "GPU-2f6c...", "pciBusId": "00000000:53:00.0"}]

Keys are fixed; times are RFC 3339 UTC with second precision (Kubernetes' own convention), and
`lastSeen` is as of the write (the agent rewrites on change, not on every poll). Unknown keys
are ignored on reading, so fields may be added without breaking an older reader.

`uuid` and `pciBusId` (optional, written only when known) name the physical GPU behind a
`gpuN` component: NVML renumbers the GPUs when one is lost and the node boots without it, so the
index alone may name another GPU after a reboot. Agents older than these keys write neither; a
reader then has the index only (the remediation ladder says so when it falls back to it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

FINDINGS_ANNOTATION = "topowatch.io/findings"
HEALTH_CONDITION = "TopowatchHealthy"  # the Node condition the node agent writes

SEVERITIES = ("info", "warning", "critical", "fatal")  # ascending
ACTIONS = ("none", "reboot", "replace")  # ascending: replace outranks reboot
MAX_EVIDENCE_CHARS = 240
MAX_ANNOTATED_FINDINGS = 64  # bounds the annotation (all of a Node's annotations share 256 KiB)
MAX_ID_CHARS = 96  # a GPU UUID is 40 characters, a PCI bus id 16
_GPU_COMPONENT = re.compile(r"^gpu(\d+)(?::|$)")  # gpu3, gpu3:link0


class FindingsFormatError(ValueError):
    """JSON that is not a findings list (says which entry and why)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem on one component, as of one poll.

    `actionable` is set by damping: the finding held for K of the last N polls (or is a fatal
    event) and recommends an action.
    """

    check: str  # "xid", "ecc_uncorrectable", "nvlink_down", ...
    component: str  # "gpu3", "gpu0:link3", "rdmap16s27:1", "node"
    severity: str  # one of SEVERITIES
    action: str  # one of ACTIONS
    evidence: str  # short, with the numbers that tripped the check
    first_seen: float  # unix seconds
    last_seen: float
    actionable: bool = False
    # The physical GPU behind a `gpuN` component, when the agent knows it ("" otherwise).
    uuid: str = ""
    pci_bus_id: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} not in {ACTIONS}")

    @property
    def key(self) -> tuple[str, str]:
        """What damping and onset tracking follow across polls."""
        return (self.check, self.component)

    @property
    def rank(self) -> tuple[int, int]:
        """Worst first when sorted descending: action, then severity."""
        return (ACTIONS.index(self.action), SEVERITIES.index(self.severity))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "component": self.component,
            "severity": self.severity,
            "action": self.action,
            "evidence": self.evidence[:MAX_EVIDENCE_CHARS],
            "firstSeen": format_time(self.first_seen),
            "lastSeen": format_time(self.last_seen),
            "actionable": self.actionable,
        }
        if self.uuid:
            out["uuid"] = self.uuid[:MAX_ID_CHARS]
        if self.pci_bus_id:
            out["pciBusId"] = self.pci_bus_id[:MAX_ID_CHARS]
        return out

    @classmethod
    def from_dict(cls, data: object) -> Finding:
        """Inverse of `to_dict`; `FindingsFormatError` names the first bad field."""
        if not isinstance(data, dict):
            raise FindingsFormatError(f"a finding must be an object, got {type(data).__name__}")
        text: dict[str, str] = {}
        for key in ("check", "component", "severity", "action", "evidence"):
            value = data.get(key)
            if not isinstance(value, str) or (not value and key != "evidence"):
                raise FindingsFormatError(f"finding field {key!r} must be a non-empty string")
            text[key] = value
        actionable = data.get("actionable", False)
        if not isinstance(actionable, bool):
            raise FindingsFormatError("finding field 'actionable' must be true or false")
        ids: dict[str, str] = {}
        for key in ("uuid", "pciBusId"):  # optional: agents before issue 28 write neither
            value = data.get(key, "")
            if not isinstance(value, str) or len(value) > MAX_ID_CHARS:
                raise FindingsFormatError(f"finding field {key!r} must be a short string")
            ids[key] = value
        try:
            return cls(
                check=text["check"],
                component=text["component"],
                severity=text["severity"],
                action=text["action"],
                evidence=text["evidence"],
                first_seen=parse_time(data.get("firstSeen"), "firstSeen"),
                last_seen=parse_time(data.get("lastSeen"), "lastSeen"),
                actionable=actionable,
                uuid=ids["uuid"],
                pci_bus_id=ids["pciBusId"],
            )
        except FindingsFormatError:
            raise
        except ValueError as e:
            raise FindingsFormatError(str(e)) from e


def gpu_index(component: str) -> int | None:
    """The GPU index a component names (`gpu3`, `gpu3:link0` -> 3); None for anything else."""
    match = _GPU_COMPONENT.match(component)
    return int(match.group(1)) if match else None


def identify_gpus(
    findings: Iterable[Finding], gpus: Mapping[int, tuple[str, str]]
) -> list[Finding]:
    """Each finding on a `gpuN` component with that GPU's (uuid, pci_bus_id) from `gpus` (index
    -> ids, as the agent read them), unless it carries its own already. Pure."""
    out: list[Finding] = []
    for f in findings:
        index = gpu_index(f.component)
        ids = gpus.get(index) if index is not None else None
        if ids is not None and not (f.uuid or f.pci_bus_id):
            f = replace(f, uuid=ids[0], pci_bus_id=ids[1])
        out.append(f)
    return out


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, name: str) -> float:
    if not isinstance(value, str):
        raise FindingsFormatError(f"finding field {name!r} must be an RFC 3339 time string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise FindingsFormatError(f"finding field {name!r}: {value!r} is not RFC 3339") from e
    if parsed.tzinfo is None:
        raise FindingsFormatError(f"finding field {name!r}: {value!r} has no time zone")
    stamp = parsed.timestamp()
    if not math.isfinite(stamp):
        raise FindingsFormatError(f"finding field {name!r}: {value!r} is out of range")
    return stamp


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe action first, then severity, then a stable order by key."""
    items = sorted(findings, key=lambda f: f.key)
    return sorted(items, key=lambda f: f.rank, reverse=True)


def findings_to_json(findings: Iterable[Finding]) -> str:
    """The annotation value: compact, worst first, at most MAX_ANNOTATED_FINDINGS entries."""
    chosen = worst_first(findings)[:MAX_ANNOTATED_FINDINGS]
    return json.dumps([f.to_dict() for f in chosen], separators=(",", ":"), sort_keys=True)


def findings_from_json(text: str) -> list[Finding]:
    """Strict reading: `FindingsFormatError` on anything but a list of valid findings."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise FindingsFormatError(f"findings are not JSON: {e}") from e
    if not isinstance(data, list):
        raise FindingsFormatError(f"findings must be a JSON list, got {type(data).__name__}")
    out = []
    for i, item in enumerate(data):
        try:
            out.append(Finding.from_dict(item))
        except FindingsFormatError as e:
            raise FindingsFormatError(f"finding [{i}]: {e}") from e
    return out


def decode_findings(text: str | None) -> tuple[list[Finding], list[str]]:
    """Lenient reading for a controller: the valid findings, and a note per bad entry.

    Never raises; a missing annotation is no findings and no problem.
    """
    if text is None or not text.strip():
        return [], []
    try:
        data = json.loads(text)
    except ValueError as e:
        return [], [f"findings are not JSON: {e}"]
    if not isinstance(data, list):
        return [], [f"findings must be a JSON list, got {type(data).__name__}"]
    good: list[Finding] = []
    problems: list[str] = []
    for i, item in enumerate(data):
        try:
            good.append(Finding.from_dict(item))
        except FindingsFormatError as e:
            problems.append(f"finding [{i}]: {e}")
    return good, problems
