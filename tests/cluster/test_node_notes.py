"""What a person sees of a sick node from the workload side (issue 31): `explain` of a workload
names the findings and the remediation on its nodes, and the topology picture wraps a long
unhealthy reason inside the node's box instead of clipping it at the edge."""

from __future__ import annotations

import re

from exporter.cluster.explain import explain_text
from exporter.cluster.model import ClusterModel
from exporter.cluster.ui import pages as ui
from exporter.cluster.ui.svg import CHAR_W, WIDTH, marker_lines, topology_svg
from exporter.cluster.views.workloads import workload_view
from exporter.sim import synthetic as s

T0 = 1_795_000_000.0
NS = "hyperpod-ns-alpha"
CQ = "hyperpod-ns-alpha-clusterqueue"
XID = "gpu3 xid (reboot): XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1"


def sick(name: str, health: str, message: str = XID) -> dict[str, object]:
    raw = s.node(name, ("nn-top", "nn-mid", "nn-a"), health=health)
    raw["status"]["conditions"].append(  # type: ignore[index]
        {"type": "TopowatchHealthy", "status": "False", "reason": "Xid", "message": message}
    )
    return raw


def model_with_job(health: str, pod_on_node: bool = True) -> ClusterModel:
    model = ClusterModel()
    model.apply("Node", "ADDED", sick("n1", health), T0)
    model.apply("Node", "ADDED", s.node("n2", ("nn-top", "nn-mid", "nn-a")), T0)
    wl = s.workload(
        NS,
        "train",
        2,
        8,
        T0,
        conditions=s.admitted_conditions(CQ, T0 + 5),
        cluster_queue=CQ,
        assignment=[(("n1",), 1), (("n2",), 1)],
    )
    model.apply("Workload", "ADDED", wl, T0 + 5)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    if pod_on_node:
        model.apply("Pod", "ADDED", s.pod(NS, "train-0", "n1", 8, job_uid, "train"), T0 + 6)
    model.apply("Pod", "ADDED", s.pod(NS, "train-1", "n2", 8, job_uid, "train"), T0 + 6)
    return model


def explained(model: ClusterModel) -> str:
    state = model.workload_state(NS, "train")
    assert state is not None
    return explain_text(workload_view(model, state))


def test_explain_names_the_finding_and_the_reboot_asked_for_on_its_node() -> None:
    text = explained(model_with_job("UnschedulablePendingReboot"))
    assert (
        f"Its node n1 (pod train-0): the node agent reports {XID}; "
        "remediation: reboot requested (HyperPod UnschedulablePendingReboot)"
    ) in text
    assert "Its node n2" not in text  # the healthy node says nothing


def test_explain_names_a_node_its_assignment_holds_after_its_pod_is_gone() -> None:
    text = explained(model_with_job("UnschedulablePendingReplacement", pod_on_node=False))
    assert "Its node n1 (its assignment; no pod of it runs there now)" in text
    assert "remediation: replacement requested" in text


def test_a_finished_workload_names_no_node_of_its_old_assignment() -> None:
    model = model_with_job("UnschedulablePendingReboot", pod_on_node=False)
    state = model.workload_state(NS, "train")
    assert state is not None
    done = s.workload(
        NS,
        "train",
        2,
        8,
        T0,
        conditions=[
            *s.admitted_conditions(CQ, T0 + 5),
            s.condition("Finished", "True", "JobFinished", "done", T0 + 60),
        ],
        cluster_queue=CQ,
        assignment=[(("n1",), 1), (("n2",), 1)],
        rv="2",
    )
    model.apply("Workload", "MODIFIED", done, T0 + 60)
    assert "Its node n1" not in explained(model)


def test_a_healthy_workload_has_no_node_lines() -> None:
    model = ClusterModel()
    model.apply("Node", "ADDED", s.node("n1", ("nn-top", "nn-mid", "nn-a")), T0)
    wl = s.workload(
        NS, "train", 1, 8, T0, conditions=s.admitted_conditions(CQ, T0 + 5), cluster_queue=CQ
    )
    model.apply("Workload", "ADDED", wl, T0 + 5)
    state = model.workload_state(NS, "train")
    assert state is not None
    view = workload_view(model, state)
    assert view["node_health"] == []
    assert "Its node" not in explain_text(view)


def test_a_long_unhealthy_reason_wraps_inside_the_node_box() -> None:
    findings = "; ".join(
        f"gpu{i} xid (reboot): XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF" for i in range(6)
    )
    model = ClusterModel()
    model.apply("Node", "ADDED", sick("n1", "UnschedulablePendingReboot", findings), T0)
    model.apply("Node", "ADDED", s.node("n2", ("nn-top", "nn-mid", "nn-a")), T0)
    picture = ui.topology_picture(model)
    reason = picture.nodes["n1"].unhealthy
    assert len(reason) > 200
    svg = topology_svg(picture)
    marker = re.search(r'<text class="unhealthy-marker" x="(\d+)"[^>]*>(.*?)</text>', svg)
    assert marker is not None
    x = int(marker.group(1))
    body = re.sub(r"<title>.*?</title>", "", marker.group(2))
    lines = re.split(r"<tspan[^>]*>", body)
    lines = [re.sub(r"<[^>]+>", "", line) for line in lines]
    assert len(lines) > 1
    # every line fits: it ends before the node box's right edge (at the widest character)
    box = re.search(
        r'<g class="node unhealthy" id="node-n1".*?<rect x="(\d+)"[^>]*width="(\d+)"', svg
    )
    assert box is not None
    right = int(box.group(1)) + int(box.group(2))
    assert all(x + len(line) * CHAR_W <= right for line in lines), lines
    # nothing is lost: the lines hold the whole reason, and the full text is the tooltip
    assert " ".join(lines).replace("&#x27;", "'") == f"⚠ UNHEALTHY: {reason}"
    assert f"<title>{reason}</title>" in svg
    # the row grows with its lines, and the next node is drawn below it
    heights = re.findall(r'<rect x="\d+" y="(\d+)" width="\d+" height="(\d+)" fill="#fee2e2"', svg)
    ((top, height),) = heights
    n2 = re.search(r'id="node-n2".*?<text class="node-name" x="\d+" y="(\d+)"', svg)
    assert n2 is not None and int(n2.group(1)) > int(top) + int(height)
    assert int(height) >= 24 + (len(lines) - 1) * 14 - 2


def test_marker_lines_break_between_words_and_inside_a_word_too_long_for_a_line() -> None:
    assert marker_lines("short", 500) == ["short"]
    words = marker_lines("a " * 100, 24 * CHAR_W)
    assert all(len(line) <= 24 for line in words)
    long = marker_lines("x" * 100, 24 * CHAR_W)
    assert "".join(long) == "x" * 100 and all(len(line) <= 24 for line in long)
    assert WIDTH > 0
