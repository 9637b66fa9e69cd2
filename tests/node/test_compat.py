"""`--compat dcgm,efa`: the fields HyperPod's observability add-on queries, with the peers' units.

The add-on enables rows that dcgm-exporter's default CSV ships commented out (violation times,
ECC totals, NVLink error totals) and queries them by name; these tests hold each to the value
topowatch reads under its own name, in DCGM's unit, and hold a field NVML does not give for a GPU
to being absent for that GPU, never 0 (a 0 would silence `> 0` alerts and fake a healthy panel).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import replace

from exporter.core.exposition import GAUGE, Exposition
from exporter.core.snapshot import EccCounts, NodeSnapshot
from exporter.node.compat import dcgm, efa, lines
from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import get_profile
from exporter.sources.nvml import NvmlGpuSource
from tests.conftest import SimHarness, reference
from tests.node.test_node_agent import one, series

Sim = Callable[..., SimHarness]
BOTH = frozenset({"dcgm", "efa"})
VIOLATIONS = (
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
)
NVLINK_TOTALS = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "topowatch_nvlink_crc_flit_errors_total",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "topowatch_nvlink_crc_data_errors_total",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "topowatch_nvlink_replay_errors_total",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "topowatch_nvlink_recovery_errors_total",
}


def commented_out_rows() -> set[str]:
    """The CSV rows dcgm-exporter ships disabled (`# DCGM_FI_...`), which a deployment enables."""
    rows = set()
    with reference("nvidia/dcgm-exporter-default-counters.csv").open() as f:
        for row in csv.reader(f):
            name = row[0].strip() if row else ""
            if name.startswith("# DCGM_FI_") and len(row) >= 3 and row[1].strip() != "label":
                rows.add(name.removeprefix("# ").strip())
    return rows


def render_text(snapshot: NodeSnapshot) -> bytes:
    return Exposition.build([*dcgm.render(snapshot, None), *efa.render(snapshot)]).text


def test_every_disabled_row_served_is_a_real_dcgm_field_and_the_addons_are_all_there(
    sim: Sim,
) -> None:
    h = sim("p5.48xlarge", compat=BOTH)
    h.poll()
    _, exposition = h.poll()
    served = {n for n in series(exposition.text) if n.startswith("DCGM_FI_")}
    disabled = commented_out_rows()
    # what HyperPod's add-on queries beyond the enabled defaults (tests/fixtures/hyperpod-addon)
    addon = {
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    }
    assert addon <= served
    assert addon <= disabled
    # the disabled rows served on an H100: violations, ECC totals, NVLink error totals, PCIe
    # rates, GPM's SM activity; not retired pages (NVML answers NOT_SUPPORTED from A100 on),
    # none of the DCGM_EXP_* bookkeeping
    assert served & disabled == {
        *VIOLATIONS,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        *NVLINK_TOTALS,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_SM_ACTIVE",
    }


def test_violation_time_is_nanoseconds_and_runs_only_while_the_gpu_is_throttled(sim: Sim) -> None:
    """DCGM's *_VIOLATION fields are NVML's violationTime, in ns (nvml.h nvmlViolationTime_t).
    A GPU held at its thermal limit for 10 s gains 10e9 ns; a cool GPU gains nothing, so
    `increase(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) > 0` (the add-on's alert) picks the hot one."""
    h = sim("p5.48xlarge", "thermal@gpu1", compat=BOTH)
    _, first = h.poll()
    _, second = h.poll(step=10.0)
    before, after = series(first.text), series(second.text)
    hot = one(after, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1") - one(
        before, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1"
    )
    assert hot == 10e9
    for gpu in ("0", "2", "7"):
        assert one(after, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu=gpu) == 0
    # the same time under topowatch's own name, in seconds, by policy
    assert one(after, "topowatch_gpu_throttled_seconds_total", gpu="1", policy="thermal") == (
        one(after, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1") / 1e9
    )


def test_a_cleared_thermal_fault_leaves_its_throttled_time_counted(sim: Sim) -> None:
    h = sim("p5.48xlarge", "thermal@gpu1", compat=BOTH)
    h.poll()
    h.poll(step=4.0)
    (fault,) = [f for f in h.node.nvml._faults]
    h.node.clear(fault)
    _, cleared = h.poll(step=4.0)
    _, later = h.poll(step=30.0)
    kept = one(series(cleared.text), "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1")
    assert kept > 0
    assert one(series(later.text), "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1") == kept


def test_ecc_and_nvlink_totals_are_topowatchs_own_readings_summed_as_dcgm_does(sim: Sim) -> None:
    h = sim("p5.48xlarge", "ecc-dbe@gpu2", "nvlink-crc@gpu3:link4", compat=BOTH)
    h.poll()
    _, exposition = h.poll(step=20.0)
    found = series(exposition.text)
    for dcgm_name, kind, scope in (
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "corrected", "volatile"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "uncorrected", "volatile"),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "corrected", "aggregate"),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "uncorrected", "aggregate"),
    ):
        for gpu in ("0", "2"):
            own = one(found, "topowatch_gpu_ecc_errors_total", gpu=gpu, type=kind, scope=scope)
            assert one(found, dcgm_name, gpu=gpu) == own, (dcgm_name, gpu)
    assert one(found, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="2") > 0
    assert one(found, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") == 0
    for dcgm_name, own_name in NVLINK_TOTALS.items():
        links = [v for lab, v in found[own_name] if lab["gpu"] == "3"]
        assert len(links) == 18
        assert one(found, dcgm_name, gpu="3") == sum(links), dcgm_name
        assert one(found, dcgm_name, gpu="0") == 0, dcgm_name
    assert one(found, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", gpu="3") > 0


def test_a_field_a_gpu_does_not_report_is_left_out_for_that_gpu_never_zero(sim: Sim) -> None:
    """One GPU without violation status, ECC or NVLink error counts (NOT_SUPPORTED leaves them
    None): its series are absent while its neighbours' stay, and every other field of it stays."""
    h = sim("p5.48xlarge", compat=BOTH)
    h.poll()
    snapshot, _ = h.poll()
    gpus = list(snapshot.gpu.gpus)
    bare = [
        replace(lk, crc_flit_errors=None, crc_data_errors=None, replay_errors=None,
                recovery_errors=None)
        for lk in gpus[5].nvlinks
    ]  # fmt: skip
    gpus[5] = replace(gpus[5], violation_ns=None, ecc=EccCounts(), nvlinks=tuple(bare))
    gpus[6] = replace(gpus[6], violation_ns={"power": 7})  # only one policy supported
    gpus[4] = replace(gpus[4], nvlinks=())  # a PCIe card: no NVLink at all
    found = series(render_text(replace(snapshot, gpu=replace(snapshot.gpu, gpus=tuple(gpus)))))
    gone = [*VIOLATIONS, *NVLINK_TOTALS, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
    for name in gone:
        gpus_served = {lab["gpu"] for lab, _ in found[name]}
        assert "5" not in gpus_served, name
        assert "3" in gpus_served, name
    for name in NVLINK_TOTALS:
        assert "4" not in {lab["gpu"] for lab, _ in found[name]}, name
    assert one(found, "DCGM_FI_DEV_POWER_VIOLATION", gpu="6") == 7
    assert "6" not in {lab["gpu"] for lab, _ in found["DCGM_FI_DEV_THERMAL_VIOLATION"]}
    assert one(found, "DCGM_FI_DEV_GPU_TEMP", gpu="5") > 0


def test_the_source_asks_for_an_unsupported_violation_policy_once_and_reports_none() -> None:
    # Neither the batch's NVML_FI_DEV_PERF_POLICY_* values (74-79) nor the call that falls back
    # for them (issue 28) are served.
    nvml = SimulatedNvml(
        get_profile("p5.48xlarge"),
        unsupported={"nvmlDeviceGetViolationStatus"},
        unsupported_fields=set(range(74, 80)),
    )
    source = NvmlGpuSource(nvml)
    try:
        first = source.read()
        source.read()
        assert all(g.violation_ns is None for g in first.gpus)
        # six policies, eight GPUs, asked once each; not again on the second read
        assert nvml.calls["nvmlDeviceGetViolationStatus"] == 48
        assert all(nvml.field_requests[f] == 8 for f in range(74, 80))
    finally:
        source.close()


def test_blackwell_serves_no_nvlink_dl_totals_rather_than_zeros(sim: Sim) -> None:
    """NVML 565+ removed the DL error counters on Blackwell: DCGM's totals would be blank there,
    and so are ours; NVLink5's own counters stay under topowatch's names."""
    h = sim("p6e-gb200.36xlarge", compat=BOTH)
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    for name in NVLINK_TOTALS:
        assert name not in found, name
    assert "topowatch_nvlink_rx_errors_total" in found


def test_efa_info_lists_each_device_once_with_the_exporters_label(sim: Sim) -> None:
    h = sim("p5.48xlarge", compat=frozenset({"efa"}))
    _, exposition = h.poll()
    found = series(exposition.text)
    info = found["node_amazonefa_info"]
    devices = sorted(lab["device"] for lab, _ in info)
    assert devices == sorted(e.name for e in h.node.profile.efa)
    assert len(devices) == 32
    assert all(set(lab) == {"device"} and v == 1 for lab, v in info)


def test_the_line_writer_escapes_percent_signs_and_formats_as_the_encoder_does() -> None:
    [fam] = lines.families([("m", GAUGE, "h")], ('{a="50%"}', '{a="x"}'), [[1, 2.0]])
    assert "".join(fam.lines) == 'm{a="50%"} 1\nm{a="x"} 2\n'
    [fam] = lines.families([("m", GAUGE, "h")], ('{a="%s"}', '{a="y"}'), [[None, 0.25]])
    assert "".join(fam.lines) == 'm{a="y"} 0.25\n'


def test_an_efa_counter_one_port_lacks_is_absent_for_that_port_only(sim: Sim) -> None:
    """An older driver on one device (fewer hw_counters): its ports go without the counters
    it lacks; every other port keeps them, under the same families."""
    h = sim("p5.48xlarge", compat=frozenset({"efa"}))
    snapshot, _ = h.poll()
    first = snapshot.efa[0]
    older = {k: v for k, v in first.ports[0].counters.items() if not k.startswith("rdma_write")}
    devices = (
        replace(first, ports=(replace(first.ports[0], counters=older), *first.ports[1:])),
        *snapshot.efa[1:],
    )
    found = series(render_text(replace(snapshot, efa=devices)))
    writes = {lab["device"] for lab, _ in found["node_amazonefa_rdma_write_bytes"]}
    assert first.device not in writes
    assert len(writes) == 31
    assert one(found, "node_amazonefa_tx_bytes", device=first.device, port="1") == older["tx_bytes"]


def test_graphics_engine_activity_is_gpms_graphics_utilization_as_a_ratio(sim: Sim) -> None:
    """DCGM_FI_PROF_GR_ENGINE_ACTIVE (time a graphics or compute context was busy; the newer
    add-on's MIG row plots it as GPU utilization) is GPM's GRAPHICS_UTIL, a ratio in [0, 1]."""
    h = sim("p5.48xlarge", compat=BOTH)
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    for gpu in ("0", "7"):
        dcgm_value = one(found, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu=gpu)
        assert 0.0 < dcgm_value <= 1.0
        assert dcgm_value == one(found, "topowatch_gpu_graphics_engine_active_ratio", gpu=gpu)
        # the SM-active ratio is read apart: a busy context need not keep every SM busy
        assert one(found, "DCGM_FI_PROF_SM_ACTIVE", gpu=gpu) <= dcgm_value
