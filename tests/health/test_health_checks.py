"""Health checks on simulated nodes and on hand-made snapshots: every fault yields its finding,
a healthy node nothing to act on, and the thresholds, XID rules and configuration behave as an
operator would expect."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from exporter.core.findings import (
    Finding,
    FindingsFormatError,
    decode_findings,
    findings_from_json,
    findings_to_json,
)
from exporter.core.snapshot import (
    CollectorStatus,
    GpuInventory,
    NodeSnapshot,
    NodeTopology,
    NvmlFailure,
    PodRef,
    RetiredPages,
    XidEvent,
)
from healthcheck.detection.checks import History, run_check_families, run_checks
from healthcheck.detection.checks.xid import verdict
from healthcheck.detection.checks.xid_memory import XidMemory, remember
from healthcheck.detection.config import (
    ConfigError,
    HealthConfig,
    XidConfig,
    config_from_mapping,
    load_config,
)
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from tests.conftest import SimHarness, healthy_snapshot

Sim = Callable[..., SimHarness]
T0 = 1_750_000_000.0

# fault -> (check, component, severity, action, actionable once damped)
FAULTS = {
    "xid=79@gpu3": ("xid", "gpu3", "fatal", "reboot", True),
    "gpu-lost@gpu2": ("gpu_missing", "gpu2", "critical", "replace", True),
    "nvlink-down@gpu0:link3": ("nvlink_down", "gpu0:link3", "critical", "reboot", True),
    "nvlink-crc@gpu1:link0": ("nvlink_errors", "gpu1:link0", "critical", "reboot", True),
    # A contained error (the XID 94 state: recovery action none) ends one application, not the
    # node: reported, no action (NVIDIA memory error management; issue 28, tests/health/
    # test_gpu_recovery.py). It asked for a reboot before.
    "ecc-dbe@gpu1": ("ecc_uncorrectable", "gpu1", "warning", "none", False),
    "remap-failure@gpu4": ("row_remap_failure", "gpu4", "critical", "replace", True),
    "thermal@gpu5": ("thermal_slowdown", "gpu5", "warning", "none", False),
    "pcie-degraded@gpu6": ("pcie_degraded", "gpu6", "warning", "reboot", True),
    "efa-missing@rdmap16s27": ("efa_missing", "node", "critical", "reboot", True),
    "efa-unresponsive@rdmap16s27": ("efa_remote_errors", "rdmap16s27:1", "warning", "none", False),
    "rootfs-ro": ("rootfs_read_only", "node", "critical", "reboot", True),
    # a launcher that left a process unpinned: a warning, no action
    "numa-unpinned@gpu7": ("numa_misplaced", "gpu7", "warning", "none", False),
    # NVML's own failures, by what their code means (tests/health/test_nvml_classification.py)
    "gpu-reset-required@gpu2": ("gpu_reset_required", "gpu2", "critical", "reboot", True),
    "nvml-timeout@gpu5": ("gpu_timeout", "gpu5", "warning", "none", False),  # no evidence
    "nvml-library-missing": ("deployment", "node", "warning", "none", False),
    "nvml-no-permission": ("deployment", "node", "warning", "none", False),
}


def observe_until(
    h: SimHarness, monitor: HealthMonitor, polls: int, step: float = 5.0
) -> HealthReport:
    """Poll `polls` times; XIDs arrive on NVML's event thread, so give it a moment between."""
    report = None
    for _ in range(polls):
        snapshot, _ = h.poll(step)
        report = monitor.observe(snapshot)
        time.sleep(0.02)
    assert report is not None
    return report


def keyed(report: HealthReport) -> dict[tuple[str, str], Finding]:
    return {f.key: f for f in report.findings}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_simulated_fault_yields_its_finding(sim: Sim, fault: str) -> None:
    check, component, severity, action, actionable = FAULTS[fault]
    h = sim("p5.48xlarge", fault)
    monitor = HealthMonitor()
    # 20 s steps: the thermal slowdown must last 60 s to count as sustained
    report = observe_until(h, monitor, polls=5, step=20.0)
    found = keyed(report)
    assert (check, component) in found, [f.key for f in report.findings]
    f = found[(check, component)]
    assert (f.severity, f.action, f.actionable) == (severity, action, actionable), f
    assert f.evidence
    acted_on = {f.key for f in report.actionable}
    assert acted_on <= {(check, component), *_companions(fault)}


def _companions(fault: str) -> set[tuple[str, str]]:
    """Findings a fault legitimately brings along (a DBE leaves a remap pending)."""
    return {"ecc-dbe@gpu1": {("row_remap_pending", "gpu1")}}.get(fault, set())


@pytest.mark.parametrize("profile", ["p5.48xlarge", "p6e-gb200.36xlarge"])
def test_healthy_node_has_nothing_actionable(sim: Sim, profile: str) -> None:
    h = sim(profile)
    report = observe_until(h, HealthMonitor(), polls=4)
    assert report.healthy and report.actionable == ()
    assert report.findings == ()  # every simulated process is pinned to its GPU's NUMA node


def test_xid_79_is_actionable_on_the_poll_it_arrives(sim: Sim) -> None:
    h = sim("p5.48xlarge", "xid=79@gpu3")
    monitor = HealthMonitor()
    for _ in range(20):
        snapshot, _ = h.poll()
        report = monitor.observe(snapshot)
        if snapshot.gpu.xid_events:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the XID never arrived")
    assert keyed(report)[("xid", "gpu3")].actionable  # fatal: no damping wait


def test_non_fatal_fault_waits_for_k_of_n_polls(sim: Sim) -> None:
    h = sim("p5.48xlarge", "rootfs-ro")
    monitor = HealthMonitor()
    seen = [keyed(observe_until(h, monitor, 1))[("rootfs_read_only", "node")] for _ in range(3)]
    assert [f.actionable for f in seen] == [False, False, True]
    assert seen[0].first_seen == seen[2].first_seen < seen[2].last_seen


# --- hand-made snapshots ------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    """A healthy p5 snapshot to bend into each case."""
    return healthy_snapshot("p5.48xlarge", tmp_path_factory.mktemp("base"))


def with_gpu(snapshot: NodeSnapshot, index: int, **changes: object) -> NodeSnapshot:
    gpus = tuple(
        dataclasses.replace(g, **changes) if g.index == index else g  # type: ignore[arg-type]
        for g in snapshot.gpu.gpus
    )
    return dataclasses.replace(snapshot, gpu=dataclasses.replace(snapshot.gpu, gpus=gpus))


def checks_of(
    snapshot: NodeSnapshot, history: History | None = None, **config: object
) -> set[tuple[str, str, str]]:
    cfg = config_from_mapping(config)
    found = run_checks(snapshot, history or History(), cfg, snapshot.taken_at)
    return {(f.check, f.component, f.action) for f in found} - {("numa_misplaced", "gpu7", "none")}


@pytest.mark.parametrize(
    ("xid", "severity", "action"),
    [
        (79, "fatal", "reboot"),  # off the bus: RESTART_BM; the ladder replaces on recurrence
        (48, "fatal", "reboot"),  # double-bit ECC workflow
        (64, "fatal", "reboot"),  # retirement failure: RESET_GPU
        (63, "info", "none"),  # a row remap event: the catalog says ignore
        (74, "fatal", "reboot"),  # NVLink workflow
        (94, "info", "none"),  # contained ECC: restart the app
        (95, "fatal", "reboot"),  # uncontained ECC: reset
        (119, "fatal", "reboot"),  # GSP RPC timeout
        (120, "fatal", "reboot"),  # GSP error
        (13, "info", "none"),  # application
        (31, "info", "none"),  # application
        (1, "warning", "none"),  # "report the issue": a reboot would not help
        (4242, "warning", "none"),  # newer than the catalog: reported, no action
    ],
)
def test_xid_verdict_follows_the_catalog_bucket(xid: int, severity: str, action: str) -> None:
    assert verdict(xid, XidConfig().app_xids) == (severity, action)


def xid_event(xid: int, at: float, gpu: int = 0, uuid: str = "GPU-a") -> XidEvent:
    return XidEvent(gpu_index=gpu, uuid=uuid, xid=xid, timestamp=at)


def test_xid_repeats_within_the_dedup_window_are_one_incident() -> None:
    cfg = XidConfig()
    memory = remember(XidMemory(), [xid_event(79, T0), xid_event(79, T0 + 1)], {}, cfg, T0)
    memory = remember(memory, [xid_event(79, T0 + 30)], {}, cfg, T0 + 30)
    (record,) = memory.records
    assert (record.incidents, record.events) == (1, 3)
    memory = remember(memory, [xid_event(79, T0 + 200)], {}, cfg, T0 + 200)
    assert memory.records[0].incidents == 2


def test_xid_finding_is_held_then_forgotten(base: NodeSnapshot) -> None:
    cfg = config_from_mapping({"xid": {"hold_seconds": 600}})
    memory = remember(XidMemory(), [xid_event(95, T0)], {}, cfg.xid, T0)
    found = run_checks(base, History(xids=memory), cfg, T0 + 500)
    assert ("xid", "gpu0") in {f.key for f in found}
    later = remember(memory, [], {}, cfg.xid, T0 + 601)
    assert later.records == ()


def app_hits(jobs: list[str], xid: int = 13) -> XidMemory:
    memory = XidMemory()
    for i, job in enumerate(jobs):
        ns, _, pod = job.partition("/")
        pods = {"GPU-a": PodRef(ns, pod, "main")} if job else {}
        at = T0 + i * 600  # far apart: separate incidents
        memory = remember(memory, [xid_event(xid, at)], pods, XidConfig(), at)
    return memory


def test_application_xid_alone_recommends_nothing(base: NodeSnapshot) -> None:
    found = run_checks(base, History(xids=app_hits(["t/job-a"])), HealthConfig(), T0 + 10)
    xid = next(f for f in found if f.check == "xid")
    assert (xid.severity, xid.action) == ("info", "none")
    assert not [f for f in found if f.check == "xid_app_repeat"]


def test_application_xid_under_different_jobs_on_one_gpu_escalates(base: NodeSnapshot) -> None:
    memory = app_hits(["t/job-a", "t/job-b"])
    found = run_checks(base, History(xids=memory), HealthConfig(), T0 + 1200)
    (repeat,) = [f for f in found if f.check == "xid_app_repeat"]
    assert (repeat.component, repeat.action) == ("gpu0", "reboot")
    assert "t/job-a" in repeat.evidence and "t/job-b" in repeat.evidence


@pytest.mark.parametrize("jobs", [["t/job-a", "t/job-a", "t/job-a"], ["", "", ""]])
def test_application_xid_under_one_job_or_no_known_job_does_not_escalate(
    base: NodeSnapshot, jobs: list[str]
) -> None:
    found = run_checks(base, History(xids=app_hits(jobs)), HealthConfig(), T0 + 1800)
    assert not [f for f in found if f.check == "xid_app_repeat"]


def test_application_xid_outside_the_window_does_not_count() -> None:
    cfg = XidConfig(app_repeat_window_seconds=300)
    memory = remember(XidMemory(), [xid_event(13, T0)], {"GPU-a": PodRef("t", "a", "c")}, cfg, T0)
    memory = remember(memory, [], {}, cfg, T0 + 301)
    assert memory.app_hits == ()


def test_pcie_generation_below_max_counts_only_while_busy(base: NodeSnapshot) -> None:
    idle = with_gpu(base, 2, pcie_link_gen_current=1, utilization_gpu_ratio=0.0)
    assert checks_of(idle) == set()
    busy = with_gpu(base, 2, pcie_link_gen_current=1, utilization_gpu_ratio=0.9)
    assert checks_of(busy) == {("pcie_degraded", "gpu2", "reboot")}
    narrow = with_gpu(base, 2, pcie_link_width_current=8, utilization_gpu_ratio=0.0)
    assert checks_of(narrow) == {("pcie_degraded", "gpu2", "reboot")}


def test_retired_pages_over_threshold_mean_replace(base: NodeSnapshot) -> None:
    full = with_gpu(base, 3, retired_pages=RetiredPages(50, 12, False))
    assert checks_of(full) == {("retired_pages", "gpu3", "replace")}
    pending = with_gpu(base, 3, retired_pages=RetiredPages(2, 1, True))
    assert checks_of(pending) == {("retired_pages_pending", "gpu3", "reboot")}
    assert checks_of(full, memory={"retired_pages_max": 100}) == set()


def test_nvlink_counter_reset_is_not_an_error_storm(base: NodeSnapshot) -> None:
    links = base.gpu.gpus[0].nvlinks
    high = with_gpu(
        base, 0, nvlinks=tuple(dataclasses.replace(lk, crc_flit_errors=10**6) for lk in links)
    )
    previous = dataclasses.replace(high, taken_at=base.taken_at - 5)
    assert checks_of(base, History(previous=previous)) == set()  # counters went down: reset
    rising = dataclasses.replace(high, taken_at=base.taken_at + 5)
    assert ("nvlink_errors", "gpu0:link0", "reboot") in checks_of(rising, History(previous=base))


def test_nvml_down_on_a_gpu_instance_but_not_on_a_cpu_node(base: NodeSnapshot) -> None:
    # NVML failed after it had worked, with a code the source classes as hardware: reboot.
    # Before issue 13 any unavailable NVML meant reboot; one that never worked since the agent
    # started, or a driver unloaded or upgraded under it (issue 28), is a deployment finding
    # (tests/health/test_nvml_classification.py).
    gone = NvmlFailure(pynvml.NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN", "hardware")
    down = dataclasses.replace(
        base, gpu=GpuInventory(available=False, error="unknown error", failure=gone)
    )
    assert ("nvml_down", "node", "reboot") in checks_of(down)
    cpu_node = dataclasses.replace(
        down, topology=NodeTopology({"node.kubernetes.io/instance-type": "m5.large"})
    )
    assert checks_of(cpu_node) == set()


def test_fewer_gpus_than_the_instance_type_has(base: NodeSnapshot) -> None:
    seven = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, gpus=base.gpu.gpus[:7]))
    assert ("gpu_missing", "node", "replace") in checks_of(seven)
    known = History(known_gpus=frozenset(range(8)))
    assert ("gpu_missing", "gpu7", "replace") in checks_of(seven, known)


def test_efa_counts_are_judged_only_when_sysfs_was_read(base: NodeSnapshot) -> None:
    fewer = dataclasses.replace(base, efa=base.efa[:30])
    assert ("efa_missing", "node", "reboot") in checks_of(fewer)
    failed = dataclasses.replace(
        fewer,
        collectors=tuple(CollectorStatus(c.name, c.name != "efa", 0.0) for c in base.collectors),
    )
    assert not [c for c in checks_of(failed) if c[0] == "efa_missing"]
    named = History(known_efa=frozenset(d.device for d in base.efa))
    gone = {c[1] for c in checks_of(fewer, named) if c[0] == "efa_missing"}
    assert gone == {base.efa[30].device, base.efa[31].device}


def test_instance_type_with_and_without_the_ml_prefix() -> None:
    cfg = HealthConfig()
    assert cfg.expected_shape("ml.p5.48xlarge") == cfg.expected_shape("p5.48xlarge")
    p5en, gb200 = cfg.expected_shape("ml.p5en.48xlarge"), cfg.expected_shape("p6e-gb200.36xlarge")
    assert p5en is not None and p5en.efa == 16
    assert gb200 is not None and gb200.gpus == 4
    assert cfg.expected_shape("m5.large") is None


def test_a_check_that_raises_is_contained(base: NodeSnapshot) -> None:
    def broken(*_: object) -> list[Finding]:
        raise KeyError("boom")

    def fine(
        snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
    ) -> list[Finding]:
        return [Finding("rootfs_read_only", "node", "critical", "reboot", "x", now, now)]

    run = run_check_families(
        base, History(), HealthConfig(), T0, [("broken", broken), ("fine", fine)]
    )
    assert [f.check for f in run.findings] == ["rootfs_read_only"]
    assert run.failed == (("broken", "KeyError: 'boom'"),)


def test_garbage_in_a_snapshot_never_escapes(base: NodeSnapshot) -> None:
    bad = with_gpu(base, 1, ecc="not counts", nvlinks=(None,), clock_event_reasons=7)
    bad = dataclasses.replace(bad, efa=("not a device",), affinity=(None,))  # type: ignore[arg-type]
    run = run_check_families(bad, History(previous=base), HealthConfig(), bad.taken_at)
    failed = {name for name, _ in run.failed}
    assert {"memory", "nvlink", "thermal", "efa", "numa"} <= failed
    assert [f for f in run.findings if f.action != "none"] == []  # nothing invented


# --- configuration --------------------------------------------------------------------------


def test_defaults_are_sane() -> None:
    cfg = HealthConfig()
    assert (cfg.damping.k, cfg.damping.n) == (3, 5)
    assert cfg.thermal.action == "none" and cfg.xid.app_repeat_jobs >= 2


def test_yaml_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(
        "damping: {k: 2, n: 4}\n"
        "damping_overrides: {thermal_slowdown: {k: 6, n: 10}}\n"
        "thermal: {action: reboot, sustain_seconds: 30}\n"
        "nvlink: {max_errors_per_second: {crc_flit: 50}}\n"
        "xid: {app_xids: [13, 31]}\n"
        "instance_types: {p9.mega: {gpus: 16, efa: 64}}\n"
    )
    cfg = load_config(path)
    assert (cfg.damping.k, cfg.damping_for("thermal_slowdown").k) == (2, 6)
    assert cfg.thermal.action == "reboot" and cfg.thermal.sustain_seconds == 30.0
    assert cfg.nvlink.max_errors_per_second["crc_flit"] == 50
    assert cfg.nvlink.max_errors_per_second["replay"] == 10  # untouched default
    assert cfg.xid.app_xids == frozenset({13, 31})
    assert cfg.expected_shape("ml.p9.mega") is not None
    assert cfg.expected_shape("p5.48xlarge") is not None  # defaults kept


def test_json_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    path.write_text(json.dumps({"memory": {"retired_pages_max": 10}}))
    assert load_config(path).memory.retired_pages_max == 10


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"dampening": {}}, "unknown key 'dampening'"),
        ({"thermal": {"sustain": 5}}, "unknown key 'thermal.sustain'"),
        ({"damping": {"k": 6, "n": 5}}, "k <= n"),
        ({"damping": {"k": "3"}}, "damping.k must be an integer"),
        ({"thermal": {"action": "explode"}}, "thermal.action"),
        ({"nvlink": {"max_errors_per_second": {"crc": 1}}}, "unknown counter"),
        ({"memory": {"retired_pages_max": -1}}, "must not be negative"),
        ({"instance_types": {"x": {"gpus": 8}}}, "needs both gpus and efa"),
        (["not", "a", "mapping"], "must be a mapping"),
    ],
)
def test_bad_config_is_a_clear_error(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("'", ".")):
        config_from_mapping(data)


def test_unreadable_or_invalid_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("damping: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


# --- the findings' JSON form ------------------------------------------------------------------


def test_findings_json_round_trips_worst_first() -> None:
    findings = [
        Finding("numa_misplaced", "gpu7", "warning", "none", "1 of 1", T0, T0 + 5),
        Finding("xid", "gpu3", "fatal", "replace", "XID 79", T0, T0 + 5, actionable=True),
        Finding("rootfs_read_only", "node", "critical", "reboot", "ro", T0, T0 + 5, True),
    ]
    text = findings_to_json(findings)
    back = findings_from_json(text)
    assert [f.check for f in back] == ["xid", "rootfs_read_only", "numa_misplaced"]
    assert back[0] == findings[1]
    assert json.loads(text)[0]["firstSeen"] == "2025-06-15T15:06:40Z"


def test_bad_findings_json_is_reported_not_raised_by_the_lenient_reader() -> None:
    good = Finding("xid", "gpu3", "fatal", "replace", "XID 79", T0, T0).to_dict()
    text = json.dumps([good, {"check": "x"}, {**good, "severity": "apocalyptic"}])
    found, problems = decode_findings(text)
    assert [f.check for f in found] == ["xid"]
    assert len(problems) == 2 and "finding [1]" in problems[0]
    assert decode_findings("{")[0] == [] and decode_findings(None) == ([], [])
    with pytest.raises(FindingsFormatError, match=r"finding \[1\]"):
        findings_from_json(text)
    with pytest.raises(FindingsFormatError, match="JSON list"):
        findings_from_json('{"check": "xid"}')
