"""Issue 28, the remediation controller's part: signals that arrive late or stay behind must not
act twice, and the ladder follows the physical GPU.

Rules the rows rest on:
- Alertmanager notifies at least once, per peer, in no particular order: in HA mode each peer
  sends its own notifications and deduplicates only through the gossiped notification log
  (Alertmanager README, "High Availability": "Alertmanager ... provides at-least-once
  delivery"), so a peer's *firing* for an episode can arrive after another's *resolved*. An
  alert's `startsAt` is fixed for one firing episode and its `fingerprint` names the alert
  (webhook payload, Alertmanager docs "webhook_config"); a new episode has a later startsAt.
- A reboot ends what the node was before it: Kubernetes reports a new `status.nodeInfo.bootID`
  per boot (NodeSystemInfo: "Boot ID reported by the node"); Slurm's `BootTime` (scontrol show
  node; sinfo --json `boot_time`) is when slurmd's host last booted. A finding first seen before
  the boot that followed the action is the failure that action treated, not the fault returning.
- NVML's index is an enumeration order, not an identity: "The order in which NVML enumerates
  devices has no guarantees of consistency between reboots. For that reason it is recommended
  that devices be looked up by their PCI ids or UUID" (nvml.h, nvmlDeviceGetHandleByIndex). A
  GPU lost and absent after a reboot shifts every GPU after it down one index.

Most rows drive `run_once()` on a fake clock with the recording provider and writer of
tests/remediation/test_remediation_controller.py; the restart rows go through the simulated API
server and the official client, so the second controller knows only what the first wrote on the
Node; the agent rows run the real node agent's checks on the simulated p5.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import kubernetes
import pytest

from exporter.cluster.run import kube_api_client
from exporter.core.findings import Finding, findings_from_json, format_time
from exporter.node.poller import Poller
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.slurm.poller import AgentReading
from exporter.slurm.reports import Facts, node_object, report
from exporter.sources.slurm.nodes import SlurmNode
from healthcheck.detection.monitor import HealthMonitor
from healthcheck.remediation.alerts import (
    ALERTS_ANNOTATION,
    MAX_RESOLVED,
    parse_alertmanager,
    parse_resolves,
)
from healthcheck.remediation.controller import (
    AGENT_GRACE_S,
    KubeNodeWriter,
    RemediationController,
)
from healthcheck.remediation.policy import PolicyConfig
from healthcheck.remediation.providers.hyperpod import HyperPodLabeler
from healthcheck.remediation.state import ANNOTATION as STATE
from healthcheck.remediation.state import (
    LadderMark,
    RemediationState,
    dump_state,
    parse_state,
    state_document,
)
from tests.conftest import SimHarness
from tests.remediation.test_remediation_controller import (
    ACT,
    T0,
    Clock,
    DictWriter,
    Recorder,
    make,
    node,
    trail,
)

H = 3600.0
MERGE_PATCH = "application/merge-patch+json"
U = [f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]  # physical GPUs 0..7
PCI = [f"00000000:{0x53 + i:02X}:00.0" for i in range(8)]


class Writer(DictWriter):
    """DictWriter that also keeps the remembered alert resolves."""

    def __init__(self) -> None:
        super().__init__()
        self.alerts: dict[str, str] = {}

    def write_alerts(self, node: str, resolves: Any) -> None:
        from healthcheck.remediation.alerts import dump_resolves

        self.alerts[node] = dump_resolves(resolves)


def setup(
    config: PolicyConfig = ACT,
) -> tuple[RemediationController, Recorder, Writer, Clock]:
    controller, provider, writer, clock = make(config, writer=Writer())
    assert isinstance(writer, Writer)
    return controller, provider, writer, clock


def booted(obj: dict[str, Any], boot_id: str) -> dict[str, Any]:
    obj.setdefault("status", {})["nodeInfo"] = {"bootID": boot_id}
    return obj


def gpu_xid79(physical: int | None, index: int, seen: float) -> dict[str, Any]:
    """XID 79 on GPU `index` as the node agent writes it; `physical` None: an older agent
    (no ids)."""
    out: dict[str, Any] = {
        "check": "xid",
        "component": f"gpu{index}",
        "severity": "fatal",
        "action": "reboot",
        "evidence": "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
        "firstSeen": format_time(seen),
        "lastSeen": format_time(seen),
        "actionable": True,
    }
    if physical is not None:
        out |= {"uuid": U[physical], "pciBusId": PCI[physical]}
    return out


def missing_gpu(
    seen: float, component: str = "node", physical: int | None = None
) -> dict[str, Any]:
    """A GPU NVML no longer enumerates; after a reboot the agent knows only the count."""
    out = {
        **gpu_xid79(physical, 0, seen),
        "check": "gpu_missing",
        "component": component,
        "severity": "critical",
        "action": "replace",
        "evidence": "NVML enumerates 7 GPUs, p5.48xlarge has 8",
    }
    return out


def run(controller: RemediationController, *objs: dict[str, Any], at: float) -> list[str]:
    for obj in objs:
        controller.observe_node(obj, at)
    return [f"{d.node}:{d.reason}:{d.action}" for d in controller.run_once()]


def alerts(*items: dict[str, Any]) -> Any:
    return parse_alertmanager(json.dumps({"version": "4", "alerts": list(items)}).encode())


def alert(status: str, starts: float | None, node_name: str = "n1", **extra: Any) -> dict[str, Any]:
    labels = {"alertname": "GpuFellOff", "node": node_name, "action": "reboot"}
    out: dict[str, Any] = {"status": status, "labels": labels, "fingerprint": "fp-1", **extra}
    if starts is not None:
        out["startsAt"] = format_time(starts)
    if status == "resolved":
        out["endsAt"] = format_time((starts or T0) + 300)
    return out


def audit(controller: RemediationController, reason: str) -> list[dict[str, Any]]:
    return [r for r in controller.auditor.recent(10_000) if r["reason"] == reason]


# --- 1. a late firing after the resolve ------------------------------------------------------


def test_a_replayed_firing_after_the_resolve_does_not_reboot_again() -> None:
    """firing → reboot; resolved → withdrawn; the other peer's older firing (same startsAt)
    → ignored and audited, even once cooldown and the in-progress window are long over."""
    controller, provider, writer, clock = setup()
    run(controller, node("n1"), at=clock.now)
    episode = T0 - 120
    controller.handle_alerts(alerts(alert("firing", episode)), clock.now)
    assert run(controller, at=clock.now) == ["n1:act:reboot"]
    clock.now += 300
    controller.handle_alerts(alerts(alert("resolved", episode)), clock.now)
    run(controller, at=clock.now)
    assert ("n1", "cancelled", "alert_resolved") in trail(controller)
    clock.now += 4 * H  # past the cooldown (600 s) and the in-progress window (3 h)
    run(controller, node("n1"), at=clock.now)
    controller.handle_alerts(alerts(alert("firing", episode)), clock.now)  # the late peer
    assert run(controller, at=clock.now) == []
    assert provider.calls == [("n1", "reboot")]  # before issue 28: a second reboot here
    [replay] = audit(controller, "alert_replayed")
    assert replay["verdict"] == "ignored" and "not newer than its resolve" in replay["detail"]
    assert controller.status()["nodes"][0]["requested"] is None
    # remembered on the Node (act mode), bounded
    [(_, text)] = writer.alerts.items()
    resolves, problem = parse_resolves(text)
    assert problem is None and [(r.fingerprint, r.starts_at) for r in resolves] == [
        ("fp-1", episode)
    ]


def test_a_new_episode_of_the_same_alert_acts_as_usual() -> None:
    controller, provider, _, clock = setup()
    run(controller, node("n1"), at=clock.now)
    controller.handle_alerts(alerts(alert("firing", T0 - 120)), clock.now)
    run(controller, at=clock.now)
    controller.handle_alerts(alerts(alert("resolved", T0 - 120)), clock.now + 60)
    clock.now += 2 * H
    run(controller, node("n1"), at=clock.now)
    controller.handle_alerts(alerts(alert("firing", clock.now - 30)), clock.now)  # later startsAt
    assert run(controller, at=clock.now) == ["n1:act:reboot"]
    assert provider.calls == [("n1", "reboot"), ("n1", "reboot")]
    assert audit(controller, "alert_replayed") == []


def test_a_late_resolve_of_an_older_episode_does_not_cancel_the_firing_held() -> None:
    controller, _, _, clock = setup(PolicyConfig())
    run(controller, node("n1"), at=clock.now)
    controller.handle_alerts(alerts(alert("firing", T0 - 60)), clock.now)  # episode 2
    run(controller, at=clock.now)
    controller.handle_alerts(alerts(alert("resolved", T0 - 3 * H)), clock.now)  # episode 1's
    run(controller, at=clock.now)
    [late] = audit(controller, "alert_stale_resolve")
    assert late["verdict"] == "ignored" and "that firing stands" in late["detail"]
    assert controller.status()["nodes"][0]["requested"] == "reboot"


def test_a_firing_without_starts_at_cannot_be_told_apart_and_counts() -> None:
    """Alertmanager always sends startsAt; another sender may not. Without it a replay cannot
    be recognised, and the alert counts as before issue 28."""
    controller, _, _, clock = setup(PolicyConfig())
    run(controller, node("n1"), at=clock.now)
    controller.handle_alerts(alerts(alert("resolved", None)), clock.now)
    controller.handle_alerts(alerts(alert("firing", None)), clock.now + 1)
    assert run(controller, at=clock.now) == ["n1:observe:reboot"]


def test_the_memory_is_bounded_and_observe_mode_writes_nothing() -> None:
    controller, _, writer, clock = setup(PolicyConfig())
    run(controller, node("n1"), at=clock.now)
    for i in range(MAX_RESOLVED + 8):
        resolved = alert("resolved", T0 - i, fingerprint=f"fp-{i}")
        controller.handle_alerts(alerts(resolved), clock.now)
    run(controller, at=clock.now)
    assert writer.alerts == {}  # observe mode writes nothing to Nodes
    view = controller._views["n1"]
    assert len(view.resolved) == MAX_RESOLVED


@pytest.fixture
def api() -> Iterator[tuple[ObjectStore, Any]]:
    store = ObjectStore()
    with FakeApiServer(store) as server:
        yield store, kubernetes.client.CoreV1Api(kube_api_client(server.url))


def test_a_restarted_controller_still_knows_the_resolve(api: tuple[ObjectStore, Any]) -> None:
    """The resolve is written to the Node (`topowatch.io/remediation-alerts`): a controller
    that restarted (or the standby that took over, which reads the same Node) ignores the
    replay."""
    store, core = api
    store.upsert("nodes", node("n1"))
    clock = Clock()

    def controller() -> RemediationController:
        return RemediationController(
            ACT, [HyperPodLabeler(core)], KubeNodeWriter(core), clock=clock
        )

    def observe(c: RemediationController) -> list[str]:
        return run(c, store.get("nodes", "", "n1") or {}, at=clock.now)

    first = controller()
    observe(first)
    first.handle_alerts(alerts(alert("firing", T0 - 60)), clock.now)
    assert observe(first) == ["n1:act:reboot"]
    clock.now += 300
    first.handle_alerts(alerts(alert("resolved", T0 - 60)), clock.now)
    first.run_once()
    stored = store.get("nodes", "", "n1")
    assert stored is not None and ALERTS_ANNOTATION in stored["metadata"]["annotations"]

    clock.now += 4 * H
    second = controller()  # empty memory: all it knows is on the Node
    observe(second)
    second.handle_alerts(alerts(alert("firing", T0 - 60)), clock.now)
    assert second.run_once() == []
    assert [r["reason"] for r in second.auditor.recent(100) if r["audit"] == "alert"] == [
        "alert_replayed"
    ]
    stored = store.get("nodes", "", "n1")
    assert stored is not None
    state, _ = parse_state(stored["metadata"]["annotations"][STATE])
    assert state is not None and state.attempts == 1  # one reboot, ever


# --- 2. findings from before a reboot ------------------------------------------------------


def test_findings_from_before_the_reboot_are_stale_when_the_agent_does_not_come_back() -> None:
    """XID 79 → reboot. The node boots (new bootID) but its agent never writes again: the old
    finding stays on the Node. After the 3 h in-progress window it used to count as the GPU
    falling off again (replace); now it is stale, asks for nothing, and the agent's silence is
    audited once as its own outcome."""
    controller, provider, writer, clock = setup()
    sick = [gpu_xid79(2, 2, T0 - 60)]
    assert run(controller, booted(node("n1", sick), "boot-a"), at=clock.now) == ["n1:act:reboot"]
    assert writer.states["n1"].boot_id == "boot-a"
    clock.now += 600
    assert run(controller, booted(node("n1", sick), "boot-b"), at=clock.now) == []
    clock.now += AGENT_GRACE_S
    run(controller, booted(node("n1", sick), "boot-b"), at=clock.now)
    clock.now += 4 * H
    assert run(controller, booted(node("n1", sick), "boot-b"), at=clock.now) == []
    assert provider.calls == [("n1", "reboot")]  # before issue 28: then a replace
    [silent] = audit(controller, "agent_silent_after_boot")
    assert "agent has not reported since" in silent["detail"] and "stale" in silent["detail"]
    [rung] = controller.status()["nodes"][0]["ladder"]
    assert "stale, not a recurrence" in rung["hold"]
    assert writer.states["n1"].outcome == "done"  # not recovered: nobody said it is healthy


def test_the_fault_returning_after_the_boot_still_climbs() -> None:
    controller, provider, _, clock = setup()
    run(controller, booted(node("n1", [gpu_xid79(2, 2, T0 - 60)]), "boot-a"), at=clock.now)
    clock.now += 1800  # the agent is back and gpu2 falls off again, after the boot
    again = [gpu_xid79(2, 2, clock.now - 30)]
    assert run(controller, booted(node("n1", again), "boot-b"), at=clock.now) == ["n1:act:replace"]
    assert provider.calls == [("n1", "reboot"), ("n1", "replace")]
    assert audit(controller, "agent_silent_after_boot") == []


def test_the_boot_id_outlives_a_controller_restart() -> None:
    """The boot ID is in the state annotation: a new controller reading the Node alone still
    tells the stale finding from a recurrence."""
    state = RemediationState(
        "reboot",
        T0 - 4 * H,
        "hyperpod",
        1,
        "done",
        ladder=(LadderMark("xid-79", "gpu2", 0, "reboot", "reboot", T0 - 4 * H, U[2]),),
        boot_id="boot-a",
    )
    assert parse_state(dump_state(state)) == (state, None)
    stale = [gpu_xid79(2, 2, T0 - 4 * H - 60)]
    obj = booted(node("n1", stale, annotations={STATE: dump_state(state)}), "boot-b")
    controller, provider, _, clock = setup()
    assert run(controller, obj, at=clock.now) == []
    assert provider.calls == []
    obj = booted(node("n1", stale, annotations={STATE: dump_state(state)}), "boot-a")
    assert run(make()[0], obj, at=clock.now) == ["n1:act:replace"]  # no boot since: climbs


def slurm_node(boot_time: float | None) -> SlurmNode:
    return SlurmNode(
        "gpu-1", "10.0.0.1", "gpu-1", "idle", frozenset(), "", "", None, ("all",),
        frozenset(), 8, 96, boot_time,
    )  # fmt: skip


def test_on_slurm_the_nodes_boot_time_tells_them_apart() -> None:
    """Slurm reports when the host booted (slurmd's BootTime): an agent that answers with
    findings it carried over the reboot (first seen before that boot) asks for nothing."""
    controller, provider, _, clock = setup()
    xid = Finding.from_dict(gpu_xid79(2, 2, T0 - 60))

    def feed(boot_time: float, findings: tuple[Finding, ...]) -> list[str]:
        node_ = slurm_node(boot_time)
        reading = AgentReading("gpu-1", "ok", clock.now, findings)
        state = controller._states.get("gpu-1")
        seen = report(node_, reading, (), state, Facts())
        controller.observe_report(seen, node_object(node_), clock.now)
        return [f"{d.node}:{d.reason}:{d.action}" for d in controller.run_once()]

    assert feed(T0 - 30 * 86400, (xid,)) == ["gpu-1:act:reboot"]
    clock.now += 4 * H
    assert feed(T0 + 300, (xid,)) == []  # booted after the action; the finding is older
    assert provider.calls == [("gpu-1", "reboot")]
    again = replace(xid, first_seen=clock.now - 20, last_seen=clock.now)
    assert feed(T0 + 300, (again,)) == ["gpu-1:act:replace"]


# --- 3. the ladder follows the physical GPU --------------------------------------------------


@pytest.mark.parametrize(
    ("after", "expected", "why"),
    [
        # gpu2 (U2) fell off; after the reboot it is gone and U3 is enumerated as gpu2. U3
        # falling off at index 2 is a first failure of another GPU: a reboot, not a replace.
        ([gpu_xid79(3, 2, T0 + 1800)], "reboot", "first step"),
        # The node is a GPU short after the reboot for U2 (NVML no longer knows which): that
        # GPU did not come back, the next step, not a second reboot.
        ([missing_gpu(T0 + 1800)], "replace", "did not come back"),
        # U2 back at another index (a PCIe re-enumeration) and falling off again: still U2.
        ([gpu_xid79(2, 5, T0 + 1800)], "replace", "again"),
        # An older agent sends no ids: the index is all there is, and the step says so.
        ([gpu_xid79(None, 2, T0 + 1800)], "reboot", "first step"),
    ],
)
def test_renumbered_gpus(after: list[dict[str, Any]], expected: str, why: str) -> None:
    controller, provider, writer, clock = setup()
    run(controller, booted(node("n1", [gpu_xid79(2, 2, T0 - 60)]), "a"), at=clock.now)
    [mark] = writer.states["n1"].ladder
    assert (mark.component, mark.device) == ("gpu2", U[2])
    clock.now += 1800
    run(controller, booted(node("n1", []), "b"), at=clock.now)  # healthy after the reboot
    clock.now += 60
    assert run(controller, booted(node("n1", after), "b"), at=clock.now) == [f"n1:act:{expected}"]
    assert provider.calls == [("n1", "reboot"), ("n1", expected)]
    act = [r for r in controller.auditor.recent(100) if r["verdict"] == "act"][-1]
    assert any(why in step for step in act["ladder"]), act["ladder"]


def test_a_finding_from_an_older_agent_says_it_is_followed_by_index() -> None:
    controller, _, _, clock = setup(PolicyConfig())
    run(controller, node("n1", [gpu_xid79(None, 2, T0 - 60)]), at=clock.now)
    [rung] = controller.status()["nodes"][0]["ladder"]
    assert rung["device"] is None
    [decision] = [r for r in controller.auditor.recent(10) if r["reason"] == "observe"]
    assert "by GPU index: the agent sent no GPU UUID" in decision["ladder"][0]


def test_marks_and_findings_stay_readable_by_older_readers() -> None:
    """The state annotation of a mark without a device (or a state without a boot ID) is
    exactly what it was; a findings entry without ids decodes with empty ids."""
    mark = LadderMark("xid-79", "gpu3", 0, "reboot", "reboot", T0)
    old = RemediationState("reboot", T0, "hyperpod", 1, "done", ladder=(mark,))
    document = state_document(old)
    assert "boot_id" not in document and "device" not in document["ladder"][0]
    [f] = findings_from_json(json.dumps([gpu_xid79(None, 3, T0)]))
    assert (f.uuid, f.pci_bus_id) == ("", "")
    [g] = findings_from_json(json.dumps([gpu_xid79(3, 3, T0)]))
    assert (g.uuid, g.pci_bus_id) == (U[3], PCI[3]) and g.to_dict()["uuid"] == U[3]


def test_the_node_agent_names_the_physical_gpu_in_its_findings(
    sim: Callable[..., SimHarness],
) -> None:
    """On the simulated p5, the real checks: XID 79 on gpu2 and a link down on gpu0 carry their
    GPUs' UUID and PCI bus id as NVML gives them; a node-wide finding carries none."""
    h = sim("p5.48xlarge", "xid=79@gpu2", "nvlink-down@gpu0:link3", "rootfs-ro")
    monitor = HealthMonitor()
    poller = Poller("sim-node-1", h.sources, clock=lambda: h.now, health=monitor)
    for _ in range(4):
        h.now += 5
        poller.poll()
    assert monitor.last is not None
    by_key = {f.key: f for f in monitor.last.findings}
    nvml = h.node.nvml
    xid = by_key[("xid", "gpu2")]
    assert xid.uuid == nvml.uuid_of(2) and xid.pci_bus_id.endswith(":00.0")
    link = by_key[("nvlink_down", "gpu0:link3")]
    assert link.uuid == nvml.uuid_of(0)
    assert by_key[("rootfs_read_only", "node")].uuid == ""
    # and what it annotates, the controller follows by that UUID
    written = json.loads(json.dumps([f.to_dict() for f in monitor.last.actionable]))
    controller, _, writer, clock = setup()
    assert "n1:act:reboot" in run(controller, node("n1", written), at=clock.now)
    assert {m.device for m in writer.states["n1"].ladder} == {nvml.uuid_of(2)}
    rungs = {r["component"]: r for r in controller.status()["nodes"][0]["ladder"]}
    assert rungs["gpu2"]["device"] == nvml.uuid_of(2)
    assert rungs["gpu0:link3"]["device"] == f"{nvml.uuid_of(0)}:link3"
