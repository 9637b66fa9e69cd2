"""benchmarks/gpu_check.py on recorded output: a p5.48xlarge (8 x H100 80GB HBM3, driver 550)
`nvidia-smi -q -x` and `nvidia-smi nvlink -s`, and the agent's exposition of the simulated p5
(tests/fixtures/gpu_check, see the header of the .prom file). The script itself only runs on a
GPU machine; here its parsing, its comparison and its exit codes are checked without one."""

from __future__ import annotations

import importlib.util
import re
import stat
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from exporter.sim.hardware.nvml import SimulatedNvml
from exporter.sim.hardware.profiles import get_profile

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_check"
XML = (FIXTURES / "p5.48xlarge-nvidia-smi-q-x.xml").read_text()
NVLINK = (FIXTURES / "p5.48xlarge-nvlink-s.txt").read_text()
PROM = (FIXTURES / "p5.48xlarge-agent.prom").read_text()
GPU0 = "0000:53:00.0"
BUSES = [f"0000:{b}:00.0" for b in ("53", "64", "75", "86", "97", "a8", "b9", "ca")]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gc = _load()


def rows_by(rows: list[Any], gpu: str = "0") -> dict[str, Any]:
    return {r.field: r for r in rows if r.gpu == gpu}


def edit(xml: str, bus_id: str, path: str, text: str | None = None, drop: bool = False) -> str:
    """The recorded XML with one element of one GPU changed (or removed)."""
    root = ET.fromstring(xml)
    gpu = root.find(f"gpu[@id='{bus_id}']")
    assert gpu is not None
    if drop:
        parent_path, _, name = path.rpartition("/")
        parent = gpu.find(parent_path) if parent_path else gpu
        assert parent is not None
        target = parent.find(name)
        assert target is not None
        parent.remove(target)
    else:
        element = gpu.find(path)
        assert element is not None, path
        element.text = text
    return ET.tostring(root, encoding="unicode")


def without_gpu(xml: str, bus_id: str) -> str:
    root = ET.fromstring(xml)
    gpu = root.find(f"gpu[@id='{bus_id}']")
    assert gpu is not None
    root.remove(gpu)
    count = root.find("attached_gpus")
    assert count is not None
    count.text = str(len(root.findall("gpu")))
    return ET.tostring(root, encoding="unicode")


def drop_series(prom: str, name: str, gpu: str) -> str:
    pattern = re.compile(rf'^{name}\{{[^}}]*\bgpu="{gpu}"')
    return "".join(line for line in prom.splitlines(True) if not pattern.match(line))


# ----- parsing ---------------------------------------------------------------------------------


def test_the_recorded_p5_xml_parses_into_every_field_in_nvidia_smis_units() -> None:
    smi = gc.parse_smi_xml(XML)
    assert smi.node == {"driver_version": "550.127.05", "gpu_count": 8}
    assert sorted(smi.gpus, key=smi.index.get) == BUSES
    g = smi.gpus[GPU0]
    assert g["uuid"] == "GPU-77250a98-c067-b28f-3d7a-722619b4dfda"
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert (g["temperature.gpu"], g["temperature.memory"]) == (63, 68)
    assert g["power.draw"] == 501.73
    assert smi.notes[(GPU0, "power.draw")] == "<gpu_power_readings/power_draw>"
    assert (g["clocks.sm"], g["clocks.mem"]) == (1980, 2619)
    # used 59254 MiB + reserved 328 MiB: NVML's v1 call, the agent's, counts reserved as used
    assert (g["memory.total"], g["memory.used"], g["memory.free"]) == (81559, 59582, 21977)
    assert smi.notes[(GPU0, "memory.used")] == "used + reserved (328 MiB)"
    assert (g["utilization.gpu"], g["utilization.memory"]) == (72, 43)
    assert g["ecc.volatile.corrected"] == 72 and g["ecc.aggregate.corrected"] == 88
    assert g["ecc.volatile.uncorrected"] == 0 and g["ecc.aggregate.uncorrected"] == 0
    assert g["remapped_rows.correctable"] == 1 and g["remapped_rows.uncorrectable"] == 0
    assert g["remapped_rows.pending"] == 0 and g["remapped_rows.failure"] == 0
    # H100 remaps rows instead of retiring pages: nvidia-smi prints N/A
    assert g["retired_pages.single_bit_ecc"] is None
    assert g["retired_pages.double_bit_ecc"] is None
    assert g["retired_pages.pending"] is None
    assert (g["pcie.link.gen.current"], g["pcie.link.gen.max"]) == (5, 5)
    assert (g["pcie.link.width.current"], g["pcie.link.width.max"]) == (16, 16)
    assert g["pcie.replay_counter"] == 2
    assert g["clocks_event_reasons"] == "none"
    assert g["compute_processes"] == 1
    assert (g["fabric.state"], g["fabric.healthy"]) == ("completed", 1.0)


def test_nvlink_status_gives_every_link_of_every_gpu() -> None:
    statuses = gc.parse_nvlink_status(NVLINK)
    assert [s.index for s in statuses] == list(range(8))
    assert statuses[0].uuid == "GPU-77250a98-c067-b28f-3d7a-722619b4dfda"
    assert all(dict(s.links) == dict.fromkeys(range(18), True) for s in statuses)
    smi = gc.parse_smi_xml(XML)
    gc.add_nvlinks(smi, statuses)
    assert all(smi.gpus[b][gc.nvlink_key(17)] == 1.0 for b in BUSES)


def test_nvlink_status_reads_inactive_zero_speed_unknown_and_no_uuid() -> None:
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)\n"
        "\t Link 0: 26.562 GB/s\n"
        "\t Link 1: <inactive>\n"
        "\t Link 2: 0 GB/s\n"
        "\t Link 3: some status nobody has seen\n"
        "GPU 1: NVIDIA L4\n"
    )
    first, second = gc.parse_nvlink_status(text)
    assert dict(first.links) == {0: True, 1: False, 2: False, 3: None}
    assert (second.index, second.uuid, dict(second.links)) == (1, None, {})
    none = "NVML: Unable to retrieve NVLink information as all links are inActive\n"
    assert gc.parse_nvlink_status(none) == []


def test_the_agent_exposition_parses_into_nvidia_smis_units() -> None:
    agent = gc.parse_exposition(PROM)
    assert agent.node == {"nvml_up": 1, "gpu_count": 8, "driver_version": "550.127.05"}
    assert sorted(agent.gpus, key=agent.index.get) == BUSES
    g = agent.gpus[GPU0]
    assert g["clocks.sm"] == pytest.approx(1980) and g["clocks.mem"] == pytest.approx(2619)
    assert g["memory.total"] == 81559 and g["memory.used"] == pytest.approx(59582.4, abs=0.1)
    assert g["utilization.gpu"] == pytest.approx(74) and g["power.draw"] == 500.357
    assert g["ecc.volatile.corrected"] == 72 and g["ecc.aggregate.uncorrected"] == 0
    assert g["remapped_rows.correctable"] == 1 and g["pcie.replay_counter"] == 2
    assert g["clocks_event_reasons"] == "none"
    assert "fabric.state" not in g and "retired_pages.pending" not in g
    assert sorted(k for k in g if k.startswith("nvlink[")) == sorted(
        gc.nvlink_key(n) for n in range(18)
    )


def test_bus_ids_are_normalised_whichever_way_they_are_written() -> None:
    for written in ("00000000:CA:00.0", "0000:ca:00.0", "CA:00.0"):
        assert gc.bus_key(written) == "0000:ca:00.0"


# ----- older and newer nvidia-smi element names ------------------------------------------------


def one_gpu(body: str, bus: str = "00000000:1A:00.0") -> str:
    return (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        f"<nvidia_smi_log><driver_version>X</driver_version><attached_gpus>1</attached_gpus>"
        f'<gpu id="{bus}">{body}</gpu></nvidia_smi_log>'
    )


def test_pre_535_names_power_readings_throttle_reasons_and_bit_totals() -> None:
    xml = one_gpu(
        "<power_readings><power_draw>69.12 W</power_draw></power_readings>"
        "<clocks_throttle_reasons>"
        "<clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>"
        "<clocks_throttle_reason_sw_power_cap>Active</clocks_throttle_reason_sw_power_cap>"
        "<clocks_throttle_reason_display_clocks_setting>Active"
        "</clocks_throttle_reason_display_clocks_setting>"
        "</clocks_throttle_reasons>"
        "<ecc_errors><volatile>"
        "<single_bit><device_memory>3</device_memory><total>5</total></single_bit>"
        "<double_bit><device_memory>0</device_memory><total>1</total></double_bit>"
        "</volatile></ecc_errors>"
        "<retired_pages>"
        "<multiple_single_bit_retirement><retired_count>2</retired_count>"
        "</multiple_single_bit_retirement>"
        "<double_bit_retirement><retired_count>1</retired_count></double_bit_retirement>"
        "<pending_blacklist>Yes</pending_blacklist>"
        "</retired_pages>"
        "<remapped_rows>N/A</remapped_rows>"
    )
    g = gc.parse_smi_xml(xml).gpus["0000:1a:00.0"]
    assert g["power.draw"] == 69.12
    assert g["clocks_event_reasons"] == "display_clock_setting,sw_power_cap"
    assert (g["ecc.volatile.corrected"], g["ecc.volatile.uncorrected"]) == (5, 1)
    assert (g["ecc.aggregate.corrected"], g["ecc.aggregate.uncorrected"]) == (None, None)
    assert (g["retired_pages.single_bit_ecc"], g["retired_pages.double_bit_ecc"]) == (2, 1)
    assert g["retired_pages.pending"] == 1
    assert g["remapped_rows.correctable"] is None and g["remapped_rows.pending"] is None


def test_535_era_single_sram_uncorrectable_is_summed_with_dram() -> None:
    xml = one_gpu(
        "<ecc_errors><aggregate><sram_correctable>4</sram_correctable>"
        "<sram_uncorrectable>2</sram_uncorrectable><dram_correctable>10</dram_correctable>"
        "<dram_uncorrectable>1</dram_uncorrectable></aggregate></ecc_errors>"
    )
    g = gc.parse_smi_xml(xml).gpus["0000:1a:00.0"]
    assert (g["ecc.aggregate.corrected"], g["ecc.aggregate.uncorrected"]) == (14, 3)


def test_newer_drivers_average_power_is_preferred_to_instant() -> None:
    both = one_gpu(
        "<gpu_power_readings><average_power_draw>120.50 W</average_power_draw>"
        "<instant_power_draw>131.25 W</instant_power_draw></gpu_power_readings>"
    )
    smi = gc.parse_smi_xml(both)
    assert smi.gpus["0000:1a:00.0"]["power.draw"] == 120.5
    assert smi.notes[("0000:1a:00.0", "power.draw")] == "<gpu_power_readings/average_power_draw>"
    instant = one_gpu(
        "<gpu_power_readings><average_power_draw>N/A</average_power_draw>"
        "<instant_power_draw>131.25 W</instant_power_draw></gpu_power_readings>"
    )
    assert gc.parse_smi_xml(instant).gpus["0000:1a:00.0"]["power.draw"] == 131.25


@pytest.mark.parametrize(
    ("state", "status", "expected"),
    [
        ("Completed", "Success", ("completed", 1.0)),
        ("Completed", "Insufficient Resources", ("completed", 0.0)),
        ("In Progress", "N/A", ("in_progress", None)),
        ("Not Supported", "N/A", ("not_supported", None)),
        ("N/A", "N/A", (None, None)),
    ],
)
def test_fabric_state_and_health(state: str, status: str, expected: tuple[Any, Any]) -> None:
    xml = one_gpu(f"<fabric><state>{state}</state><status>{status}</status></fabric>")
    g = gc.parse_smi_xml(xml).gpus["0000:1a:00.0"]
    assert (g["fabric.state"], g["fabric.healthy"]) == expected


def test_compute_processes_count_types_with_a_c_and_unreadable_values_are_none() -> None:
    xml = one_gpu(
        "<temperature><gpu_temp>GPU is lost</gpu_temp><memory_temp>[Unknown Error]</memory_temp>"
        "</temperature><processes>"
        "<process_info><type>C</type></process_info><process_info><type>G</type></process_info>"
        "<process_info><type>C+G</type></process_info></processes>"
    )
    g = gc.parse_smi_xml(xml).gpus["0000:1a:00.0"]
    assert g["compute_processes"] == 2
    assert g["temperature.gpu"] is None and g["temperature.memory"] is None


# ----- comparison ------------------------------------------------------------------------------


def test_the_recorded_p5_agrees_and_na_is_exactly_where_a_side_has_no_reading() -> None:
    rows = gc.check(PROM, XML, NVLINK)
    assert len(rows) == 2 + 8 * (len(gc.GPU_SPECS) + 18)
    assert [r for r in rows if r.match == gc.NO] == []
    na = {(r.field, r.gpu) for r in rows if r.match == gc.NA}
    # retired pages: N/A on both sides (H100 remaps rows); fabric: the simulation serves none
    fields = ["retired_pages.single_bit_ecc", "retired_pages.double_bit_ecc"]
    fields += ["retired_pages.pending", "fabric.state", "fabric.healthy"]
    assert na == {(f, str(g)) for f in fields for g in range(8)}
    fabric = rows_by(rows)["fabric.state"]
    assert (fabric.agent, fabric.smi) == ("-", "completed")


@pytest.mark.parametrize(
    ("path", "text", "field", "match"),
    [
        # agent 64 C; tolerance 3 C
        ("temperature/gpu_temp", "67 C", "temperature.gpu", "yes"),
        ("temperature/gpu_temp", "61 C", "temperature.gpu", "yes"),
        ("temperature/gpu_temp", "68 C", "temperature.gpu", "NO"),
        # agent 500.357 W; tolerance max(30 W, 10 % of the larger)
        ("gpu_power_readings/power_draw", "555.00 W", "power.draw", "yes"),
        ("gpu_power_readings/power_draw", "560.00 W", "power.draw", "NO"),
        # agent 1980 MHz; 10 %
        ("clocks/sm_clock", "1785 MHz", "clocks.sm", "yes"),
        ("clocks/sm_clock", "345 MHz", "clocks.sm", "NO"),
        # agent 59582.4 MiB (v1: used + reserved); 256 MiB
        ("fb_memory_usage/used", "59500 MiB", "memory.used", "yes"),
        ("fb_memory_usage/used", "59600 MiB", "memory.used", "NO"),
        ("fb_memory_usage/total", "81920 MiB", "memory.total", "NO"),
        # agent 74 %; 20 points
        ("utilization/gpu_util", "94 %", "utilization.gpu", "yes"),
        ("utilization/gpu_util", "95 %", "utilization.gpu", "NO"),
        # counters and facts: exact
        ("ecc_errors/volatile/dram_correctable", "73", "ecc.volatile.corrected", "NO"),
        ("ecc_errors/volatile/sram_correctable", "1", "ecc.volatile.corrected", "NO"),
        ("ecc_errors/aggregate/sram_uncorrectable_parity", "1", "ecc.aggregate.uncorrected", "NO"),
        ("remapped_rows/remapped_row_pending", "Yes", "remapped_rows.pending", "NO"),
        ("remapped_rows/remapped_row_unc", "1", "remapped_rows.uncorrectable", "NO"),
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "4", "pcie.link.gen.current", "NO"),
        (
            "pci/pci_gpu_link_info/link_widths/current_link_width",
            "8x",
            "pcie.link.width.current",
            "NO",
        ),
        ("pci/replay_counter", "3", "pcie.replay_counter", "NO"),
        (
            "clocks_event_reasons/clocks_event_reason_sw_power_cap",
            "Active",
            "clocks_event_reasons",
            "NO",
        ),
        ("uuid", "GPU-00000000-0000-0000-0000-000000000000", "uuid", "NO"),
        # a side without the reading
        ("temperature/memory_temp", "N/A", "temperature.memory", "N/A"),
        ("remapped_rows/remapped_row_corr", "N/A", "remapped_rows.correctable", "N/A"),
    ],
)
def test_match_is_yes_within_tolerance_no_beyond_and_na_without_a_reading(
    path: str, text: str, field: str, match: str
) -> None:
    rows = gc.check(PROM, edit(XML, "00000000:53:00.0", path, text), NVLINK)
    assert rows_by(rows)[field].match == match, rows_by(rows)[field]
    assert [r.field for r in rows if r.match == gc.NO and r.field != field] == []


def test_a_series_the_agent_does_not_export_is_na() -> None:
    prom = drop_series(PROM, "topowatch_gpu_memory_temperature_celsius", "2")
    prom = drop_series(prom, "topowatch_gpu_ecc_errors_total", "2")
    rows = rows_by(gc.check(prom, XML, NVLINK), "2")
    assert (rows["temperature.memory"].agent, rows["temperature.memory"].match) == ("-", "N/A")
    assert rows["ecc.volatile.corrected"].match == "N/A"
    assert rows["temperature.gpu"].match == "yes"


def test_a_down_nvlink_is_a_mismatch_on_that_link_only() -> None:
    nvlink = NVLINK.splitlines()
    start = next(i for i, line in enumerate(nvlink) if line.startswith("GPU 3:"))
    assert nvlink[start + 1 + 7] == "\t Link 7: 26.562 GB/s"
    nvlink[start + 1 + 7] = "\t Link 7: <inactive>"
    rows = gc.check(PROM, XML, "\n".join(nvlink))
    bad = [(r.field, r.gpu, r.agent, r.smi) for r in rows if r.match == gc.NO]
    assert bad == [("nvlink[7].active", "3", "1", "0")]
    no_nvlink = gc.check(PROM, XML, None)
    assert {r.match for r in no_nvlink if r.field.startswith("nvlink[")} == {"N/A"}


def test_a_gpu_on_one_side_only_is_a_present_mismatch() -> None:
    rows = gc.check(PROM, without_gpu(XML, "00000000:B9:00.0"), NVLINK)
    six = [r for r in rows if r.gpu == "6"]
    assert [(r.field, r.agent, r.smi, r.match, r.note) for r in six] == [
        ("present", "yes", "no", "NO", "0000:b9:00.0")
    ]
    assert rows_by(rows, "-")["gpu_count"].match == "NO"
    assert rows_by(rows, "7")["temperature.gpu"].match == "yes"


def test_render_table_has_the_columns_and_only_mismatches_filters() -> None:
    rows = gc.check(PROM, edit(XML, "00000000:53:00.0", "temperature/gpu_temp", "80 C"), NVLINK)
    table = gc.render_table(rows)
    header = table.splitlines()[0].split()
    assert header == ["field", "gpu", "agent", "nvidia-smi", "match", "tolerance", "note"]
    assert len(table.splitlines()) == len(rows) + 2
    only = gc.render_table(rows, only_mismatches=True).splitlines()
    assert len(only) == 3 and only[2].split()[:5] == ["temperature.gpu", "0", "64", "80", "NO"]
    assert "1 mismatch" in gc.summary(rows)


# ----- XID event registration --------------------------------------------------------------------


def test_xid_rows_from_a_probe() -> None:
    agent = gc.parse_exposition(PROM)
    ok = gc.XidProbe(create="ok", registrations=dict.fromkeys(BUSES, "ok"), waits=3)
    rows = gc.xid_rows(ok, agent)
    assert [r.field for r in rows] == (
        ["xid.event_set"] + ["xid.registered"] * 8 + ["xid.waiting", "xid.agent_error"]
    )
    assert {r.match for r in rows} == {"yes"}

    one_failed = dict.fromkeys(BUSES, "ok") | {BUSES[5]: "failed: Unknown Error"}
    rows = gc.xid_rows(gc.XidProbe(create="ok", registrations=one_failed, waits=1), agent)
    assert [(r.field, r.gpu, r.agent) for r in rows if r.match == "NO"] == [
        ("xid.registered", "5", "failed: Unknown Error")
    ]

    no_set = gc.XidProbe(create="failed: Not Supported", agent_error="cannot create NVML event set")
    rows = gc.xid_rows(no_set, agent)
    assert {r.match for r in rows} == {"NO"}
    assert rows[0].agent == "failed: Not Supported"
    assert rows[1].agent == "never registered"

    assert [r.match for r in gc.xid_rows(gc.XidProbe(checked=False), agent)] == ["N/A"]


def test_the_real_source_registers_every_gpu_for_xids_on_the_simulated_nvml() -> None:
    """The in-process path of the script: production Poller + NvmlGpuSource, NVML behind the
    spy (here the simulation's, on a GPU machine the real pynvml)."""
    run = gc.run_agent_in_process(nvml=SimulatedNvml(get_profile("p5.48xlarge"), seed=7), settle=0)
    agent = gc.parse_exposition(run.exposition)
    assert sorted(agent.gpus, key=agent.index.get) == BUSES
    assert run.probe.create == "ok" and run.probe.waits > 0 and run.probe.agent_error is None
    assert run.probe.registrations == dict.fromkeys(BUSES, "ok")
    assert {r.match for r in gc.xid_rows(run.probe, agent)} == {"yes"}
    rows = gc.check(run.exposition, XML, NVLINK, run.probe)
    identity = [r for r in rows if r.field in ("uuid", "name", "pcie.link.gen.max")]
    assert len(identity) == 24 and {r.match for r in identity} == {"yes"}


def test_an_event_set_nvml_refuses_shows_as_not_registered() -> None:
    nvml = SimulatedNvml(
        get_profile("p5.48xlarge"), event_set_error=pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    run = gc.run_agent_in_process(nvml=nvml, settle=0)
    rows = gc.xid_rows(run.probe, gc.parse_exposition(run.exposition))
    assert rows[0].match == "NO" and "Not Supported" in rows[0].agent
    assert rows[-1].match == "NO" and "cannot create NVML event set" in rows[-1].agent


# ----- main: exit codes ------------------------------------------------------------------------


def fake_smi(tmp_path: Path, script: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def working_smi(tmp_path: Path) -> str:
    (tmp_path / "q.xml").write_text(XML)
    (tmp_path / "nvlink.txt").write_text(NVLINK)
    return fake_smi(
        tmp_path,
        f'if [ "$1" = "-q" ]; then cat {tmp_path}/q.xml; else cat {tmp_path}/nvlink.txt; fi\n',
    )


def test_no_nvidia_smi_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gc.main([]) == 2
    assert "nvidia-smi not found" in capsys.readouterr().out


def test_no_nvml_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nvml = SimulatedNvml(get_profile("p5.48xlarge"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert gc.main(["--nvidia-smi", working_smi(tmp_path)], nvml=nvml) == 2
    assert "NVML unavailable: NVML library libnvidia-ml.so.1 not found" in capsys.readouterr().out


def test_nvidia_smi_that_cannot_reach_the_driver_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smi = fake_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n",
    )
    nvml = SimulatedNvml(get_profile("p5.48xlarge"), seed=7)
    assert gc.main(["--nvidia-smi", smi, "--settle", "0"], nvml=nvml) == 2
    assert "couldn't communicate with the NVIDIA driver" in capsys.readouterr().out


def test_a_full_run_prints_the_table_and_exits_0_whatever_it_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml = SimulatedNvml(get_profile("p5.48xlarge"), seed=7)
    argv = ["--nvidia-smi", working_smi(tmp_path), "--settle", "0"]
    assert gc.main([*argv, "--cost-polls", "2", "--cost-interval", "0"], nvml=nvml) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:5] == ["field", "gpu", "agent", "nvidia-smi", "match"]
    assert re.search(r"^xid\.registered\s+7\s+yes\s", out, re.M)
    assert "Tolerances" in out
    # then what NVML costs, per function and per GPU per poll
    assert "NVML CPU cost (2 polls every 0 s, 8 GPUs" in out
    assert re.search(r"^\s+nvmlDeviceGetFieldValues\s+1\.00\s", out, re.M)
    assert re.search(r"^\s+NVML, all functions\s+\d+\.\d+\s+\d+\.\d+", out, re.M)


def test_recorded_files_compare_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--exposition", str(FIXTURES / "p5.48xlarge-agent.prom")]
    argv += ["--smi-xml", str(FIXTURES / "p5.48xlarge-nvidia-smi-q-x.xml")]
    argv += ["--nvlink-status", str(FIXTURES / "p5.48xlarge-nvlink-s.txt")]
    assert gc.main(argv) == 0
    out = capsys.readouterr().out
    assert "402 rows: 362 match, 0 mismatch, 40 N/A" in out
    assert "NVML CPU cost: not measured (recorded files)" in out


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_loads(), reason="a real GPU here: run the script itself")
def test_cli_mode_runs_topowatch_node_once_and_sees_nvml_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gc.main(["--cli", "--nvidia-smi", working_smi(tmp_path)]) == 2
    assert "topowatch_nvml_up 0" in capsys.readouterr().out


# ----- what NVML costs ---------------------------------------------------------------------------

# Issue 28's H100 figures (driver 580.159.04, one GPU, 12 polls at 5 s) as the timing wrapper
# would have collected them: function -> (calls, CPU seconds).
H100_BEFORE = {
    "nvmlDeviceGetViolationStatus": (72, 72 * 0.9e-3),
    "nvmlDeviceGetTotalEnergyConsumption": (12, 12 * 4.4e-3),
    "nvmlGpmMetricsGet": (12, 12 * 1.9e-3),
    "nvmlDeviceGetFieldValues": (12, 12 * 0.7e-3),
    "nvmlDeviceGetPowerUsage": (12, 12 * 0.003e-3),
    "nvmlDeviceGetPcieThroughput": (0, 0.0),
}


def test_cost_rows_are_per_gpu_per_poll_dearest_first() -> None:
    rows = gc.cost_rows(H100_BEFORE, gpus=1, polls=12)
    assert [r.function for r in rows] == [
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetPowerUsage",
    ]  # a function never called is left out
    violation = rows[0]
    assert violation.calls_per_gpu_poll == 6
    assert violation.ms_per_call == pytest.approx(0.9)
    assert violation.ms_per_gpu_poll == pytest.approx(5.4)
    assert sum(r.ms_per_gpu_poll for r in rows) == pytest.approx(12.403)
    halved = gc.cost_rows(H100_BEFORE, gpus=2, polls=12)  # the same calls over two GPUs
    assert halved[0].ms_per_gpu_poll == pytest.approx(2.7)


def test_render_costs_names_each_function_the_total_and_the_node_share() -> None:
    run = gc.CostRun(gpus=1, polls=12, interval=5.0, calls=H100_BEFORE, poll_seconds=12 * 13e-3)
    text = gc.render_costs(run)
    assert "NVML CPU cost (12 polls every 5 s, 1 GPUs" in text
    assert re.search(r"nvmlDeviceGetViolationStatus\s+6\.00\s+0\.900\s+5\.400", text)
    assert re.search(r"NVML, all functions\s+10\.00\s+12\.403\s+\(2\.48 mCPU", text)
    assert re.search(r"whole poll \(the agent, process time\)\s+13\.000", text)


def test_costs_are_counted_per_function_on_the_simulated_nvml() -> None:
    """On the simulation the times say nothing (its Python, not a driver), but what is called
    how often is the agent's own: one field-value batch per GPU per poll, no violation-status
    or ECC calls (their values are in the batch)."""
    run = gc.measure_costs(SimulatedNvml(get_profile("p5.48xlarge"), seed=7), 2, 0.0)
    assert (run.gpus, run.polls) == (8, 2)
    per = {r.function: r.calls_per_gpu_poll for r in gc.cost_rows(run.calls, 8, 2)}
    assert per["nvmlDeviceGetFieldValues"] == 1.0
    assert per["nvmlDeviceGetNvLinkErrorCounter"] == 18.0
    assert "nvmlDeviceGetViolationStatus" not in per
    assert "nvmlDeviceGetTotalEccErrors" not in per
    assert run.poll_seconds >= 0


def test_no_cost_measurement_without_nvml_or_when_asked_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml = SimulatedNvml(get_profile("p5.48xlarge"), seed=7)
    argv = ["--nvidia-smi", working_smi(tmp_path), "--settle", "0", "--cost-polls", "0"]
    assert gc.main(argv, nvml=nvml) == 0
    assert "NVML CPU cost: not measured (--cost-polls 0)" in capsys.readouterr().out
