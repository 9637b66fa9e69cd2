"""The real node agent against nvidia-smi on a GPU machine. Prints; never passes or fails.

    .venv/bin/python benchmarks/gpu_check.py                 # agent in-process, then nvidia-smi
    .venv/bin/python benchmarks/gpu_check.py --cli           # `topowatch node --once` instead
    .venv/bin/python benchmarks/gpu_check.py --only-mismatches
    .venv/bin/python benchmarks/gpu_check.py --exposition a.prom --smi-xml q.xml \\
        [--nvlink-status nvlink.txt]                         # compare recorded outputs, no GPU

1. The agent: by default the production `Poller` over the production `NvmlGpuSource` with the real
   pynvml, wired as `topowatch node --no-kubernetes` wires it (exporter/cli/ real_sources; the
   health checks left out), polled twice a second apart as `--once` does; its Prometheus
   exposition is parsed back with prometheus_client's text parser, so names, labels and units
   are checked too. `--cli` runs
   `topowatch node --once --no-kubernetes --no-health` in a subprocess and parses its stdout
   (the XID check then cannot look inside the process and says so).
2. nvidia-smi, read straight after: `nvidia-smi -q -x` (one XML document, every GPU) and
   `nvidia-smi nvlink -s` (per-link state; the XML has no per-link NVLink section).
3. A table: field, gpu, agent value, nvidia-smi value, match, tolerance, note. GPUs are joined on
   PCI bus id. Match is "yes" within the field's tolerance, "NO" beyond it, "N/A" where one side
   has no reading (nvidia-smi prints N/A, or the agent exports no series). Instantaneous
   readings (temperature, power, clocks, utilization, memory in use, throttle reasons,
   processes) drift between the two reads, so they get a per-field tolerance; counters and
   static facts must agree exactly. The legend under the table says which and why; on a busy
   node, rerun idle before reading anything into an instantaneous mismatch.
4. XID events: nothing can inject one, so the check is that the agent's XID thread created its
   NVML event set, registered every GPU for nvmlEventTypeXidCriticalError and is waiting on it.
   It watches those three NVML calls through a pass-through wrapper around pynvml (the agent's
   code is untouched) and reads `NvmlGpuSource.xid_error`, the agent's own account.

5. What NVML costs (after nvidia-smi, so it does not widen the gap between the two reads): a
   fresh production source and poller, one warm-up poll (enumeration, discovery), then
   `--cost-polls` polls (12) every `--cost-interval` s (5: a minute at the agent's default, so
   the readings taken once a minute or two are averaged in as they are in the agent). Every
   NVML function the source calls goes through the same pass-through wrapper, with
   `time.process_time()` around it: per function, calls per GPU per poll, ms per call, ms per
   GPU per poll; the sum, what it is in mCPU for the node at the interval; and the whole poll
   (the agent's Python included), process time around `Poller.poll`. `--cost-polls 0` skips it;
   `--cli` and recorded files cannot measure it and say so.

Exit status: 0 whatever the table says; 2 when nvidia-smi or NVML is absent or does not answer.

The parsing and the comparison (`parse_smi_xml`, `parse_nvlink_status`, `parse_exposition`,
`compare`, `xid_rows`, `render_table`, `cost_rows`, `render_costs`) take plain text and data and
run no process, so tests/node/test_gpu_check.py runs them on recorded output.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1024**2
Value = float | str | None

YES, NO, NA = "yes", "NO", "N/A"


# ----- what is compared, and how closely --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """One compared field: its unit (nvidia-smi's), its tolerance and why."""

    key: str
    unit: str = ""
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    text: bool = False  # compared as text, exactly
    drift: bool = False  # an instantaneous reading: the two reads, 1-3 s apart, may differ
    why: str = ""

    def allowed(self, a: float, s: float) -> float:
        return max(self.abs_tol, self.rel_tol * max(abs(a), abs(s)))

    def tolerance(self) -> str:
        if self.text or (self.abs_tol == 0 and self.rel_tol == 0):
            return "exact"
        unit = f" {self.unit}" if self.unit else ""
        absolute = f"{_fmt(self.abs_tol)}{unit}"
        if self.rel_tol == 0:
            return f"±{absolute}"
        return f"±max({absolute}, {_fmt(self.rel_tol * 100)}%)"

    def judge(self, agent: Value, smi: Value) -> str:
        if agent is None or smi is None:
            return NA
        if self.text or isinstance(agent, str) or isinstance(smi, str):
            return YES if str(agent) == str(smi) else NO
        a, s = float(agent), float(smi)
        return YES if abs(a - s) <= self.allowed(a, s) + 1e-9 else NO


GPU_SPECS: tuple[Spec, ...] = (
    Spec("uuid", text=True, why="identity"),
    Spec("name", text=True, why="identity: NVML's device name, nvidia-smi's product_name"),
    Spec("temperature.gpu", "C", abs_tol=3, drift=True, why="the die moves degrees a second"),
    Spec("temperature.memory", "C", abs_tol=3, drift=True, why="HBM (NVML field 82)"),
    Spec(
        "power.draw",
        "W",
        abs_tol=30,
        rel_tol=0.10,
        drift=True,
        why="a training step swings it by hundreds of W: judge power on an idle node."
        " nvidia-smi side: <power_draw> (the agent's call), else <average_power_draw>",
    ),
    Spec("clocks.sm", "MHz", abs_tol=30, rel_tol=0.10, drift=True, why="boost and idle"),
    Spec("clocks.mem", "MHz", abs_tol=10, rel_tol=0.01, drift=True, why="HBM, near fixed"),
    Spec("memory.total", "MiB", abs_tol=1, why="nvidia-smi rounds to MiB"),
    Spec(
        "memory.used",
        "MiB",
        abs_tol=256,
        drift=True,
        why="the agent's NVML call (v1) counts reserved memory as used, nvidia-smi prints it"
        " apart: its side is used + reserved",
    ),
    Spec("memory.free", "MiB", abs_tol=256, drift=True),
    Spec(
        "utilization.gpu",
        "%",
        abs_tol=20,
        drift=True,
        why="NVML samples over 1/6 to 1 s; a training step alternates compute and comms",
    ),
    Spec("utilization.memory", "%", abs_tol=20, drift=True),
    Spec("ecc.volatile.corrected", why="nvidia-smi side: SRAM + DRAM correctable"),
    Spec("ecc.volatile.uncorrected", why="nvidia-smi side: SRAM (parity + SEC-DED) + DRAM"),
    Spec("ecc.aggregate.corrected"),
    Spec("ecc.aggregate.uncorrected"),
    Spec("remapped_rows.correctable"),
    Spec("remapped_rows.uncorrectable"),
    Spec("remapped_rows.pending", why="1 = Yes"),
    Spec("remapped_rows.failure", why="1 = Yes"),
    Spec("retired_pages.single_bit_ecc", why="N/A on both sides from A100 on (rows remap)"),
    Spec("retired_pages.double_bit_ecc"),
    Spec("retired_pages.pending", why="1 = Yes"),
    Spec("pcie.link.gen.current", why="an idle link may train down"),
    Spec("pcie.link.gen.max"),
    Spec("pcie.link.width.current"),
    Spec("pcie.link.width.max"),
    Spec("pcie.replay_counter"),
    Spec(
        "clocks_event_reasons",
        text=True,
        drift=True,
        why="the active set, exact, though gpu_idle and sw_power_cap flip",
    ),
    Spec("compute_processes", drift=True, why="nvidia-smi side: process types with a C"),
    Spec("fabric.state", text=True, why="NVLink fabric registration; N/A where there is none"),
    Spec("fabric.healthy", why="1 = state Completed with status Success"),
)
NVLINK_SPEC = Spec("nvlink[n].active", why="per link: 1 = active (nvidia-smi nvlink -s speed)")
PRESENT_SPEC = Spec("present", text=True, why="the GPU is on both sides (joined on PCI bus id)")
NODE_SPECS: tuple[Spec, ...] = (
    Spec("driver_version", text=True, why="node"),
    Spec("gpu_count", why="node: NVML's device count, nvidia-smi's attached_gpus"),
)
_SPEC_BY_KEY = {s.key: s for s in (*GPU_SPECS, *NODE_SPECS, PRESENT_SPEC)}
_NVLINK_KEY = re.compile(r"^nvlink\[(\d+)\]\.active$")


def nvlink_key(link: int) -> str:
    return f"nvlink[{link}].active"


def spec_for(key: str) -> Spec:
    if _NVLINK_KEY.match(key):
        return NVLINK_SPEC
    return _SPEC_BY_KEY[key]


# ----- one side's readings -----------------------------------------------------------------------


@dataclass
class Side:
    """One side's readings, in nvidia-smi's units: node-wide values and per-GPU values keyed by
    normalised PCI bus id, each GPU's index as that side numbers it, and notes on where a value
    came from (which XML element, what was added)."""

    node: dict[str, Value] = field(default_factory=dict)
    gpus: dict[str, dict[str, Value]] = field(default_factory=dict)
    index: dict[str, int] = field(default_factory=dict)
    notes: dict[tuple[str, str], str] = field(default_factory=dict)

    def gpu(self, bus: str, index: int) -> dict[str, Value]:
        self.index.setdefault(bus, index)
        return self.gpus.setdefault(bus, {})

    def bus_of_uuid(self) -> dict[str, str]:
        return {str(v["uuid"]): bus for bus, v in self.gpus.items() if v.get("uuid")}


def bus_key(bus_id: str) -> str:
    """'00000000:53:00.0', '0000:53:00.0' and '53:00.0' -> '0000:53:00.0'."""
    text = bus_id.strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)$", text)
    if not m:
        return text
    domain, bus, dev, fn = (int(g or "0", 16) for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


# ----- nvidia-smi -q -x ------------------------------------------------------------------------

_NOT_A_VALUE = re.compile(
    r"^\[?(n/a|not supported|unknown error|gpu is lost|requested .*)\]?$", re.I
)
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(?:[a-z%/]+\s*)*$", re.I)

# Power: nvidia-smi < 565 prints <power_draw> (nvmlDeviceGetPowerUsage, the agent's call: a 1 s
# average from Ampere on, GA100 excepted); newer ones split it into <average_power_draw> (the same
# 1 s average) and <instant_power_draw>. Before ~530 the block was <power_readings>.
_POWER_PATHS = tuple(
    f"{block}/{name}"
    for block in ("gpu_power_readings", "power_readings")
    for name in ("power_draw", "average_power_draw", "instant_power_draw")
)
# nvidia-smi's clock event (throttle) reason names -> the agent's reason label.
_REASON_NAMES = {"display_clocks_setting": "display_clock_setting"}
_FABRIC_STATES = {
    "not supported": "not_supported",
    "not started": "not_started",
    "in progress": "in_progress",
    "completed": "completed",
}


def smi_value(text: str | None) -> str | None:
    """An element's text, None for nvidia-smi's ways of saying "no reading"."""
    if text is None:
        return None
    text = " ".join(text.split())
    if not text or _NOT_A_VALUE.match(text):
        return None
    return text


def smi_number(text: str | None) -> float | None:
    """'45 C', '571.22 W', '81559 MiB', '16x', '2 %' -> the number; None when not a number."""
    value = smi_value(text)
    if value is None:
        return None
    m = _NUMBER.match(value)
    if not m:
        m = re.match(r"^(\d+)x$", value)
    return float(m.group(1)) if m else None


def smi_flag(text: str | None) -> float | None:
    value = smi_value(text)
    if value is None:
        return None
    return {"yes": 1.0, "no": 0.0}.get(value.lower())


def _find_number(gpu: ET.Element, path: str) -> float | None:
    return smi_number(gpu.findtext(path))


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _ecc(gpu: ET.Element, scope: str) -> tuple[float | None, float | None]:
    """(corrected, uncorrected) totals of one scope, as NVML's total-ECC call counts them.

    Hopper-era drivers (550+): sram_correctable, sram_uncorrectable_parity,
    sram_uncorrectable_secded, dram_correctable, dram_uncorrectable; 510-535: one
    sram_uncorrectable; before Ampere-era drivers: single_bit/total and double_bit/total.
    """
    block = gpu.find(f"ecc_errors/{scope}")
    if block is None:
        return None, None
    if block.find("single_bit") is not None or block.find("double_bit") is not None:
        return (
            smi_number(block.findtext("single_bit/total")),
            smi_number(block.findtext("double_bit/total")),
        )

    def n(name: str) -> float | None:
        return smi_number(block.findtext(name))

    sram_unc = n("sram_uncorrectable")
    if sram_unc is None:
        sram_unc = _sum((n("sram_uncorrectable_parity"), n("sram_uncorrectable_secded")))
    corrected = _sum((n("sram_correctable"), n("dram_correctable")))
    uncorrected = _sum((sram_unc, n("dram_uncorrectable")))
    return corrected, uncorrected


def _reasons(gpu: ET.Element) -> str | None:
    for block_name, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        block = gpu.find(block_name)
        if block is None:
            continue
        active: list[str] = []
        seen = False
        for child in block:
            state = smi_value(child.text)
            if state is None or not child.tag.startswith(prefix):
                continue
            seen = True
            if state.lower() == "active":
                name = child.tag[len(prefix) :]
                active.append(_REASON_NAMES.get(name, name))
        return reason_set(active) if seen else None
    return None


def reason_set(reasons: Iterable[str]) -> str:
    names = sorted(set(reasons))
    return ",".join(names) if names else "none"


def _processes(gpu: ET.Element) -> float | None:
    block = gpu.find("processes")
    if block is None or (smi_value(block.text) is not None and not len(block)):
        return None  # absent, or "N/A" in place of the list
    count = 0
    for proc in block.findall("process_info"):
        kind = smi_value(proc.findtext("type")) or "C"
        count += "C" in kind.upper()
    return float(count)


def parse_smi_xml(text: str) -> Side:
    """`nvidia-smi -q -x` -> its readings per GPU, in nvidia-smi's units."""
    root = ET.fromstring(text)
    side = Side()
    side.node["driver_version"] = smi_value(root.findtext("driver_version"))
    side.node["gpu_count"] = smi_number(root.findtext("attached_gpus"))
    for position, g in enumerate(root.findall("gpu")):
        raw_bus = g.get("id") or g.findtext("pci/pci_bus_id") or f"#{position}"
        bus = bus_key(raw_bus)
        v = side.gpu(bus, position)
        v["uuid"] = smi_value(g.findtext("uuid"))
        v["name"] = smi_value(g.findtext("product_name"))
        v["temperature.gpu"] = _find_number(g, "temperature/gpu_temp")
        v["temperature.memory"] = _find_number(g, "temperature/memory_temp")
        v["power.draw"] = None
        for path in _POWER_PATHS:
            watts = _find_number(g, path)
            if watts is not None:
                v["power.draw"] = watts
                side.notes[(bus, "power.draw")] = f"<{path}>"
                break
        v["clocks.sm"] = _find_number(g, "clocks/sm_clock")
        v["clocks.mem"] = _find_number(g, "clocks/mem_clock")
        v["memory.total"] = _find_number(g, "fb_memory_usage/total")
        used = _find_number(g, "fb_memory_usage/used")
        reserved = _find_number(g, "fb_memory_usage/reserved")
        if used is not None and reserved is not None:
            used += reserved
            side.notes[(bus, "memory.used")] = f"used + reserved ({_fmt(reserved)} MiB)"
        v["memory.used"] = used
        v["memory.free"] = _find_number(g, "fb_memory_usage/free")
        v["utilization.gpu"] = _find_number(g, "utilization/gpu_util")
        v["utilization.memory"] = _find_number(g, "utilization/memory_util")
        for scope in ("volatile", "aggregate"):
            corrected, uncorrected = _ecc(g, scope)
            v[f"ecc.{scope}.corrected"] = corrected
            v[f"ecc.{scope}.uncorrected"] = uncorrected
        v["remapped_rows.correctable"] = _find_number(g, "remapped_rows/remapped_row_corr")
        v["remapped_rows.uncorrectable"] = _find_number(g, "remapped_rows/remapped_row_unc")
        v["remapped_rows.pending"] = smi_flag(g.findtext("remapped_rows/remapped_row_pending"))
        v["remapped_rows.failure"] = smi_flag(g.findtext("remapped_rows/remapped_row_failure"))
        v["retired_pages.single_bit_ecc"] = _find_number(
            g, "retired_pages/multiple_single_bit_retirement/retired_count"
        )
        v["retired_pages.double_bit_ecc"] = _find_number(
            g, "retired_pages/double_bit_retirement/retired_count"
        )
        pending = smi_flag(g.findtext("retired_pages/pending_retirement"))
        if pending is None:
            pending = smi_flag(g.findtext("retired_pages/pending_blacklist"))  # before r450
        v["retired_pages.pending"] = pending
        link = "pci/pci_gpu_link_info"
        v["pcie.link.gen.current"] = _find_number(g, f"{link}/pcie_gen/current_link_gen")
        v["pcie.link.gen.max"] = _find_number(g, f"{link}/pcie_gen/max_link_gen")
        v["pcie.link.width.current"] = _find_number(g, f"{link}/link_widths/current_link_width")
        v["pcie.link.width.max"] = _find_number(g, f"{link}/link_widths/max_link_width")
        v["pcie.replay_counter"] = _find_number(g, "pci/replay_counter")
        v["clocks_event_reasons"] = _reasons(g)
        v["compute_processes"] = _processes(g)
        state = " ".join((g.findtext("fabric/state") or "").split())  # "Not Supported" is one
        v["fabric.state"] = (
            None if state.upper() in ("", "N/A") else _FABRIC_STATES.get(state.lower(), state)
        )
        status = smi_value(g.findtext("fabric/status"))
        v["fabric.healthy"] = (
            None
            if v["fabric.state"] != "completed" or status is None
            else float(status.lower() == "success")
        )
    return side


# ----- nvidia-smi nvlink -s --------------------------------------------------------------------

_NVLINK_GPU = re.compile(r"^GPU (\d+):.*?(?:\(UUID: (GPU-[0-9A-Za-z-]+)\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_NVLINK_SPEED = re.compile(r"^([\d.]+)\s*[GM]B/s$", re.I)


@dataclass(frozen=True, slots=True)
class NvLinkStatus:
    """One GPU's `nvidia-smi nvlink -s` block: link -> active (None: a status not understood)."""

    index: int
    uuid: str | None
    links: Mapping[int, bool | None]


def parse_nvlink_status(text: str) -> list[NvLinkStatus]:
    """`nvidia-smi nvlink -s`: 'GPU 0: NAME (UUID: GPU-...)' then 'Link 0: 26.562 GB/s' or
    'Link 0: <inactive>' lines. A GPU with no NVLink prints its header and nothing else."""
    out: list[NvLinkStatus] = []
    current: tuple[int, str | None] | None = None
    links: dict[int, bool | None] = {}

    def flush() -> None:
        if current is not None:
            out.append(NvLinkStatus(current[0], current[1], dict(links)))

    for line in text.splitlines():
        gpu = _NVLINK_GPU.match(line.strip())
        if gpu:
            flush()
            current, links = (int(gpu.group(1)), gpu.group(2)), {}
            continue
        link = _NVLINK_LINK.match(line)
        if link and current is not None:
            status = link.group(2)
            speed = _NVLINK_SPEED.match(status)
            if speed:
                links[int(link.group(1))] = float(speed.group(1)) > 0
            elif "inactive" in status.lower():
                links[int(link.group(1))] = False
            else:
                links[int(link.group(1))] = None
    flush()
    return out


def add_nvlinks(side: Side, statuses: Sequence[NvLinkStatus]) -> None:
    """Put `nvidia-smi nvlink -s` into an nvidia-smi side, joined on UUID (else on index)."""
    by_uuid = side.bus_of_uuid()
    by_index = {i: bus for bus, i in side.index.items()}
    for st in statuses:
        bus = by_uuid.get(st.uuid or "") or by_index.get(st.index)
        if bus is None:
            continue
        for link, up in st.links.items():
            side.gpus[bus][nvlink_key(link)] = None if up is None else float(up)


# ----- the agent's exposition ------------------------------------------------------------------

# Per-GPU gauge or counter sample name -> (key, factor to nvidia-smi's unit).
_AGENT_PLAIN: dict[str, tuple[str, float]] = {
    "topowatch_gpu_temperature_celsius": ("temperature.gpu", 1.0),
    "topowatch_gpu_memory_temperature_celsius": ("temperature.memory", 1.0),
    "topowatch_gpu_power_watts": ("power.draw", 1.0),
    "topowatch_gpu_sm_clock_hertz": ("clocks.sm", 1e-6),
    "topowatch_gpu_memory_clock_hertz": ("clocks.mem", 1e-6),
    "topowatch_gpu_memory_total_bytes": ("memory.total", 1 / MIB),
    "topowatch_gpu_memory_used_bytes": ("memory.used", 1 / MIB),
    "topowatch_gpu_memory_free_bytes": ("memory.free", 1 / MIB),
    "topowatch_gpu_utilization_ratio": ("utilization.gpu", 100.0),
    "topowatch_gpu_memory_utilization_ratio": ("utilization.memory", 100.0),
    "topowatch_gpu_remapped_rows_pending": ("remapped_rows.pending", 1.0),
    "topowatch_gpu_remapped_rows_failure": ("remapped_rows.failure", 1.0),
    "topowatch_gpu_retired_pages_pending": ("retired_pages.pending", 1.0),
    "topowatch_gpu_pcie_link_generation": ("pcie.link.gen.current", 1.0),
    "topowatch_gpu_pcie_link_generation_max": ("pcie.link.gen.max", 1.0),
    "topowatch_gpu_pcie_link_width": ("pcie.link.width.current", 1.0),
    "topowatch_gpu_pcie_link_width_max": ("pcie.link.width.max", 1.0),
    "topowatch_gpu_pcie_replays_total": ("pcie.replay_counter", 1.0),
    "topowatch_gpu_compute_processes": ("compute_processes", 1.0),
    "topowatch_gpu_fabric_healthy": ("fabric.healthy", 1.0),
}
_AGENT_CAUSES = {
    ("topowatch_gpu_remapped_rows_total", "correctable"): "remapped_rows.correctable",
    ("topowatch_gpu_remapped_rows_total", "uncorrectable"): "remapped_rows.uncorrectable",
    ("topowatch_gpu_retired_pages_total", "single_bit_ecc"): "retired_pages.single_bit_ecc",
    ("topowatch_gpu_retired_pages_total", "double_bit_ecc"): "retired_pages.double_bit_ecc",
}


def parse_exposition(text: str) -> Side:
    """The agent's Prometheus text exposition -> its readings per GPU, in nvidia-smi's units."""
    from prometheus_client.parser import text_string_to_metric_families

    side = Side()
    reasons: dict[str, list[str]] = {}
    nvlinks: list[tuple[str, int, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name == "topowatch_gpu_driver_info":
                side.node["driver_version"] = labels.get("driver_version") or None
            elif name == "topowatch_gpus":
                side.node["gpu_count"] = value
            elif name == "topowatch_nvml_up":
                side.node["nvml_up"] = value
            elif name == "topowatch_nvlink_up":
                nvlinks.append((labels.get("uuid", ""), int(labels.get("link", "-1")), value))
            if "pci_bus_id" not in labels or "gpu" not in labels:
                continue
            bus = bus_key(labels["pci_bus_id"])
            v = side.gpu(bus, int(labels["gpu"]))
            v.setdefault("uuid", labels.get("uuid") or None)
            v.setdefault("name", labels.get("model") or None)
            reasons.setdefault(bus, [])
            if name == "topowatch_gpu_up":
                v["up"] = value
            elif name in _AGENT_PLAIN:
                key, factor = _AGENT_PLAIN[name]
                v[key] = value * factor
            elif name == "topowatch_gpu_ecc_errors_total":
                v[f"ecc.{labels.get('scope')}.{labels.get('type')}"] = value
            elif (name, labels.get("cause", "")) in _AGENT_CAUSES:
                v[_AGENT_CAUSES[(name, labels["cause"])]] = value
            elif name == "topowatch_gpu_clock_event_reason" and value:
                reasons[bus].append(labels.get("reason", ""))
            elif name == "topowatch_gpu_fabric_info":
                v["fabric.state"] = labels.get("state") or None
    for bus, active in reasons.items():
        if side.gpus[bus].get("up", 1.0):  # a GPU that did not answer has no reasons to show
            side.gpus[bus]["clocks_event_reasons"] = reason_set(active)
    by_uuid = side.bus_of_uuid()
    for uuid, link, up in nvlinks:
        owner = by_uuid.get(uuid)
        if owner is not None and link >= 0:
            side.gpus[owner][nvlink_key(link)] = up
    return side


# ----- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    field: str
    gpu: str
    agent: str
    smi: str
    match: str
    tolerance: str
    note: str = ""


def _fmt(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _link_order(key: str) -> int:
    m = _NVLINK_KEY.match(key)
    return int(m.group(1)) if m else -1


def compare(agent: Side, smi: Side) -> list[Row]:
    """Every comparable reading: node-wide rows, then per GPU (joined on PCI bus id) each
    field of GPU_SPECS and each NVLink either side knows."""
    rows = [
        Row(
            s.key,
            "-",
            _fmt(agent.node.get(s.key)),
            _fmt(smi.node.get(s.key)),
            s.judge(agent.node.get(s.key), smi.node.get(s.key)),
            s.tolerance(),
        )
        for s in NODE_SPECS
    ]
    buses = sorted(
        set(agent.gpus) | set(smi.gpus),
        key=lambda b: (agent.index.get(b, smi.index.get(b, 1 << 30)), b),
    )
    for bus in buses:
        gpu = str(agent.index.get(bus, smi.index.get(bus, "?")))
        a, s = agent.gpus.get(bus), smi.gpus.get(bus)
        if a is None or s is None:
            rows.append(
                Row(
                    PRESENT_SPEC.key,
                    gpu,
                    "yes" if a is not None else "no",
                    "yes" if s is not None else "no",
                    NO,
                    PRESENT_SPEC.tolerance(),
                    bus,
                )
            )
            continue
        links = sorted({k for k in (*a, *s) if _NVLINK_KEY.match(k)}, key=_link_order)
        for key in (*(spec.key for spec in GPU_SPECS), *links):
            spec = spec_for(key)
            av, sv = a.get(key), s.get(key)
            note = smi.notes.get((bus, key), "")
            if key == "uuid":
                note = bus if a.get("up", 1.0) else f"{bus}; the agent could not read this GPU"
            rows.append(
                Row(key, gpu, _fmt(av), _fmt(sv), spec.judge(av, sv), spec.tolerance(), note)
            )
    return rows


# ----- XID event registration --------------------------------------------------------------------


@dataclass
class XidProbe:
    """What the agent's XID thread did with NVML, seen through `NvmlSpy`."""

    create: str | None = None  # None: never called; "ok"; else the error
    registrations: dict[str, str] = field(default_factory=dict)  # bus -> "ok" | the error
    waits: int = 0  # nvmlEventSetWait_v2 calls that returned or timed out: the waiter runs
    events: int = 0  # events that arrived while the check ran (real XIDs!)
    wait_errors: list[str] = field(default_factory=list)
    agent_error: str | None = None  # NvmlGpuSource.xid_error: the agent's own account
    checked: bool = True  # False: the agent ran in a subprocess (--cli), nothing to see


def xid_rows(probe: XidProbe, agent: Side) -> list[Row]:
    """Rows saying whether XID events can reach the agent: the event set exists, every GPU is
    registered for XID critical errors, a thread waits on it, and the agent reports no error."""
    outside = "(not in nvidia-smi)"
    if not probe.checked:
        return [Row("xid.event_set", "-", "not checked (--cli)", outside, NA, "-")]
    rows = [
        Row(
            "xid.event_set",
            "-",
            "created" if probe.create == "ok" else (probe.create or "never created"),
            outside,
            YES if probe.create == "ok" else NO,
            "created",
            "nvmlEventSetCreate",
        )
    ]
    for bus in sorted(
        set(agent.gpus) | set(probe.registrations), key=lambda b: (agent.index.get(b, 1 << 30), b)
    ):
        result = probe.registrations.get(bus)
        rows.append(
            Row(
                "xid.registered",
                str(agent.index.get(bus, "?")),
                "yes" if result == "ok" else (result or "never registered"),
                outside,
                YES if result == "ok" else NO,
                "registered",
                "nvmlDeviceRegisterEvents(XidCriticalError)",
            )
        )
    waiting = probe.waits > 0 and not probe.wait_errors
    rows.append(
        Row(
            "xid.waiting",
            "-",
            f"{probe.waits} waits, {probe.events} events"
            + (f", errors: {'; '.join(probe.wait_errors[:2])}" if probe.wait_errors else ""),
            outside,
            YES if waiting else NO,
            "waits, no errors",
            "nvmlEventSetWait_v2",
        )
    )
    rows.append(
        Row(
            "xid.agent_error",
            "-",
            probe.agent_error or "none",
            outside,
            YES if probe.agent_error is None else NO,
            "none",
            "NvmlGpuSource.xid_error",
        )
    )
    return rows


class NvmlSpy:
    """pynvml (or a stand-in) passed through untouched, with the XID thread's three calls
    recorded in `probe`: nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2.
    With `timed`, every other `nvml*` function also adds its calls and the process CPU time
    around them to `costs` (name -> [calls, seconds])."""

    def __init__(self, nvml: Any, timed: bool = False) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self.probe = XidProbe()
        self.costs: dict[str, list[float]] = {}
        self._timed = timed
        self._wrapped: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (self._timed and name.startswith("nvml") and callable(value)):
            return value
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            wrapped = self._wrapped[name] = self._timing(name, value)
        return wrapped

    def _timing(self, name: str, fn: Any) -> Any:
        costs = self.costs.setdefault(name, [0, 0.0])
        clock = time.process_time

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - t0
                costs[0] += 1
                costs[1] += spent

        timed.__name__ = name
        return timed

    def reset_costs(self) -> None:
        for entry in self.costs.values():
            entry[0], entry[1] = 0, 0.0

    def _bus(self, handle: Any) -> str:
        try:
            raw = self._nvml.nvmlDeviceGetPciInfo(handle).busId
        except Exception as e:
            return f"? ({e})"
        return bus_key(raw.decode() if isinstance(raw, bytes) else str(raw))

    def nvmlEventSetCreate(self) -> Any:
        try:
            event_set = self._nvml.nvmlEventSetCreate()
        except Exception as e:
            self.probe.create = f"failed: {e}"
            raise
        self.probe.create = "ok"
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        bus = self._bus(handle)
        try:
            self._nvml.nvmlDeviceRegisterEvents(handle, event_types, event_set)
        except Exception as e:
            with self._lock:
                self.probe.registrations[bus] = f"failed: {e}"
            raise
        xid = int(self._nvml.nvmlEventTypeXidCriticalError)
        with self._lock:
            self.probe.registrations[bus] = (
                "ok"
                if int(event_types) & xid
                else f"registered without the XID bit ({event_types:#x})"
            )

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            data = self._nvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except Exception as e:
            with self._lock:
                if getattr(e, "value", None) == self._nvml.NVML_ERROR_TIMEOUT:
                    self.probe.waits += 1
                else:
                    self.probe.wait_errors.append(str(e))
            raise
        with self._lock:
            self.probe.waits += 1
            self.probe.events += 1
        return data


# ----- what NVML costs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostRow:
    function: str
    calls_per_gpu_poll: float
    ms_per_call: float
    ms_per_gpu_poll: float


@dataclass
class CostRun:
    """What `measure_costs` saw: per function (calls, CPU seconds) over `polls` polls of
    `gpus` GPUs, and the process CPU of the whole polls."""

    gpus: int
    polls: int
    interval: float
    calls: dict[str, tuple[int, float]]
    poll_seconds: float


def cost_rows(calls: Mapping[str, tuple[int, float]], gpus: int, polls: int) -> list[CostRow]:
    """Per NVML function: calls and CPU per GPU per poll, dearest first; functions not called
    in the measured polls are left out."""
    per = max(1, gpus * polls)
    rows = [
        CostRow(name, n / per, seconds * 1e3 / n, seconds * 1e3 / per)
        for name, (n, seconds) in calls.items()
        if n
    ]
    return sorted(rows, key=lambda r: (-r.ms_per_gpu_poll, r.function))


def render_costs(run: CostRun) -> str:
    rows = cost_rows(run.calls, run.gpus, run.polls)
    total = sum(r.ms_per_gpu_poll for r in rows)
    calls = sum(r.calls_per_gpu_poll for r in rows)
    lines = [
        f"NVML CPU cost ({run.polls} polls every {run.interval:g} s, {run.gpus} GPUs; process"
        " time around each call):",
        f"  {'function':<44} {'calls/GPU/poll':>14} {'ms/call':>9} {'ms/GPU/poll':>12}",
    ]
    for r in rows:
        lines.append(
            f"  {r.function:<44} {r.calls_per_gpu_poll:14.2f} {r.ms_per_call:9.3f}"
            f" {r.ms_per_gpu_poll:12.3f}"
        )
    per = max(1, run.gpus * run.polls)
    node_mcpu = total * run.gpus / run.interval if run.interval > 0 else float("nan")
    lines.append(
        f"  {'NVML, all functions':<44} {calls:14.2f} {'':>9} {total:12.3f}"
        f"   ({node_mcpu:.2f} mCPU for the node at {run.interval:g} s)"
    )
    lines.append(
        f"  {'whole poll (the agent, process time)':<44} {'':>14} {'':>9}"
        f" {run.poll_seconds * 1e3 / per:12.3f}"
    )
    return "\n".join(lines)


def measure_costs(nvml: Any, polls: int, interval: float) -> CostRun:
    """A fresh production source and poller over `nvml` behind a timing `NvmlSpy`: one warm-up
    poll, then `polls` polls `interval` s apart, every NVML function timed."""
    from exporter.node.poller import NodeSources, Poller
    from exporter.sources.kube import StaticNodeLabels
    from exporter.sources.nvml import NvmlGpuSource

    spy = NvmlSpy(nvml, timed=True)
    sources = NodeSources(gpu=NvmlGpuSource(spy), labels=StaticNodeLabels({}))
    poller = Poller(socket.gethostname(), sources)
    try:
        first, _ = poller.poll()  # enumeration and discovery: once, not per poll
        if not first.gpu.available:
            raise Absent(f"NVML unavailable: {first.gpu.error}")
        gpus = len(first.gpu.gpus)
        spy.reset_costs()
        spent = 0.0
        for _ in range(polls):
            time.sleep(interval)
            t0 = time.process_time()
            poller.poll()
            spent += time.process_time() - t0
        calls = {name: (int(n), float(sec)) for name, (n, sec) in spy.costs.items()}
        return CostRun(gpus, polls, interval, calls, spent)
    finally:
        sources.close()


# ----- printing ---------------------------------------------------------------------------------

HEADERS = ("field", "gpu", "agent", "nvidia-smi", "match", "tolerance", "note")


def render_table(rows: Sequence[Row], only_mismatches: bool = False) -> str:
    shown = [r for r in rows if r.match == NO] if only_mismatches else list(rows)
    cells = [HEADERS] + [
        (r.field, r.gpu, r.agent, r.smi, r.match, r.tolerance, r.note) for r in shown
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS) - 1)]
    lines = []
    for i, c in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=False)) + "  " + c[-1])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 4)
    return "\n".join(line.rstrip() for line in lines)


def summary(rows: Sequence[Row]) -> str:
    counts = {k: sum(1 for r in rows if r.match == k) for k in (YES, NO, NA)}
    return (
        f"{len(rows)} rows: {counts[YES]} match, {counts[NO]} mismatch, "
        f"{counts[NA]} N/A (a side has no reading)"
    )


def legend() -> str:
    lines = [
        "Tolerances, in nvidia-smi's units. The agent reads first, nvidia-smi 1-3 s later, so",
        "instantaneous readings (~) may drift and get a tolerance; counters and fixed facts must",
        "agree exactly (a counter that moved between the two reads is itself worth a look).",
    ]
    for s in (*NODE_SPECS, PRESENT_SPEC, *GPU_SPECS, NVLINK_SPEC):
        unit = f" [{s.unit}]" if s.unit else ""
        mark = " ~" if s.drift else ""
        why = f". {s.why}" if s.why else ""
        lines.append(f"  {s.key}{unit}: {s.tolerance()}{mark}{why}")
    lines.append("  xid.*: the agent's XID thread, watched through its NVML calls (no XID can")
    lines.append("    be injected): event set created, every GPU registered, waiting, no error.")
    return "\n".join(lines)


# ----- running the real things --------------------------------------------------------------------


class Absent(Exception):
    """nvidia-smi or NVML is not there (or does not answer): exit 2."""


@dataclass
class AgentRun:
    exposition: str
    probe: XidProbe


def run_agent_in_process(nvml: Any = None, settle: float = 1.0, xid_wait: float = 5.0) -> AgentRun:
    """The production poller over the production NVML source, as `topowatch node --once
    --no-kubernetes` wires them, with `nvml` (default: the real pynvml) behind `NvmlSpy`."""
    from exporter.node.poller import NodeSources, Poller
    from exporter.sources.kube import StaticNodeLabels
    from exporter.sources.nvml import NvmlGpuSource

    if nvml is None:
        try:
            import pynvml
        except ImportError as e:
            raise Absent(f"pynvml is not installed: {e}") from e
        nvml = pynvml
    spy = NvmlSpy(nvml)
    gpu = NvmlGpuSource(spy)
    gpu.start()
    sources = NodeSources(gpu=gpu, labels=StaticNodeLabels({}))
    poller = Poller(socket.gethostname(), sources)
    try:
        first, _ = poller.poll()
        if not first.gpu.available:
            raise Absent(f"NVML unavailable: {first.gpu.error}")
        time.sleep(settle)  # GPM and XID registration want a second poll, as --once does
        deadline = time.monotonic() + xid_wait
        while time.monotonic() < deadline and not _xid_settled(spy.probe, len(first.gpu.gpus)):
            time.sleep(0.05)
        _, exposition = poller.poll()
        spy.probe.agent_error = gpu.xid_error
        return AgentRun(exposition.text.decode(), spy.probe)
    finally:
        sources.close()


def _xid_settled(probe: XidProbe, gpus: int) -> bool:
    if probe.create is not None and probe.create != "ok":
        return True
    return len(probe.registrations) >= gpus and (probe.waits > 0 or bool(probe.wait_errors))


def run_agent_cli(timeout: float = 120.0) -> AgentRun:
    """`topowatch node --once --no-kubernetes --no-health` in a subprocess: its stdout."""
    cmd = [sys.executable, "-m", "exporter.cli", "node", "--once", "--no-kubernetes", "--no-health"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise Absent(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return AgentRun(done.stdout, XidProbe(checked=False))


def run_smi(smi: str, timeout: float = 120.0) -> tuple[str, str | None, str]:
    """`nvidia-smi -q -x` (required) and `nvidia-smi nvlink -s` (optional): (xml, nvlink or
    None, a note on the nvlink read)."""
    try:
        q = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        raise Absent(f"cannot run {smi}: {e}") from e
    if q.returncode != 0 or "<nvidia_smi_log" not in q.stdout:
        said = (q.stdout + q.stderr).strip()[-2000:]
        raise Absent(f"{smi} -q -x exited {q.returncode}: {said}")
    try:
        nv = subprocess.run([smi, "nvlink", "-s"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return q.stdout, None, f"nvidia-smi nvlink -s failed: {e}"
    if nv.returncode != 0:
        return q.stdout, None, f"nvidia-smi nvlink -s exited {nv.returncode}: {nv.stderr.strip()}"
    return q.stdout, nv.stdout, ""


def check(
    exposition: str,
    smi_xml: str,
    nvlink_status: str | None = None,
    probe: XidProbe | None = None,
) -> list[Row]:
    """Everything from text: the rows of the table (XID rows when a probe is given)."""
    agent = parse_exposition(exposition)
    smi = parse_smi_xml(smi_xml)
    if nvlink_status is not None:
        add_nvlinks(smi, parse_nvlink_status(nvlink_status))
    rows = compare(agent, smi)
    if probe is not None:
        rows += xid_rows(probe, agent)
    return rows


def main(argv: Sequence[str] | None = None, nvml: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nvidia-smi", default=None, help="path to nvidia-smi (default: on PATH)")
    p.add_argument("--cli", action="store_true", help="run `topowatch node --once` instead")
    p.add_argument("--exposition", type=Path, help="a recorded agent exposition to compare")
    p.add_argument("--smi-xml", type=Path, help="a recorded `nvidia-smi -q -x` to compare")
    p.add_argument("--nvlink-status", type=Path, help="a recorded `nvidia-smi nvlink -s`")
    p.add_argument("--only-mismatches", action="store_true", help="print only the NO rows")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between the two polls")
    p.add_argument("--cost-polls", type=int, default=12, help="polls to time NVML over (0: do not)")
    p.add_argument("--cost-interval", type=float, default=5.0, help="seconds between them")
    args = p.parse_args(argv)

    smi = None
    if args.smi_xml is None:
        smi = args.nvidia_smi or shutil.which("nvidia-smi")
        if smi is None or not Path(smi).exists():
            print("gpu_check: nvidia-smi not found (no NVIDIA driver here?); nothing to compare.")
            return 2
    notes: list[str] = []
    try:
        if args.exposition is not None:
            run = AgentRun(args.exposition.read_text(), XidProbe(checked=False))
        elif args.cli:
            run = run_agent_cli()
        else:
            run = run_agent_in_process(nvml=nvml, settle=args.settle)
        if not parse_exposition(run.exposition).node.get("nvml_up", 1.0):
            raise Absent("NVML unavailable: the agent exports topowatch_nvml_up 0")
        if smi is None:
            xml_text = args.smi_xml.read_text()
            nvlink = args.nvlink_status.read_text() if args.nvlink_status else None
        else:
            xml_text, nvlink, note = run_smi(smi)
            if note:
                notes.append(note)
    except Absent as e:
        print(f"gpu_check: {e}")
        return 2
    probe = run.probe if run.probe.checked or args.cli else None
    rows = check(run.exposition, xml_text, nvlink, probe)
    print(render_table(rows, args.only_mismatches))
    print()
    print(summary(rows))
    for note in notes:
        print(f"note: {note}")
    if nvlink is None:
        print("note: no `nvidia-smi nvlink -s` output: NVLink rows are N/A on the nvidia-smi side")
    print()
    print(legend())
    print()
    if args.exposition is not None or args.cli or args.cost_polls <= 0:
        why = "recorded files" if args.exposition is not None else "--cli"
        print(f"NVML CPU cost: not measured ({why if args.cost_polls > 0 else '--cost-polls 0'})")
        return 0
    try:
        costs = measure_costs(
            _pynvml() if nvml is None else nvml, args.cost_polls, args.cost_interval
        )
    except Absent as e:
        print(f"NVML CPU cost: not measured ({e})")
        return 0
    print(render_costs(costs))
    return 0


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise Absent(f"pynvml is not installed: {e}") from e
    return pynvml


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
