"""NvmlGpuSource over the simulated NVML library, for both hardware profiles.

The simulation counts every NVML function called and every field id requested, so these tests
check not only what a user sees in the readings but also how the source asked for it.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pynvml
import pytest

from exporter.core.snapshot import (
    NVML_TIMEOUT,
    PROFILING_KEYS,
    VIOLATION_POLICIES,
    GpuInventory,
    XidEvent,
)
from exporter.sim.faults import Fault, parse_fault
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import HardwareProfile, get_profile
from exporter.sources.nvml import ENERGY_INTERVAL_SECONDS, GPM_INTERVAL_SECONDS, NvmlGpuSource

PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")
BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Rig:
    """A simulated node's NVML and the source reading it, on one fake clock."""

    def __init__(
        self,
        profile: HardwareProfile,
        faults: Sequence[Fault],
        source: dict[str, Any] | None = None,
        **sim: Any,
    ) -> None:
        self.profile = profile
        self.clock = FakeClock()
        self.sim = SimulatedNvml(profile, faults, seed=7, clock=self.clock, **sim)
        self.source = NvmlGpuSource(self.sim, clock=self.clock, **(source or {}))

    def read(self, advance: float = 0.0) -> GpuInventory:
        self.clock.advance(advance)
        inventory = self.source.read()
        assert inventory.available, inventory.error
        return inventory


@pytest.fixture
def rig() -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(
        profile: str = "p5.48xlarge", *faults: str, source: dict[str, Any] | None = None, **sim: Any
    ) -> Rig:
        r = Rig(get_profile(profile), [parse_fault(f) for f in faults], source, **sim)
        made.append(r)
        return r

    yield make
    for r in made:
        for gpu in range(r.profile.expected_gpus):  # let a hung read thread return
            r.sim.clear(parse_fault(f"nvml-hang@gpu{gpu}"))
        r.source.close()


def wait_for_xids(rig: Rig, count: int, timeout: float = 10.0) -> list[XidEvent]:
    """Read until `count` XIDs arrived (the event thread runs in real time), then once more."""
    events: list[XidEvent] = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events += rig.read().xid_events
        time.sleep(0.02)
    time.sleep(0.1)
    events += rig.read().xid_events
    return events


# ----- identity and normal readings ------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_every_gpu_is_enumerated_with_its_identity(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    inv = r.read()
    assert inv.error is None
    assert inv.driver_version == r.profile.driver_version
    assert [g.index for g in inv.gpus] == list(range(r.profile.expected_gpus))
    assert [g.pci_bus_id for g in inv.gpus] == [s.pci_bus_id for s in r.profile.gpus]
    assert [g.uuid for g in inv.gpus] == [r.sim.uuid_of(i) for i in range(len(inv.gpus))]
    assert len({g.uuid for g in inv.gpus}) == len(inv.gpus)
    assert all(g.uuid.startswith("GPU-") for g in inv.gpus)
    assert {g.model for g in inv.gpus} == {r.profile.gpu_model}
    assert all(g.up and g.error is None for g in inv.gpus)


def test_p5_has_eight_h100() -> None:
    profile = get_profile("p5.48xlarge")
    source = NvmlGpuSource(SimulatedNvml(profile), clock=FakeClock())
    try:
        inv = source.read()
    finally:
        source.close()
    assert len(inv.gpus) == 8
    assert inv.gpus[0].pci_bus_id == "00000000:53:00.0"
    assert inv.gpus[0].model == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name", PROFILES)
def test_every_gpu_has_18_nvlinks_up_to_nvswitches(rig: Callable[..., Rig], name: str) -> None:
    inv = rig(name).read()
    for gpu in inv.gpus:
        assert [link.link for link in gpu.nvlinks] == list(range(18))
        assert all(link.up is True for link in gpu.nvlinks)
        assert {link.remote_device_type for link in gpu.nvlinks} == {"switch"}
        assert all(BUS_ID.match(link.remote_pci_bus_id or "") for link in gpu.nvlinks)


@pytest.mark.parametrize("name", PROFILES)
def test_readings_are_plausible(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    p = r.profile
    for gpu in r.read().gpus:
        assert gpu.utilization_gpu_ratio is not None and 0 <= gpu.utilization_gpu_ratio <= 1
        assert gpu.utilization_memory_ratio is not None and 0 <= gpu.utilization_memory_ratio <= 1
        assert gpu.power_watts is not None and 0 < gpu.power_watts <= p.gpu_power_limit_watts
        assert gpu.temperature_gpu_celsius is not None and 35 <= gpu.temperature_gpu_celsius <= 80
        assert gpu.temperature_memory_celsius is not None
        assert gpu.memory_total_bytes == p.gpu_memory_bytes
        assert gpu.memory_used_bytes is not None and gpu.memory_free_bytes is not None
        assert gpu.memory_used_bytes + gpu.memory_free_bytes == p.gpu_memory_bytes
        assert gpu.clock_sm_hz == p.gpu_max_sm_clock_mhz * 1e6
        assert gpu.clock_memory_hz == p.gpu_max_mem_clock_mhz * 1e6
        assert gpu.clock_event_reasons == frozenset()
        assert (gpu.pcie_link_gen_current, gpu.pcie_link_gen_max) == (p.pcie_gen_max,) * 2
        assert (gpu.pcie_link_width_current, gpu.pcie_link_width_max) == (p.pcie_width_max,) * 2
        assert gpu.ecc.uncorrected_volatile == 0 and gpu.ecc.corrected_volatile is not None
        assert gpu.remapped_rows is not None and not gpu.remapped_rows.failure
        assert gpu.retired_pages is None  # page retirement: NOT_SUPPORTED since Ampere
        assert gpu.processes is not None
        assert [proc.pid for proc in gpu.processes] == [40000 + gpu.index]


@pytest.mark.parametrize("name", PROFILES)
def test_counters_increase_as_time_passes(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    before = r.read().gpus
    after = r.read(advance=ENERGY_INTERVAL_SECONDS).gpus  # energy: read every 2 minutes
    seconds = ENERGY_INTERVAL_SECONDS
    for old, new in zip(before, after, strict=True):
        for attr in ("energy_joules", "pcie_tx_bytes", "pcie_rx_bytes"):
            assert getattr(new, attr) > getattr(old, attr), attr
        for old_link, new_link in zip(old.nvlinks, new.nvlinks, strict=True):
            assert old_link.tx_bytes is not None and new_link.tx_bytes is not None
            assert old_link.rx_bytes is not None and new_link.rx_bytes is not None
            rate = (new_link.tx_bytes - old_link.tx_bytes) / seconds
            assert 5e9 < rate < 60e9  # tens of GB/s per link under a training load
            assert new_link.rx_bytes > old_link.rx_bytes
        watts = (new.energy_joules - old.energy_joules) / seconds  # type: ignore[operator]
        assert 0.1 * r.profile.gpu_power_limit_watts < watts < r.profile.gpu_power_limit_watts


# ----- how the source asks -----------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_one_batched_field_values_call_per_gpu_per_poll(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    for _ in range(3):
        r.read(advance=5.0)
    gpus = r.profile.expected_gpus
    assert r.sim.calls["nvmlDeviceGetFieldValues"] == 3 * gpus


def test_pcie_bytes_come_from_field_values_not_throughput(rig: Callable[..., Rig]) -> None:
    r = rig()
    inv = r.read()
    r.read(advance=5.0)
    assert all(g.pcie_tx_bytes and g.pcie_rx_bytes for g in inv.gpus)
    assert r.sim.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES] == 2 * 8
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES] == 2 * 8


def test_nvlinks_are_discovered_once_and_remote_info_is_cached(rig: Callable[..., Rig]) -> None:
    r = rig()
    for _ in range(3):
        r.read(advance=5.0)
    discovery = 8 * pynvml.NVML_NVLINK_MAX_LINKS  # then each link's state is a field value
    assert r.sim.calls["nvmlDeviceGetNvLinkState"] == discovery
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_NVLINK_GET_STATE] == 3 * 8 * 18
    assert r.sim.calls["nvmlDeviceGetNvLinkRemotePciInfo"] == 8 * 18
    assert r.sim.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 8 * 18


def test_unsupported_call_leaves_its_value_none_and_is_not_retried(rig: Callable[..., Rig]) -> None:
    r = rig(unsupported={"nvmlDeviceGetPowerUsage"})
    r.read()
    inv = r.read(advance=5.0)
    assert all(g.up and g.error is None for g in inv.gpus)
    assert all(g.power_watts is None for g in inv.gpus)
    assert all(g.energy_joules is not None for g in inv.gpus)
    assert r.sim.calls["nvmlDeviceGetPowerUsage"] == 8  # asked once per GPU, then remembered


def test_unsupported_field_value_leaves_it_none_and_drops_it(rig: Callable[..., Rig]) -> None:
    r = rig(unsupported_fields={pynvml.NVML_FI_DEV_MEMORY_TEMP})
    for _ in range(3):
        inv = r.read(advance=5.0)
        assert all(g.up and g.error is None for g in inv.gpus)
        assert all(g.temperature_memory_celsius is None for g in inv.gpus)
        assert all(g.pcie_tx_bytes is not None for g in inv.gpus)
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_MEMORY_TEMP] == 8


# ----- GPM and fabric ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_gpm_profiling_ratios_between_polls(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    assert all(g.profiling is None for g in r.read().gpus)  # no previous sample yet
    for _ in range(3):
        for gpu in r.read(advance=5.0).gpus:
            assert gpu.profiling is not None
            assert set(gpu.profiling) == set(PROFILING_KEYS)
            assert all(0.0 <= v <= 1.0 for v in gpu.profiling.values())
            assert gpu.profiling["sm_active"] > 0.1
    assert r.sim.calls["nvmlGpmSampleAlloc"] == 2 * r.profile.expected_gpus


def test_gpm_samples_are_freed_on_close(rig: Callable[..., Rig]) -> None:
    r = rig()
    r.read()
    r.source.close()
    assert r.sim.calls["nvmlGpmSampleFree"] == r.sim.calls["nvmlGpmSampleAlloc"] == 16
    assert r.sim.calls["nvmlShutdown"] == 1


def test_fabric_info_on_gb200_only(rig: Callable[..., Rig]) -> None:
    assert all(g.fabric is None for g in rig("p5.48xlarge").read().gpus)
    for gpu in rig("p6e-gb200.36xlarge").read().gpus:
        assert gpu.fabric is not None
        assert gpu.fabric.state == "completed"
        assert gpu.fabric.healthy is True
        assert gpu.fabric.clique_id is not None
        assert re.fullmatch(r"[0-9a-f-]{36}", gpu.fabric.cluster_uuid or "")


# ----- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_lost_gpu_is_down_and_the_others_are_fully_read(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name)
    known = r.read().gpus[2]
    fault = parse_fault("gpu-lost@gpu2")
    r.sim.inject(fault)
    inv = r.read(advance=5.0)
    lost = inv.gpus[2]
    assert not lost.up and lost.error and "GPU is lost" in lost.error
    assert (lost.uuid, lost.pci_bus_id, lost.model) == (known.uuid, known.pci_bus_id, known.model)
    assert lost.power_watts is None and lost.nvlinks == ()
    others = [g for g in inv.gpus if g.index != 2]
    assert len(others) == r.profile.expected_gpus - 1
    for gpu in others:
        assert gpu.up and gpu.error is None
        assert gpu.power_watts is not None and gpu.ecc.corrected_volatile is not None
        assert gpu.profiling is not None and len(gpu.nvlinks) == 18
    r.sim.clear(fault)
    assert all(g.up for g in r.read(advance=5.0).gpus)


def test_gpu_lost_from_the_start_does_not_blank_the_others(rig: Callable[..., Rig]) -> None:
    inv = rig("p5.48xlarge", "gpu-lost@gpu6").read()
    assert [g.up for g in inv.gpus] == [True] * 6 + [False, True]
    assert inv.gpus[6].index == 6 and "GPU is lost" in (inv.gpus[6].error or "")


def test_a_timing_out_gpu_is_down_alone(rig: Callable[..., Rig]) -> None:
    inv = rig(timeouts={5}).read()
    assert not inv.gpus[5].up and "Timeout" in (inv.gpus[5].error or "")
    assert all(g.up for g in inv.gpus if g.index != 5)


def test_xid_is_delivered_exactly_once(rig: Callable[..., Rig]) -> None:
    r = rig("p5.48xlarge", "xid=79@gpu3")
    r.source.start()
    events = wait_for_xids(r, 1)
    assert [(e.gpu_index, e.uuid, e.xid) for e in events] == [(3, r.sim.uuid_of(3), 79)]
    assert events[0].timestamp == pytest.approx(time.time(), abs=60)
    time.sleep(0.6)
    assert r.read().xid_events == ()


def test_the_same_xid_twice_is_two_events(rig: Callable[..., Rig]) -> None:
    r = rig("p6e-gb200.36xlarge")
    r.source.start()
    r.read()
    r.sim.inject(parse_fault("xid=48@gpu1"))
    r.sim.inject(parse_fault("xid=48@gpu1"))
    events = wait_for_xids(r, 2)
    assert [(e.gpu_index, e.xid) for e in events] == [(1, 48), (1, 48)]


def test_no_event_set_means_no_xids_but_everything_else(rig: Callable[..., Rig]) -> None:
    r = rig("p5.48xlarge", "xid=79@gpu3", event_set_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    r.source.start()
    inv = r.read()
    deadline = time.monotonic() + 10.0
    while r.source.xid_error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "event set" in (r.source.xid_error or "")
    assert all(g.up for g in inv.gpus) and inv.xid_events == ()


@pytest.mark.parametrize("name", PROFILES)
def test_nvlink_down(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name, "nvlink-down@gpu0:link3")
    before = r.read().gpus[0].nvlinks
    after = r.read(advance=10.0).gpus[0].nvlinks
    assert after[3].up is False
    assert all(link.up for link in after if link.link != 3)
    assert after[3].tx_bytes == before[3].tx_bytes  # no traffic through a down link
    assert after[4].tx_bytes > before[4].tx_bytes  # type: ignore[operator]


def test_nvlink_crc_storm_on_hopper(rig: Callable[..., Rig]) -> None:
    r = rig("p5.48xlarge", "nvlink-crc@gpu1:link0")
    r.read()
    links = r.read(advance=10.0).gpus[1].nvlinks
    assert (links[0].crc_flit_errors or 0) >= 10_000
    assert (links[0].replay_errors or 0) >= 1_000
    assert links[1].crc_flit_errors == 0 and links[1].replay_errors == 0
    assert links[0].up is True


def test_blackwell_has_no_dl_error_fields(rig: Callable[..., Rig]) -> None:
    """NVML 565+ dropped the per-link DL error fields on Blackwell: None, links still up."""
    r = rig("p6e-gb200.36xlarge", "nvlink-crc@gpu1:link0")
    r.read()
    gpu = r.read(advance=5.0).gpus[1]
    assert gpu.up and gpu.error is None
    assert all(link.crc_flit_errors is None and link.up for link in gpu.nvlinks)
    assert all(link.tx_bytes is not None for link in gpu.nvlinks)
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC] == 4 * 18  # then dropped


@pytest.mark.parametrize("name", PROFILES)
def test_thermal_slowdown(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name, "thermal@gpu1")
    gpus = r.read().gpus
    hot = gpus[1]
    assert hot.clock_event_reasons is not None
    assert {"hw_thermal_slowdown", "sw_thermal_slowdown"} <= hot.clock_event_reasons
    assert hot.temperature_gpu_celsius is not None and hot.temperature_gpu_celsius >= 90
    assert hot.clock_sm_hz is not None and hot.clock_sm_hz < r.profile.gpu_max_sm_clock_mhz * 1e6
    assert gpus[0].clock_event_reasons == frozenset()


def test_ecc_double_bit_errors(rig: Callable[..., Rig]) -> None:
    r = rig("p5.48xlarge", "ecc-dbe@gpu1")
    first = r.read().gpus[1]
    later = r.read(advance=60.0).gpus[1]
    assert first.ecc.uncorrected_volatile is not None and first.ecc.uncorrected_volatile > 0
    assert first.ecc.uncorrected_aggregate is not None and first.ecc.uncorrected_aggregate > 0
    assert later.ecc.uncorrected_volatile > first.ecc.uncorrected_volatile  # type: ignore[operator]
    assert first.remapped_rows is not None
    assert first.remapped_rows.uncorrected == 1 and first.remapped_rows.pending
    assert r.read().gpus[0].ecc.uncorrected_volatile == 0


def test_remap_failure(rig: Callable[..., Rig]) -> None:
    gpus = rig("p5.48xlarge", "remap-failure@gpu4").read().gpus
    assert gpus[4].remapped_rows is not None and gpus[4].remapped_rows.failure
    assert all(g.remapped_rows and not g.remapped_rows.failure for g in gpus if g.index != 4)


@pytest.mark.parametrize("name", PROFILES)
def test_pcie_degraded(rig: Callable[..., Rig], name: str) -> None:
    r = rig(name, "pcie-degraded@gpu2")
    gpu = r.read().gpus[2]
    assert (gpu.pcie_link_gen_current, gpu.pcie_link_width_current) == (3, 8)
    assert (gpu.pcie_link_gen_max, gpu.pcie_link_width_max) == (
        r.profile.pcie_gen_max,
        r.profile.pcie_width_max,
    )


# ----- NVML itself unavailable --------------------------------------------------------------------


def test_init_failure_then_recovery(rig: Callable[..., Rig]) -> None:
    r = rig(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    inv = r.source.read()
    assert not inv.available and inv.gpus == ()
    assert inv.error and "driver is not loaded" in inv.error
    r.sim.init_error = None  # the driver comes back ...
    r.clock.advance(30.0)
    assert not r.source.read().available  # ... but init is retried at most once a minute
    assert r.sim.calls["nvmlInit"] == 1
    r.clock.advance(31.0)
    inv = r.source.read()
    assert inv.available and len(inv.gpus) == 8 and inv.error is None
    assert r.sim.calls["nvmlInit"] == 2


def test_nvml_failing_after_init_is_reinitialised(rig: Callable[..., Rig]) -> None:
    r = rig()
    r.read()
    r.sim.nvmlShutdown()  # NVML torn down under the source: every call is UNINITIALIZED
    inv = r.source.read()
    assert not inv.available and "NVML stopped working" in (inv.error or "")
    inv = r.read(advance=5.0)
    assert len(inv.gpus) == 8 and all(g.up for g in inv.gpus)
    assert r.sim.calls["nvmlInit"] == 2


def test_real_pynvml_without_a_gpu_reports_unavailable() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    source = NvmlGpuSource()
    source.start()
    try:
        inv = source.read()
        assert not inv.available
        assert inv.error and "libnvidia-ml.so.1 not found" in inv.error
        assert not source.read().available  # retried later, not raised
    finally:
        source.close()


# ----- the simulation as a pynvml stand-in --------------------------------------------------------


def test_simulation_raises_pynvml_errors_and_exposes_its_constants() -> None:
    sim = SimulatedNvml(get_profile("p5.48xlarge"), [parse_fault("gpu-lost@gpu0")])
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetPowerUsage(handle)
    assert sim.NVML_FI_DEV_MEMORY_TEMP == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert sim.c_nvmlFieldValue_t is pynvml.c_nvmlFieldValue_t
    with pytest.raises(AttributeError):
        sim.nvmlDeviceGetBAR1MemoryInfo  # noqa: B018  (not simulated: must not reach libnvidia-ml)


# Enumeration and static facts: asked on the first read, never again while the GPUs stay.
DISCOVERY_CALLS = frozenset(
    {
        "nvmlInit",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
    }
)


def test_full_read_is_cheap(rig: Callable[..., Rig]) -> None:
    """The agent's whole poll budget is 25 ms CPU; NVML must take a fraction.

    What a read costs is the NVML calls it makes, so they are counted rather than timed (CPU
    time flakes on a loaded machine): a steady read makes the same small set of calls every
    poll, nothing that samples over time (`nvmlDeviceGetPcieThroughput` blocks for 20 ms), no
    discovery again, and a bounded number per GPU and NVLink.
    """
    r = rig()
    r.read()
    assert DISCOVERY_CALLS.issubset(r.sim.calls)  # the list names calls the source does make
    polls = int(ENERGY_INTERVAL_SECONDS // 5)  # one turn of the costly readings at 5 s
    gpm_windows = int(ENERGY_INTERVAL_SECONDS // GPM_INTERVAL_SECONDS)
    cycles: list[Counter[str]] = []
    for _ in range(3):
        before = Counter(r.sim.calls)
        for _ in range(polls):
            r.read(advance=5.0)
        cycles.append(Counter(r.sim.calls) - before)
    steady = cycles[1]
    assert cycles[2] == steady  # no work piling up from minute to minute
    assert r.sim.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert not DISCOVERY_CALLS & set(steady)
    gpus, links = r.profile.expected_gpus, r.profile.nvlinks_per_gpu
    assert steady["nvmlDeviceGetFieldValues"] == gpus * polls  # one batch per GPU per poll
    # What nvml.h has field ids for comes from the batch, never from its own calls.
    for batched in (
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetRetiredPages",
    ):
        assert steady[batched] == 0, batched
    # The costly two once an interval per GPU (GPM: a sample and the metrics between two).
    assert steady["nvmlDeviceGetTotalEnergyConsumption"] == gpus
    assert steady["nvmlGpmMetricsGet"] == steady["nvmlGpmSampleGet"] == gpus * gpm_windows
    # Per poll: 1 + 11 per GPU + 1 per NVLink (its data-CRC counter: no scoped field id).
    assert steady.total() <= polls * (1 + gpus * (11 + links)) + (1 + 2 * gpm_windows) * gpus


# ----- NVLink5 counters and fabric health (issue 14, item 4) ---------------------------------

NVLINK5_ATTRIBUTES = (
    "tx_packets",
    "rx_packets",
    "malformed_packet_errors",
    "buffer_overrun_errors",
    "rx_errors",
    "rx_remote_errors",
    "rx_general_errors",
    "local_link_integrity_errors",
    "tx_discards",
    "link_recovery_successful_events",
    "link_recovery_failed_events",
    "link_recovery_events",
)


def test_blackwell_reads_nvlink5_counters_per_link(rig: Callable[..., Rig]) -> None:
    """NVLink5 counts per link in NVML_FI_DEV_NVLINK_COUNT_* (nvml.h 201-215, scopeId = link):
    a CRC storm shows as received packets in error, the local error threshold crossed, and
    link recoveries, on that link only."""
    r = rig("p6e-gb200.36xlarge", "nvlink-crc@gpu1:link0")
    first = r.read().gpus[1].nvlinks
    links = r.read(advance=10.0).gpus[1].nvlinks
    assert all(getattr(lk, a) is not None for lk in links for a in NVLINK5_ATTRIBUTES)
    assert (links[0].rx_errors or 0) >= 10_000
    assert (links[0].link_recovery_events or 0) >= 1
    assert links[0].link_recovery_events == links[0].link_recovery_successful_events
    assert (links[0].local_link_integrity_errors or 0) >= 1
    assert links[0].link_recovery_failed_events == 0 and links[0].rx_remote_errors == 0
    assert all(lk.rx_errors == 0 and lk.link_recovery_events == 0 for lk in links[1:])
    assert links[1].tx_packets > first[1].tx_packets  # type: ignore[operator]
    assert links[1].rx_packets > first[1].rx_packets  # type: ignore[operator]
    for field_id in (pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS, 215, 201):
        assert r.sim.field_requests[field_id] == 2 * 4 * 18  # one slot per link, every poll
    assert r.sim.calls["nvmlDeviceGetFieldValues"] == 2 * 4  # still one batch per GPU


def test_hopper_has_no_nvlink5_counters_and_stops_asking(rig: Callable[..., Rig]) -> None:
    r = rig("p5.48xlarge", "nvlink-crc@gpu1:link0")
    for _ in range(3):
        inv = r.read(advance=5.0)
        assert all(g.up and g.error is None for g in inv.gpus)
    links = inv.gpus[1].nvlinks
    assert all(getattr(lk, a) is None for lk in links for a in NVLINK5_ATTRIBUTES)
    assert (links[0].crc_flit_errors or 0) > 0  # the DL counters still carry the storm
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS] == 8 * 18  # once


def test_fabric_degraded_is_completed_with_a_failed_status(rig: Callable[..., Rig]) -> None:
    """nvml.h: `status` is the probe's "Error status, if any. Must be checked only if state
    returns 'complete'"; the v2 healthMask carries the route's health (shift 4)."""
    assert str(parse_fault("fabric-degraded@gpu2")) == "fabric-degraded@gpu2"
    gpus = rig("p6e-gb200.36xlarge", "fabric-degraded@gpu2").read().gpus
    bad = gpus[2].fabric
    assert bad is not None
    assert (bad.state, bad.healthy) == ("completed", False)
    assert bad.status == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    route = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    assert bad.health_mask == route << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    for gpu in (gpus[0], gpus[1], gpus[3]):
        assert gpu.fabric is not None
        assert (gpu.fabric.healthy, gpu.fabric.status, gpu.fabric.health_mask) == (
            True,
            "NVML_SUCCESS",
            0,
        )


def test_fabric_from_the_unversioned_call_has_no_health_mask(rig: Callable[..., Rig]) -> None:
    r = rig(
        "p6e-gb200.36xlarge", "fabric-degraded@gpu0", unsupported={"nvmlDeviceGetGpuFabricInfoV"}
    )
    r.read()
    gpus = r.read(advance=5.0).gpus
    assert gpus[0].fabric is not None and gpus[0].fabric.health_mask is None
    assert (gpus[0].fabric.healthy, gpus[0].fabric.status) == (
        False,
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
    )
    assert gpus[1].fabric is not None and gpus[1].fabric.healthy is True
    assert r.sim.calls["nvmlDeviceGetGpuFabricInfo"] == 2 * 4


# ----- what NVML costs (issue 28): one batch, the costly readings on a longer cadence ---------


def test_field_ids_replace_their_calls(rig: Callable[..., Rig]) -> None:
    """Violation times (74-79), the recovery action (230), ECC totals (3-6), remapped rows
    (142-145) and each NVLink's state (165) are values in the one batch."""
    r = rig("p5.48xlarge", "thermal@gpu1", "ecc-dbe@gpu2")
    first = r.read()
    later = r.read(advance=5.0)
    for field_id in (
        *range(
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER, pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY + 1
        ),
        pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    ):
        assert r.sim.field_requests[field_id] == 2 * 8, field_id
    assert r.sim.calls["nvmlDeviceGetViolationStatus"] == 0
    assert r.sim.calls["nvmlDeviceGetTotalEccErrors"] == 0
    assert r.sim.calls["nvmlDeviceGetRemappedRows"] == 0
    for gpu in later.gpus:
        assert gpu.recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        assert gpu.violation_ns is not None and set(gpu.violation_ns) == set(VIOLATION_POLICIES)
        assert gpu.ecc.corrected_volatile is not None and gpu.ecc.corrected_aggregate is not None
        assert gpu.remapped_rows is not None
    hot = [g.violation_ns["thermal"] for g in (first.gpus[1], later.gpus[1]) if g.violation_ns]
    assert hot[1] - hot[0] == pytest.approx(5e9, rel=0.01)  # throttled the whole 5 s
    assert later.gpus[0].violation_ns == dict.fromkeys(VIOLATION_POLICIES, 0)
    sick = later.gpus[2]
    assert sick.ecc.uncorrected_volatile and sick.ecc.uncorrected_aggregate
    assert sick.remapped_rows == pytest.approx(first.gpus[2].remapped_rows)
    assert sick.remapped_rows is not None and sick.remapped_rows.pending
    assert later.gpus[0].ecc.uncorrected_volatile == 0


def test_the_recovery_action_is_the_drivers_value(rig: Callable[..., Rig]) -> None:
    r = rig()
    r.sim.recovery_action = lambda gpu: (  # type: ignore[method-assign]
        pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET if gpu == 4 else 0
    )
    actions = [g.recovery_action for g in r.read().gpus]
    assert actions == [0, 0, 0, 0, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET, 0, 0, 0]


def test_no_recovery_action_field_leaves_it_none(rig: Callable[..., Rig]) -> None:
    """A driver older than field 230 answers it per value: None, nothing else lost."""
    r = rig(unsupported_fields={pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION})
    for _ in range(2):
        inv = r.read(advance=5.0)
        assert all(g.up and g.error is None and g.recovery_action is None for g in inv.gpus)
        assert all(g.violation_ns is not None for g in inv.gpus)
    assert r.sim.field_requests[pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION] == 8  # then dropped


BATCHED_FIELDS = frozenset(
    {
        *range(
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER, pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY + 1
        ),
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    }
)


def _values(inv: GpuInventory) -> list[tuple[Any, ...]]:
    return [
        (g.violation_ns, g.ecc, g.remapped_rows, g.retired_pages, [x.up for x in g.nvlinks])
        for g in inv.gpus
    ]


@pytest.mark.parametrize("how", ["fields", "function"])
def test_without_the_fields_the_calls_give_the_same_values(
    rig: Callable[..., Rig], how: str
) -> None:
    """A driver that does not serve these ids (or a library without nvmlDeviceGetFieldValues)
    is read as before, call by call, with the same values: nothing is lost to batching."""
    batched = rig("p5.48xlarge", "thermal@gpu1", "nvlink-down@gpu0:link3")
    lacking = (
        rig(
            "p5.48xlarge",
            "thermal@gpu1",
            "nvlink-down@gpu0:link3",
            unsupported_fields=BATCHED_FIELDS,
        )
        if how == "fields"
        else rig(
            "p5.48xlarge",
            "thermal@gpu1",
            "nvlink-down@gpu0:link3",
            unsupported={"nvmlDeviceGetFieldValues"},
        )
    )
    for _ in range(2):
        expected, got = batched.read(advance=5.0), lacking.read(advance=5.0)
        assert _values(got) == _values(expected)
        assert all(g.up and g.error is None for g in got.gpus)
    assert got.gpus[0].nvlinks[3].up is False
    assert lacking.sim.calls["nvmlDeviceGetViolationStatus"] == 2 * 8 * 6
    assert lacking.sim.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 8 * 4
    assert lacking.sim.calls["nvmlDeviceGetRemappedRows"] == 2 * 8
    if how == "fields":  # each id asked once, then left out of the batch
        assert all(lacking.sim.field_requests[f] <= 8 * 18 for f in BATCHED_FIELDS)
        assert lacking.sim.calls["nvmlDeviceGetFieldValues"] == 2 * 8  # the rest still batched
        assert got.gpus[0].pcie_tx_bytes is not None


def test_energy_and_gpm_are_read_once_an_interval_and_never_served_older(
    rig: Callable[..., Rig],
) -> None:
    """The two costly readings: read once an interval per GPU (staggered across the GPUs), the
    value of the last read served in between, so what is served is never older than the
    interval. When a GPU's reading was taken is what the simulated NVML counted."""
    r = rig()
    read_at: dict[tuple[int, str], float] = {}
    served: dict[tuple[int, str], Any] = {}
    costly = {
        "nvmlDeviceGetTotalEnergyConsumption": ("energy_joules", ENERGY_INTERVAL_SECONDS),
        "nvmlGpmMetricsGet": ("profiling", GPM_INTERVAL_SECONDS),
    }
    counted: Counter[tuple[int, str]] = Counter()
    polls = 80  # 400 s
    for poll in range(polls):
        inv = r.read(advance=0.0 if poll == 0 else 5.0)
        for g in inv.gpus:
            for function, (attr, interval) in costly.items():
                key = (g.index, function)
                value = getattr(g, attr)
                if r.sim.gpu_calls[key] > counted[key]:  # read this poll
                    counted[key] = r.sim.gpu_calls[key]
                    read_at[key], served[key] = r.clock.now, value
                if poll == 0 and attr == "profiling":
                    assert value is None  # one sample: no window yet
                    continue
                assert value is not None and value == served[key], (poll, key)
                assert r.clock.now - read_at[key] < interval, (poll, key)
    span = (polls - 1) * 5.0
    for function, (_, interval) in costly.items():
        assert 8 * (span / interval) <= r.sim.calls[function] <= 8 * (span / interval + 2)
    # Staggered: after the first, no poll reads the energy of every GPU.
    latest = Counter(t for (_, fn), t in read_at.items() if fn in costly and "Energy" in fn)
    assert max(latest.values()) < 8


def test_the_cadence_is_configurable(rig: Callable[..., Rig]) -> None:
    r = rig(source={"energy_interval": 0.0, "gpm_interval": 0.0})
    for _ in range(4):
        r.read(advance=5.0)
    assert r.sim.calls["nvmlDeviceGetTotalEnergyConsumption"] == 4 * 8
    assert r.sim.calls["nvmlGpmMetricsGet"] == 3 * 8
    with pytest.raises(ValueError):
        NvmlGpuSource(r.sim, energy_interval=-1.0)
    with pytest.raises(ValueError):
        NvmlGpuSource(r.sim, deadline=0.0)


def test_the_simulation_counts_calls_per_gpu_and_models_their_h100_cost(
    rig: Callable[..., Rig],
) -> None:
    r = rig(source={"energy_interval": 3600.0, "gpm_interval": 3600.0})
    r.read()
    r.read(advance=5.0)  # the first GPM window
    calls, cost = Counter(r.sim.gpu_calls), dict(r.sim.cost_ms)
    r.read(advance=5.0)  # neither costly reading due
    poll = Counter(r.sim.gpu_calls) - calls
    assert {gpu for gpu, _ in poll} == set(range(8))
    assert all(poll[(gpu, "nvmlDeviceGetFieldValues")] == 1 for gpu in range(8))
    spent = {gpu: r.sim.cost_ms[gpu] - cost[gpu] for gpu in range(8)}
    # a poll without energy: the batch (0.7 ms) plus ~0.01 ms per other call
    assert all(0.7 < ms < 1.5 for ms in spent.values())
    r.sim.nvmlInit()
    handle = r.sim.nvmlDeviceGetHandleByIndex(0)
    before = r.sim.cost_ms[0]
    r.sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    r.sim.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert r.sim.cost_ms[0] - before == pytest.approx(4.4 + 0.7 + 4.2)


# ----- a hung NVML call (issue 28) -----------------------------------------------------------


def test_a_hung_call_downs_its_gpu_and_serves_the_others_stale(rig: Callable[..., Rig]) -> None:
    """nvml-hang@gpu3: the read returns at its deadline; GPU 3 is down with a TIMEOUT (judged as
    any timeout), the other GPUs keep their last good values marked stale, the hang is named;
    no second read starts beside the hung one; when the call returns, reads are fresh again."""
    r = rig(source={"deadline": 0.3})
    good = r.read()
    hang = parse_fault("nvml-hang@gpu3")
    r.sim.inject(hang)
    inv = r.read(advance=5.0)
    assert inv.available and inv.hung is not None and "on GPU 3" in inv.hung
    assert inv.hung_since is not None
    stuck = inv.gpus[3]
    assert not stuck.up and stuck.failure is not None and stuck.failure.kind == NVML_TIMEOUT
    assert "NVML hung" in (stuck.error or "") and stuck.uuid == good.gpus[3].uuid
    for old, new in zip(good.gpus, inv.gpus, strict=True):
        if new.index != 3:
            assert new.up and new.stale_since is not None
            assert replace(new, stale_since=None) == old
    calls = r.sim.calls.total()
    again = r.read(advance=5.0)
    assert r.sim.calls.total() == calls  # the hung read is not joined by another
    assert again.hung == inv.hung and not again.gpus[3].up
    r.sim.clear(hang)
    deadline = time.monotonic() + 10.0
    fresh = r.read(advance=5.0)
    while fresh.hung is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        fresh = r.read(advance=5.0)
    assert fresh.hung is None and all(g.up and g.stale_since is None for g in fresh.gpus)


def test_a_call_hung_from_the_start_leaves_every_gpu_a_timeout(rig: Callable[..., Rig]) -> None:
    """Hung while enumerating: nothing read yet, so no GPU is served as up. Every GPU NVML
    counted is down with a TIMEOUT (never a deployment or a hardware verdict on its own), the
    ones enumerated under their identity."""
    r = rig("p5.48xlarge", "nvml-hang@gpu3", source={"deadline": 0.3})
    inv = r.source.read()
    assert inv.available and "GPU 3" in (inv.hung or "")
    assert [g.index for g in inv.gpus] == list(range(8))
    assert all(not g.up and g.failure and g.failure.kind == NVML_TIMEOUT for g in inv.gpus)
    assert [g.uuid for g in inv.gpus[:3]] == [r.sim.uuid_of(i) for i in range(3)]
    assert "blocked on GPU 3" in (inv.gpus[5].error or "")


def test_xids_still_arrive_while_a_read_hangs(rig: Callable[..., Rig]) -> None:
    r = rig(source={"deadline": 0.3})
    r.source.start()
    r.read()
    r.sim.inject(parse_fault("nvml-hang@gpu3"))
    assert r.read(advance=5.0).hung is not None
    r.sim.inject(parse_fault("xid=79@gpu3"))
    events = wait_for_xids(r, 1)
    assert [(e.gpu_index, e.xid) for e in events] == [(3, 79)]


def test_close_leaves_a_hung_read_alone(rig: Callable[..., Rig]) -> None:
    r = rig(source={"deadline": 0.3})
    r.read()
    r.sim.inject(parse_fault("nvml-hang@gpu5"))
    inv = r.read(advance=5.0)
    for _ in range(200):  # on a loaded machine a slow call can pass the 0.3 s deadline first
        if "GPU 5" in (inv.hung or ""):
            break
        time.sleep(0.05)
        inv = r.read(advance=5.0)
    assert "GPU 5" in (inv.hung or ""), inv.hung
    r.source.close()  # returns; NVML is not shut down under the hung call
    assert r.sim.calls["nvmlShutdown"] == 0
