"""The words of the goodput ledger: why a job stopped, and which part of a node failed.

Two vocabularies, both bounded (they become metric label values):

- a cause, one per interruption (`CAUSES`): what stopped a running job, decided from evidence
  by each scheduler's ledger (`exporter.cluster.goodput.attribution` for Kueue,
  `exporter.slurm.goodput` for Slurm);
- a component, for an interruption caused by a node (`COMPONENTS`): the part of the machine a
  health finding names, as Meta's Llama 3 report groups its 419 interruptions (faulty GPU, GPU
  HBM3, software, network, host maintenance, GPU SRAM, ...). HBM and SRAM ECC errors share
  "hbm" (the issue's "HBM/ECC"); "host" is the host and its kernel (a node that went NotReady,
  a kernel log finding, a read-only root file system).

A finding's component comes from its check id and, for XIDs, from NVIDIA's catalog
(`exporter.core.xid`): an XID whose catalogued action is to restart the application
(RESTART_APP, and XIDs 13/31/43/45, which NVIDIA's XID guide attributes to the application) is
software; the memory XIDs (ECC, row remapping, retirement) are hbm; the NVLink XIDs are nvlink;
any other XID is the GPU itself.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from exporter.core.xid import describe

Cause = Literal[
    "preempted",
    "node_fault",
    "remediation",
    "elastic_scale_down",
    "user",
    "completed",
    "unknown",
]
CAUSES: Final[tuple[Cause, ...]] = (
    "preempted",
    "node_fault",
    "remediation",
    "elastic_scale_down",
    "user",
    "completed",
    "unknown",
)
Component = Literal["gpu", "hbm", "nvlink", "network", "host", "software", "unknown"]
COMPONENTS: Final[tuple[Component, ...]] = (
    "gpu",
    "hbm",
    "nvlink",
    "network",
    "host",
    "software",
    "unknown",
)
# What a person reads for each component (dashboards, explain).
COMPONENT_NAMES: Final[dict[str, str]] = {
    "gpu": "GPU",
    "hbm": "HBM/ECC",
    "nvlink": "NVLink/fabric",
    "network": "EFA/network",
    "host": "host/kernel",
    "software": "software",
    "unknown": "unknown",
}
# Components whose findings are the machine's fault (MTBF, repeat offenders).
HARDWARE: Final[frozenset[str]] = frozenset({"gpu", "hbm", "nvlink", "network", "host"})

# XIDs of GPU memory: DBE (48), row remapping (63, 64), excessive SBE (92), contained and
# uncontained ECC (94, 95: SRAM or HBM), ECC escape (140), resource retirement (156, 157).
MEMORY_XIDS: Final[frozenset[int]] = frozenset({48, 63, 64, 92, 94, 95, 140, 156, 157})
# NVLink and NVLink5 fabric XIDs.
NVLINK_XIDS: Final[frozenset[int]] = frozenset({74, 137, 144, 145, 146, 147, 148, 149, 150, 155})
# XIDs NVIDIA's guide puts on the application (illegal access, MMU fault, stopped processing,
# preemptive removal), whatever their catalogued bucket.
APPLICATION_XIDS: Final[frozenset[int]] = frozenset({13, 31, 43, 45})

_XID_IN_EVIDENCE = re.compile(r"\bXID\s*(\d{1,4})\b", re.IGNORECASE)

# Check ids (healthcheck/detection/checks) by the component they watch, by prefix.
_CHECK_PREFIXES: Final[tuple[tuple[str, Component], ...]] = (
    ("efa", "network"),
    ("nvlink", "nvlink"),
    ("gpu_fabric", "nvlink"),
    ("fabric", "nvlink"),
    ("ecc", "hbm"),
    ("row_remap", "hbm"),
    ("retired_pages", "hbm"),
    ("xid_memory", "hbm"),
    ("xid_app", "software"),
    ("gpu", "gpu"),
    ("pcie", "gpu"),
    ("thermal", "gpu"),
    ("recovery", "gpu"),
    ("kernel", "host"),
    ("rootfs", "host"),
    ("numa", "host"),
    ("inventory", "host"),
    ("node", "host"),
)


def xid_of(evidence: str) -> int | None:
    """The XID a finding's evidence names ("XID 79 ROBUST_CHANNEL_... x1" -> 79), else None."""
    match = _XID_IN_EVIDENCE.search(evidence)
    return int(match.group(1)) if match else None


def xid_component(xid: int) -> Component:
    """The component an XID points at (see the module's docstring)."""
    if xid in MEMORY_XIDS:
        return "hbm"
    if xid in NVLINK_XIDS:
        return "nvlink"
    if xid in APPLICATION_XIDS or describe(xid).action == "RESTART_APP":
        return "software"
    return "gpu"


def component_of(check: str, evidence: str = "") -> Component:
    """The component a finding of check `check` (with its evidence text) names."""
    name = check.lower()
    if name == "xid" or (name.startswith("xid_") and name not in ("xid_app_repeat", "xid_memory")):
        xid = xid_of(evidence)
        return xid_component(xid) if xid is not None else "gpu"
    for prefix, component in _CHECK_PREFIXES:
        if name.startswith(prefix):
            return component
    return "unknown"


def is_hardware(component: str) -> bool:
    return component in HARDWARE
