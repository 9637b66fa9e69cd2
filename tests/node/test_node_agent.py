"""The node agent end to end on the simulation: what a scrape shows, with and without faults."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.snapshot import PodRef
from exporter.sources.interfaces import PodResourcesSource
from exporter.sources.sysfs import EFA_DEVICE_COUNTERS, EFA_PORT_COUNTERS
from tests.conftest import SimHarness, promtool_lint, reference

Sim = Callable[..., SimHarness]
Series = list[tuple[dict[str, str], float]]

PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")
ALL_FAULTS = (
    "xid=79@gpu3",
    "gpu-lost@gpu2",
    "nvlink-down@gpu0:link3",
    "nvlink-crc@gpu1:link0",
    "ecc-dbe@gpu1",
    "remap-failure@gpu0",
    "thermal@gpu1",
    "pcie-degraded@gpu0",
    "efa-unresponsive@{efa}",
    "efa-missing@{efa2}",
    "rootfs-ro",
    "fabric-degraded@gpu1",
)


def series(exposition: bytes) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for fam in text_string_to_metric_families(exposition.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(found: dict[str, Series], metric: str, /, **labels: str) -> float:
    matches = [
        v for lab, v in found.get(metric, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(matches) == 1, f"{metric}{labels}: {len(matches)} series"
    return matches[0]


def faults_for(sim: Sim, profile: str) -> tuple[str, ...]:
    probe = sim(profile)
    efa = [e.name for e in probe.node.profile.efa]
    return tuple(f.format(efa=efa[0], efa2=efa[-1]) for f in ALL_FAULTS)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("with_faults", [False, True], ids=["healthy", "faulty"])
def test_plain_exposition_is_promtool_clean(sim: Sim, profile: str, with_faults: bool) -> None:
    faults = faults_for(sim, profile) if with_faults else ()
    h = sim(profile, *faults)
    h.poll()
    _, exposition = h.poll()
    assert promtool_lint(exposition.text) == ""


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("with_faults", [False, True], ids=["healthy", "faulty"])
def test_compat_expositions_lint_clean_but_for_the_peers_own_names(
    sim: Sim, profile: str, with_faults: bool
) -> None:
    """dcgm-exporter's `modelName` label is camelCase and one of its metric names contains
    'COUNTER'; renaming either would break the dashboards compat mode exists for, so exactly
    those complaints, and nothing else, are allowed."""
    faults = faults_for(sim, profile) if with_faults else ()
    h = sim(profile, *faults, compat=frozenset({"dcgm", "efa"}))
    h.poll()
    _, exposition = h.poll()
    complaints = {line for line in promtool_lint(exposition.text).splitlines() if line}
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    found = series(exposition.text)
    peer_imposed = {f"{name} {camel}" for name in found if name.startswith("DCGM_FI_")}
    peer_imposed.add(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'"
    )
    assert complaints, "expected the known modelName complaint"
    assert complaints <= peer_imposed, complaints - peer_imposed


def test_every_series_carries_node_and_joins_topology(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    _, exposition = h.poll()
    found = series(exposition.text)
    for name, items in found.items():
        for labels, _ in items:
            assert labels.get("node") == "sim-node-1", name
    topo = found["topowatch_node_topology_info"]
    assert len(topo) == 1
    labels = topo[0][0]
    assert labels["layer1"].startswith("nn-") and labels["layer3"].startswith("nn-")
    assert labels["instance_type"] == "ml.p5.48xlarge"
    assert labels["zone"] == "us-east-2b"


def test_gb200_topology_names_its_ultraserver(sim: Sim) -> None:
    h = sim("p6e-gb200.36xlarge")
    _, exposition = h.poll()
    labels = series(exposition.text)["topowatch_node_topology_info"][0][0]
    assert labels["ultraserver"].startswith("us-")
    assert labels["layer4"].startswith("nn-")


def test_p5_exports_every_gpu_nvlink_efa_and_numa_family(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    assert len(found["topowatch_gpu_up"]) == 8
    assert all(v == 1 for _, v in found["topowatch_gpu_up"])
    for name in (
        "topowatch_gpu_utilization_ratio",
        "topowatch_gpu_memory_utilization_ratio",
        "topowatch_gpu_memory_used_bytes",
        "topowatch_gpu_memory_free_bytes",
        "topowatch_gpu_memory_total_bytes",
        "topowatch_gpu_power_watts",
        "topowatch_gpu_energy_joules_total",
        "topowatch_gpu_temperature_celsius",
        "topowatch_gpu_memory_temperature_celsius",
        "topowatch_gpu_sm_clock_hertz",
        "topowatch_gpu_memory_clock_hertz",
        "topowatch_gpu_pcie_link_generation",
        "topowatch_gpu_pcie_link_generation_max",
        "topowatch_gpu_pcie_link_width",
        "topowatch_gpu_pcie_link_width_max",
        "topowatch_gpu_pcie_replays_total",
        "topowatch_gpu_pcie_tx_bytes_total",
        "topowatch_gpu_pcie_rx_bytes_total",
        "topowatch_gpu_remapped_rows_pending",
        "topowatch_gpu_remapped_rows_failure",
        "topowatch_gpu_sm_active_ratio",
        "topowatch_gpu_sm_occupancy_ratio",
        "topowatch_gpu_tensor_active_ratio",
        "topowatch_gpu_dram_active_ratio",
        "topowatch_gpu_fp64_active_ratio",
        "topowatch_gpu_fp32_active_ratio",
        "topowatch_gpu_fp16_active_ratio",
        "topowatch_gpu_numa_info",
        "topowatch_gpu_processes_off_numa",
    ):
        assert len(found.get(name, [])) == 8, name
    assert len(found["topowatch_gpu_ecc_errors_total"]) == 32  # 2 types x 2 scopes x 8
    assert len(found["topowatch_gpu_remapped_rows_total"]) == 16
    assert len(found["topowatch_nvlink_up"]) == 8 * 18
    for name in (
        "topowatch_nvlink_tx_bytes_total",
        "topowatch_nvlink_rx_bytes_total",
        "topowatch_nvlink_crc_flit_errors_total",
        "topowatch_nvlink_crc_data_errors_total",
        "topowatch_nvlink_replay_errors_total",
        "topowatch_nvlink_recovery_errors_total",
        "topowatch_nvlink_remote_info",
    ):
        assert len(found.get(name, [])) == 8 * 18, name
    assert one(found, "topowatch_efa_devices") == 32
    for counter in EFA_DEVICE_COUNTERS:
        assert len(found[f"topowatch_efa_{counter}_total"]) == 32, counter
    for counter in EFA_PORT_COUNTERS:
        assert len(found[f"topowatch_efa_{counter}_total"]) == 32, counter
        assert all(lab["port"] == "1" for lab, _ in found[f"topowatch_efa_{counter}_total"])
    assert len(found["topowatch_efa_port_up"]) == 32
    assert one(found, "topowatch_efa_port_rate_bytes_per_second", device="rdmap16s27") == 100e9 / 8
    efa_info = {lab["device"]: lab for lab, _ in found["topowatch_efa_device_info"]}
    assert efa_info["rdmap16s27"]["pci_address"] == "0000:10:1b.0"
    assert efa_info["rdmap16s27"]["numa_node"] == "0"
    assert efa_info["rdmap128s27"]["numa_node"] == "1"
    cpus = {lab["numa_node"]: v for lab, v in found["topowatch_numa_cpus"]}
    assert cpus == {"0": 96, "1": 96}
    assert one(found, "topowatch_numa_memory_bytes", numa_node="0", field="MemTotal") > 0
    assert one(found, "topowatch_numa_pages_total", numa_node="1", event="numa_hit") >= 0


def test_counters_grow_between_polls(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    _, first = h.poll()
    _, second = h.poll(step=5.0)
    _, minute = h.poll(step=60.0)
    a, b = series(first.text), series(second.text)
    # Total energy is read once a minute (~4 ms a GPU on an H100): served as read in between.
    energy = "topowatch_gpu_energy_joules_total"
    assert one(b, energy, gpu="0") == one(a, energy, gpu="0")
    assert one(series(minute.text), energy, gpu="0") > one(a, energy, gpu="0")
    for name, labels in (
        ("topowatch_gpu_pcie_tx_bytes_total", {"gpu": "0"}),
        ("topowatch_nvlink_tx_bytes_total", {"gpu": "0", "link": "0"}),
        ("topowatch_efa_tx_bytes_total", {"device": "rdmap16s27"}),
        ("topowatch_efa_rdma_read_bytes_total", {"device": "rdmap16s27"}),
    ):
        assert one(b, name, **labels) > one(a, name, **labels), name


def test_gpu_attributed_to_its_pod(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    _, exposition = h.poll()
    found = series(exposition.text)
    held = {
        lab["gpu"]: (lab["namespace"], lab["pod"], lab["container"])
        for lab, _ in found["topowatch_gpu_up"]
    }
    assert held["0"] == ("hyperpod-ns-research", "llama-pretrain-worker-0", "pytorch")
    assert held["7"] == ("", "", "")  # the idle GPU


def test_affinity_pairs_gpus_with_nearest_efa_and_flags_misplaced_process(sim: Sim) -> None:
    h = sim("p5.48xlarge", "numa-unpinned@gpu7")
    _, exposition = h.poll()
    found = series(exposition.text)
    profile = h.node.profile
    for gpu in profile.gpus:
        pairs = {
            lab["device"]
            for lab, _ in found["topowatch_gpu_nearest_efa_info"]
            if lab["gpu"] == str(gpu.index)
        }
        assert pairs == set(profile.nearest_efa(gpu.index))
        numa = [
            lab["numa_node"]
            for lab, _ in found["topowatch_gpu_numa_info"]
            if lab["gpu"] == str(gpu.index)
        ]
        assert numa == [str(gpu.numa_node)]
    off = {lab["gpu"]: v for lab, v in found["topowatch_gpu_processes_off_numa"]}
    assert off == {str(i): (1.0 if i == 7 else 0.0) for i in range(8)}


def test_lost_gpu_is_down_and_counted_while_the_rest_is_exported(sim: Sim) -> None:
    h = sim("p5.48xlarge", "gpu-lost@gpu2")
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    up = {lab["gpu"]: v for lab, v in found["topowatch_gpu_up"]}
    assert up["2"] == 0 and all(v == 1 for g, v in up.items() if g != "2")
    assert not [lab for lab, _ in found["topowatch_gpu_power_watts"] if lab["gpu"] == "2"]
    assert len(found["topowatch_gpu_power_watts"]) == 7
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="gpu",
            reason="gpu_unreadable",
        )
        == 2
    )
    assert len(found["topowatch_efa_tx_bytes_total"]) == 32


def test_xid_counts_every_event_with_catalog_name_and_action(sim: Sim) -> None:
    h = sim("p5.48xlarge", "xid=79@gpu3")
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    labels = {
        "gpu": "3",
        "xid": "79",
        "name": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "action": "RESTART_BM",
    }
    assert one(found, "topowatch_xid_errors_total", **labels) == 1  # delivered once, counted once
    assert one(found, "topowatch_gpu_last_xid", gpu="3") == 79
    from exporter.sim.faults import parse_fault

    h.node.inject(parse_fault("xid=79@gpu3"))  # the same XID again must be an increase
    _, exposition = h.poll()
    assert one(series(exposition.text), "topowatch_xid_errors_total", **labels) == 2


class Handover:
    """The simulation's pod assignments, with GPUs handed to other pods on demand."""

    def __init__(self, inner: PodResourcesSource) -> None:
        self.inner = inner
        self.moved: dict[str, PodRef] = {}

    def gpu_assignments(self) -> Mapping[str, PodRef]:
        return {**self.inner.gpu_assignments(), **self.moved}

    def close(self) -> None:
        self.inner.close()


def test_xid_series_are_keyed_on_the_gpu_and_name_the_pod_that_held_it_then(sim: Sim) -> None:
    """A pod taking the GPU over after an XID changes no XID series (an alert would take a new
    series for a new XID); the event's time and holder change with the next XID only."""
    from exporter.sim.faults import parse_fault

    h = sim("p5.48xlarge", "xid=79@gpu3")
    assert h.sources.pods is not None
    pods = Handover(h.sources.pods)
    h.sources.pods = pods
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    ((gpu3, _),) = [(lab, v) for lab, v in found["topowatch_gpu_up"] if lab["gpu"] == "3"]
    held_then = (gpu3["namespace"], gpu3["pod"], gpu3["container"])
    assert held_then == ("hyperpod-ns-research", "llama-pretrain-worker-0", "pytorch")
    hardware = {k: gpu3[k] for k in ("node", "gpu", "uuid", "pci_bus_id", "model")}
    code = {
        "xid": "79",
        "name": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "action": "RESTART_BM",
    }
    ((counter, count),) = found["topowatch_xid_errors_total"]
    assert (counter, count) == ({**hardware, **code}, 1)  # no pod labels at all
    ((event, at),) = found["topowatch_xid_last_event_timestamp_seconds"]
    holder = dict(zip(("namespace", "pod", "container"), held_then, strict=True))
    assert event == {**hardware, **holder, **code}

    evaluator = PodRef("hyperpod-ns-llm", "eval-0", "eval")
    pods.moved[gpu3["uuid"]] = evaluator
    _, exposition = h.poll()
    found = series(exposition.text)
    assert one(found, "topowatch_gpu_up", gpu="3", pod="eval-0") == 1  # the GPU changed hands
    assert found["topowatch_xid_errors_total"] == [({**hardware, **code}, 1)]
    assert found["topowatch_xid_last_event_timestamp_seconds"] == [(event, at)]

    h.node.inject(parse_fault("xid=79@gpu3"))  # the same XID again, under the new holder
    for _ in range(20):
        _, exposition = h.poll()
        found = series(exposition.text)
        if found["topowatch_xid_errors_total"] == [({**hardware, **code}, 2)]:
            break
    else:
        pytest.fail("the second XID never arrived")
    ((event, later),) = found["topowatch_xid_last_event_timestamp_seconds"]
    held_now = {"namespace": "hyperpod-ns-llm", "pod": "eval-0", "container": "eval"}
    assert event == {**hardware, **held_now, **code}
    assert later > at


def test_hardware_faults_show_in_their_series(sim: Sim) -> None:
    h = sim(
        "p5.48xlarge",
        "nvlink-down@gpu0:link3",
        "ecc-dbe@gpu1",
        "thermal@gpu5",
        "pcie-degraded@gpu6",
        "remap-failure@gpu4",
        "efa-missing@rdmap16s27",
        "efa-unresponsive@rdmap32s27",
        "rootfs-ro",
    )
    _, first = h.poll()
    _, second = h.poll()
    a, found = series(first.text), series(second.text)
    assert one(found, "topowatch_nvlink_up", gpu="0", link="3") == 0
    assert one(found, "topowatch_nvlink_up", gpu="0", link="2") == 1
    assert (
        one(found, "topowatch_gpu_ecc_errors_total", gpu="1", type="uncorrected", scope="volatile")
        > 0
    )
    assert (
        one(found, "topowatch_gpu_clock_event_reason", gpu="5", reason="hw_thermal_slowdown") == 1
    )
    assert not [
        lab
        for lab, _ in found["topowatch_gpu_clock_event_reason"]
        if lab["gpu"] == "0" and "thermal" in lab["reason"]
    ]
    assert one(found, "topowatch_gpu_pcie_link_generation", gpu="6") < one(
        found, "topowatch_gpu_pcie_link_generation_max", gpu="6"
    )
    assert one(found, "topowatch_gpu_remapped_rows_failure", gpu="4") == 1
    assert one(found, "topowatch_efa_devices") == 31
    assert not [
        lab for lab, _ in found["topowatch_efa_tx_bytes_total"] if lab["device"] == "rdmap16s27"
    ]
    name = "topowatch_efa_unresponsive_remote_events_total"
    assert one(found, name, device="rdmap32s27") > one(a, name, device="rdmap32s27")
    assert one(found, name, device="rdmap48s27") == 0
    assert one(found, "topowatch_node_rootfs_read_only") == 1


def test_garbage_in_sysfs_is_skipped_counted_and_the_rest_read(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    h.poll()
    h.node.sysfs.corrupt(
        "sys/class/infiniband/rdmap16s27/ports/1/hw_counters/tx_bytes", "not-a-number\n"
    )
    # the simulation must not overwrite our garbage before the read: freeze its clock step
    h.node.sysfs.advance = lambda now: None  # type: ignore[method-assign]
    _, exposition = h.poll()
    found = series(exposition.text)
    assert not [
        lab for lab, _ in found["topowatch_efa_tx_bytes_total"] if lab["device"] == "rdmap16s27"
    ]
    assert one(found, "topowatch_efa_rx_bytes_total", device="rdmap16s27") > 0
    assert (
        one(
            found,
            "topowatch_exporter_collector_errors_total",
            collector="efa",
            reason="malformed_file",
        )
        == 1
    )
    assert promtool_lint(exposition.text) == ""


def test_compat_dcgm_names_are_dcgm_exporters_defaults(sim: Sim) -> None:
    h = sim("p5.48xlarge", compat=frozenset({"dcgm"}))
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    defaults: set[str] = set()
    disabled: set[str] = set()
    with reference("nvidia/dcgm-exporter-default-counters.csv").open() as f:
        for row in csv.reader(f):
            if len(row) < 3 or row[1].strip() == "label":
                continue
            name = row[0].strip()
            (disabled if name.startswith("#") else defaults).add(name.lstrip("# "))
    dcgm_names = {n for n in found if n.startswith("DCGM_FI_")}
    # every name beyond the defaults is one of the CSV's disabled rows (tests/node/test_compat.py)
    assert dcgm_names - defaults <= disabled
    missing = defaults - dcgm_names
    assert missing == {
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    }, "documented omissions in exporter/node/compat/dcgm.py"
    labels = found["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert set(labels) >= {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    }
    assert labels["device"] == f"nvidia{labels['gpu']}"
    sm_mhz = one(found, "DCGM_FI_DEV_SM_CLOCK", gpu="0")
    assert 100 < sm_mhz < 3000  # MHz, like dcgm-exporter
    assert one(found, "DCGM_FI_PROF_PCIE_TX_BYTES", gpu="0") > 0  # a rate from two polls
    pod_labels = one(found, "DCGM_FI_DEV_GPU_UTIL", gpu="0", pod="llama-pretrain-worker-0")
    assert 0 <= pod_labels <= 100


def test_compat_efa_names_are_the_efa_exporters(sim: Sim) -> None:
    h = sim("p5.48xlarge", compat=frozenset({"efa"}))
    _, exposition = h.poll()
    found = series(exposition.text)
    for counter in EFA_PORT_COUNTERS:
        rows = found[f"node_amazonefa_{counter}"]
        assert len(rows) == 32
        assert set(rows[0][0]) == {"device", "port"}
    assert one(found, "node_amazonefa_tx_bytes", device="rdmap16s27", port="1") == one(
        found, "topowatch_efa_tx_bytes_total", device="rdmap16s27", port="1"
    )


def test_openmetrics_rendering_of_a_faulty_node_parses(sim: Sim) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

    h = sim("p6e-gb200.36xlarge", "gpu-lost@gpu1", "xid=48@gpu0", compat=frozenset({"dcgm", "efa"}))
    h.poll()
    _, exposition = h.poll()
    names = {f.name for f in parse_om(exposition.openmetrics.decode())}
    assert {
        "topowatch_gpu_up",
        "topowatch_xid_errors",
        "topowatch_node_topology",
        "DCGM_FI_DEV_GPU_TEMP",
    } <= names
    fabric = series(exposition.text)["topowatch_gpu_fabric_info"]
    assert {lab["state"] for lab, _ in fabric} == {"completed"}


NVLINK5_FAMILIES = (
    "topowatch_nvlink_tx_packets_total",
    "topowatch_nvlink_rx_packets_total",
    "topowatch_nvlink_rx_errors_total",
    "topowatch_nvlink_rx_malformed_packet_errors_total",
    "topowatch_nvlink_rx_buffer_overrun_errors_total",
    "topowatch_nvlink_rx_remote_errors_total",
    "topowatch_nvlink_rx_general_errors_total",
    "topowatch_nvlink_local_link_integrity_errors_total",
    "topowatch_nvlink_tx_discards_total",
    "topowatch_nvlink_link_recoveries_total",
    "topowatch_nvlink_link_recovery_successes_total",
    "topowatch_nvlink_link_recovery_failures_total",
)


def test_gb200_exports_nvlink5_counters_and_fabric_status(sim: Sim) -> None:
    """NVLink5's NVML_FI_DEV_NVLINK_COUNT_* per link, and the fabric probe's status."""
    h = sim("p6e-gb200.36xlarge", "nvlink-crc@gpu1:link0", "fabric-degraded@gpu2")
    _, first = h.poll()
    _, second = h.poll()
    assert promtool_lint(second.text) == ""
    a, found = series(first.text), series(second.text)
    for family in NVLINK5_FAMILIES:
        rows = found[family]
        assert len(rows) == 4 * 18, family
        assert {"node", "gpu", "uuid", "link"} <= set(rows[0][0])
    name = "topowatch_nvlink_rx_errors_total"
    assert one(found, name, gpu="1", link="0") > one(a, name, gpu="1", link="0")
    assert one(found, name, gpu="1", link="1") == 0
    sent = "topowatch_nvlink_tx_packets_total"
    assert one(found, sent, gpu="0", link="4") > one(a, sent, gpu="0", link="4")
    assert "topowatch_nvlink_crc_flit_errors_total" not in found  # gone on Blackwell
    assert one(found, "topowatch_gpu_fabric_healthy", gpu="2") == 0
    assert one(found, "topowatch_gpu_fabric_healthy", gpu="0") == 1
    statuses = {lab["gpu"]: lab["status"] for lab, _ in found["topowatch_gpu_fabric_info"]}
    assert statuses == {
        "0": "NVML_SUCCESS",
        "1": "NVML_SUCCESS",
        "2": "NVML_ERROR_INSUFFICIENT_RESOURCES",
        "3": "NVML_SUCCESS",
    }


def test_hopper_exports_no_nvlink5_families(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    h.poll()
    _, exposition = h.poll()
    found = series(exposition.text)
    assert not set(NVLINK5_FAMILIES) & set(found)
    assert len(found["topowatch_nvlink_crc_flit_errors_total"]) == 8 * 18
