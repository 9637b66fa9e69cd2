"""The pages people look at: /ui/topology, /ui/workloads/{ns}/{name}, /ui/preemptions, and
`topowatch topology live`.

Renderers are checked on their own (escaping, stable team colours, unhealthy marking, the
fragmentation figures); then a real headless Chromium loads the pages from a running cluster
service over a scripted simulated cluster and the rendered DOM must show nodes, workloads and
the unhealthy markers.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.cli import main
from exporter.cli.topology import live_mermaid
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import Node, Pod
from exporter.cluster.parse.core import parse_node
from exporter.cluster.ui import pages as ui
from exporter.cluster.ui.svg import slot_colour, team_hue
from exporter.cluster.views.workloads import topology_view, workload_view
from exporter.sim import synthetic as s
from exporter.sim.cluster import SimulatedCluster
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.cluster.test_cluster_service import RunningService, eventually, scripted

T0 = 1_795_000_000.0
NS_A, NS_B = "hyperpod-ns-alpha", "hyperpod-ns-beta"
CQ_A = "hyperpod-ns-alpha-clusterqueue"
CHROMIUM = "/usr/bin/chromium"


def pod(ns: str, name: str, node: str, gpus: int, workload: str = "") -> Pod:
    return Pod(ns, name, f"uid-{name}", node, "Running", gpus, workload, "", "", "Job/j", "j")


def two_domains(health: dict[str, str] | None = None) -> ClusterModel:
    """nn-a holds n1, n2 and nn-b holds n3, n4 (8 GPUs each) under one layer-2 domain."""
    model = ClusterModel()
    for name, l3 in (("n1", "nn-a"), ("n2", "nn-a"), ("n3", "nn-b"), ("n4", "nn-b")):
        label = (health or {}).get(name, "Schedulable")
        model.apply("Node", "ADDED", s.node(name, ("nn-top", "nn-mid", l3), health=label), T0)
    return model


def place(model: ClusterModel, ns: str, name: str, node: str, gpus: int) -> None:
    obj = s.pod(ns, name, node, gpus, f"job-{name}", name, workload=f"wl-{name.split('-')[0]}")
    model.apply("Pod", "ADDED", obj, T0)


def svg_of(page: str) -> str:
    match = re.search(r"<svg.*</svg>", page, re.S)
    assert match, "no SVG on the page"
    return match.group(0)


# --- renderers --------------------------------------------------------------------------------


def test_names_from_the_cluster_are_escaped_everywhere() -> None:
    evil = '"><script>alert(1)</script>'
    tile = ui.NodeTile(
        name=f"n{evil}",
        allocatable=2,
        free=1,
        schedulable=False,
        unhealthy=f"TopowatchHealthy=False ({evil})",
        slots=(ui.GpuSlot(f"ns{evil}", f"pod{evil}", f"wl{evil}"), None),
    )
    picture = ui.TopologyPicture(
        tree=[{"level": "node", "domain": tile.name, "free": 1, "allocatable": 2, "children": []}],
        fragmentation=[
            {
                "level": "node",
                "domains": 1,
                "free": 1,
                "largest_free": 1,
                "largest_domain": tile.name,
                "fragmentation_ratio": 0.0,
            }
        ],
        nodes={tile.name: tile},
    )
    record = {"victim": f"ns/{evil}", "preemptor": f"uid:{evil}", "verdict_detail": evil}
    pages = [
        ui.topology_page(picture, highlight=f"ns{evil}/wl{evil}"),
        ui.preemptions_page([record]),
        ui.not_found_page(f"workload {evil}"),
    ]
    for page in pages:
        assert "<script>" not in page
        assert "&lt;script&gt;" in page
    # links keep the name, percent-encoded, so the workload page still finds it
    assert "/ui/workloads/ns%22%3E%3Cscript%3E" in pages[0]


def test_team_colours_are_stable_and_workloads_of_a_team_share_the_hue() -> None:
    a1 = ui.GpuSlot(NS_A, "p1", "train")
    a2 = ui.GpuSlot(NS_A, "p2", "finetune")
    b1 = ui.GpuSlot(NS_B, "p3", "train")
    hue = re.compile(r"hsl\((\d+),")

    def hue_of(slot: ui.GpuSlot) -> str:
        match = hue.match(slot_colour(slot))
        assert match
        return match.group(1)

    assert hue_of(a1) == hue_of(a2) != hue_of(b1)
    assert slot_colour(a1) == slot_colour(ui.GpuSlot(NS_A, "other-pod", "train"))
    # a checksum, not hash(): the same value in every process, so colours survive restarts
    assert team_hue("alpha") == 130 and team_hue("beta") == 211


def test_gpu_slots_follow_pod_name_order_per_node() -> None:
    pods = [
        pod(NS_A, "job-b", "n1", 2, "wl-b"),
        pod(NS_A, "job-a", "n1", 4, "wl-a"),
        pod(NS_A, "done", "", 8),  # not bound: holds nothing
    ]
    slots = ui.gpu_slots(pods)
    assert [sl.workload for sl in slots["n1"]] == ["wl-a"] * 4 + ["wl-b"] * 2
    # the model's own pod -> workload match wins over the annotation
    owned = ui.gpu_slots(pods, {(NS_A, "job-b"): "real-owner"})
    assert owned["n1"][4].workload == "real-owner"


def test_unhealthy_nodes_are_marked_for_either_signal() -> None:
    model = two_domains(health={"n3": "UnschedulablePendingReplacement"})
    raw = s.node("n2", ("nn-top", "nn-mid", "nn-a"))
    raw["status"]["conditions"].append(
        {"type": "TopowatchHealthy", "status": "False", "reason": "XidFatal", "message": "xid 79"}
    )
    raw["metadata"]["resourceVersion"] = "2"
    assert parse_node(raw).condition_note == "TopowatchHealthy=False (XidFatal: xid 79)"
    model.apply("Node", "MODIFIED", raw, T0)
    page = ui.topology_page(ui.topology_picture(model))
    svg = svg_of(page)
    marked = set(re.findall(r'<g class="node unhealthy[^"]*" id="node-([^"]+)"', svg))
    assert marked == {"n2", "n3"}
    assert "UNHEALTHY: HyperPod UnschedulablePendingReplacement" in svg
    assert "UNHEALTHY: TopowatchHealthy=False (XidFatal: xid 79)" in svg
    assert "4 nodes, 2 unhealthy" in page
    # malformed or healthy nodes carry no note and never raise
    malformed: list[dict[str, Any]] = [
        {},
        {"status": []},
        {"status": {"conditions": [None, "x"]}},
        s.node("n1", ()),
    ]
    for bad in malformed:
        assert parse_node(bad).condition_note == ""
    assert ui.unhealthy_reason(Node("n", (), 8, True, "Schedulable")) == ""


def test_fragmentation_shows_free_gpus_per_domain_and_largest_block_per_level() -> None:
    model = two_domains()
    place(model, NS_A, "big-0", "n1", 8)
    place(model, NS_B, "small-0", "n2", 4)
    page = ui.topology_page(ui.topology_picture(model))
    row = re.search(r'<tr data-level="network-node-layer-3">(.*?)</tr>', page)
    assert row, "no layer-3 row"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    # 2 domains, 20 free (4 in nn-a + 16 in nn-b), the largest block is nn-b's 16: 20% scattered
    assert cells == ["network-node-layer-3", "2", "20", "16", "nn-b", "20%"]
    svg = svg_of(page)
    assert 'data-domain="nn-a" data-free="4"' in svg
    assert 'data-domain="nn-b" data-free="16"' in svg
    assert "network-node-layer-3 nn-a · 4 free of 16 GPUs (2 nodes)" in svg
    # every GPU is drawn: 12 used, 20 free, each used one links to its workload page
    assert svg.count('class="gpu used') == 12 and svg.count('class="gpu free"') == 20
    assert svg.count('href="/ui/workloads/hyperpod-ns-beta/wl-small"') == 4


def test_highlight_outlines_one_workloads_gpus_and_nodes() -> None:
    model = two_domains()
    place(model, NS_A, "big-0", "n1", 8)
    place(model, NS_A, "big-1", "n3", 8)
    place(model, NS_B, "small-0", "n2", 4)
    page = ui.topology_page(ui.topology_picture(model), highlight=f"{NS_A}/wl-big")
    svg = svg_of(page)
    assert svg.count('class="gpu used highlight"') == 16
    assert set(re.findall(r'class="node hosts-highlight" id="node-([^"]+)"', svg)) == {"n1", "n3"}
    assert "on 2 node(s): n1, n3" in page


def test_workload_page_has_the_explain_answer_timeline_and_links() -> None:
    model = two_domains()
    wl = s.workload(
        NS_A,
        "train",
        1,
        8,
        T0,
        conditions=s.admitted_conditions(CQ_A, T0 + 5),
        cluster_queue=CQ_A,
        assignment=[(("n4",), 1)],
    )
    model.apply("Workload", "ADDED", wl, T0 + 5)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    model.apply("Pod", "ADDED", s.pod(NS_A, "train-0", "n4", 8, job_uid, "train"), T0 + 6)
    state = model.workload_state(NS_A, "train")
    assert state is not None
    page = ui.workload_page(workload_view(model, state))
    assert f"{NS_A}/train: admitted, 8 GPUs" in page  # explain's headline
    steps = re.findall(r"<tr><td>[^<]*</td><td>([a-z_]+)</td>", page)
    assert steps[:1] == ["created"] and "admitted" in steps
    topo = f"/ui/topology?workload={NS_A}%2Ftrain"
    assert f'href="{topo}"' in page and f'href="{topo}#node-n4">n4</a>' in page
    assert 'href="/ui/preemptions"' in page
    # the page's link resolves: the topology page highlights that workload on n4
    svg = svg_of(ui.topology_page(ui.topology_picture(model), highlight=f"{NS_A}/train"))
    assert 'class="node hosts-highlight" id="node-n4"' in svg


def test_preemptions_page_links_known_workloads_only() -> None:
    record: dict[str, Any] = {
        "time": "2026-11-22T04:00:00Z",
        "victim": f"{NS_A}/ft-2",
        "victim_cluster_queue": CQ_A,
        "preemptor": "uid:1234",
        "preemptor_cluster_queue": "",
        "reason": "InClusterQueue",
        "verdict": "topology",
        "verdict_detail": "no layer-3 domain had room",
        "gpus_freed": 24,
    }
    page = ui.preemptions_page([record])
    assert f'<a href="/ui/workloads/{NS_A}/ft-2">{NS_A}/ft-2</a>' in page
    assert "<td>uid:1234</td>" in page
    assert '<td class="cause">topology: no layer-3 domain had room</td>' in page
    assert "No preemptions recorded." in ui.preemptions_page([])


def test_live_mermaid_draws_layers_down_to_nodes_with_free_gpus() -> None:
    model = two_domains(health={"n4": "UnschedulablePendingReboot"})
    place(model, NS_A, "big-0", "n1", 8)
    text = live_mermaid(topology_view(model))
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    labels = dict(re.findall(r'^  (d\d+)\["([^"]+)"\]', text, re.M))
    by_label = {v: k for k, v in labels.items()}
    l3 = by_label["network-node-layer-3<br/>nn-a<br/>8/16 GPUs free"]
    n1 = by_label["n1<br/>0/8 GPUs free"]
    assert f"  {l3} --> {n1}" in lines
    assert any(line.endswith(":::unschedulable") and "n4<br/>" in line for line in lines)
    assert len([v for v in labels.values() if "/8 GPUs free" in v]) == 4


# --- end to end: a running service, a real browser ----------------------------------------------


Live = tuple[RunningService, str, str]


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """Two teams with a workload each; one node cordoned by HyperPod's health label, one
    marked TopowatchHealthy=False by our own health agent."""
    start = time.time()
    store = ObjectStore()
    cluster = SimulatedCluster(store, scripted(("a", "b")), seed=2, start=start)
    cluster.bootstrap()
    server = FakeApiServer(store, bookmark_interval=0.2).start()
    running = RunningService(server.url)
    try:
        eventually(lambda: running.get("/readyz")[0] == 200, what="readyz")
        first = cluster.submit("a", "llama-train", 8, 2, "training-priority", now=start)
        second = cluster.submit("b", "bert-tune", 4, 1, "fine-tuning-priority", now=start)
        cluster.step(start + 1)
        names = sorted(n.name for n in cluster.nodes())
        busy = {n for n in names if cluster.gpu_pods(n)}
        idle = [n for n in names if n not in busy]
        cluster.cordon(idle[0])
        raw = store.get("nodes", "", idle[1])
        assert raw is not None
        raw["status"]["conditions"].append(
            {"type": "TopowatchHealthy", "status": "False", "reason": "XidFatal"}
        )
        store.upsert("nodes", raw)

        def admitted(key: str) -> bool:
            code, view = running.get(f"/api/v1/workloads/{key}")
            return code == 200 and view["status"] == "admitted"

        for key in (f"hyperpod-ns-a/{first}", f"hyperpod-ns-b/{second}"):
            eventually(functools.partial(admitted, key), what=f"{key} admitted")

        def marked() -> bool:
            body = running.get("/ui/topology")[1]
            return isinstance(body, bytes) and body.count(b"UNHEALTHY:") == 2

        eventually(marked, what="both unhealthy nodes seen")
        yield running, f"hyperpod-ns-a/{first}", f"hyperpod-ns-b/{second}"
    finally:
        running.stop()
        server.stop()


def dump_dom(url: str) -> str:
    """The DOM after Chromium has parsed and laid out the page."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium to run the UI test")
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    return done.stdout


def test_chromium_renders_topology_workload_and_preemption_pages(live: Live) -> None:
    running, first, second = live
    dom = dump_dom(f"{running.base}/ui/topology")
    assert running.service is not None
    for name in running.service.model.nodes:
        assert f'id="node-{name}"' in dom
    assert f'href="/ui/workloads/{first}"' in dom and f">{second}</a>" in dom
    unhealthy = re.findall(r'<g class="node unhealthy" id="node-([^"]+)"', dom)
    assert len(unhealthy) == 2
    assert "UNHEALTHY: HyperPod UnschedulablePendingReplacement" in dom
    assert "UNHEALTHY: TopowatchHealthy=False (XidFatal)" in dom
    assert dom.count('class="gpu used') == 20  # 2 pods x 8 GPUs + 1 pod x 4

    page = dump_dom(f"{running.base}/ui/workloads/{first}")
    assert f"{first}: admitted, 16 GPUs" in page
    assert '<table class="timeline">' in page and "<td>admitted</td>" in page
    ns, name = first.split("/")
    assert f'href="/ui/topology?workload={ns}%2F{name}"' in page

    ledger = dump_dom(f"{running.base}/ui/preemptions")
    assert "No preemptions recorded." in ledger


def test_unknown_workload_page_is_a_404_page(live: Live) -> None:
    running = live[0]
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{running.base}/ui/workloads/hyperpod-ns-a/nope", timeout=10)
    assert caught.value.code == 404
    assert caught.value.headers["Content-Type"].startswith("text/html")
    assert b"workload hyperpod-ns-a/nope is not known" in caught.value.read()


def test_topology_live_prints_mermaid_from_the_service(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    running = live[0]
    assert main(["topology", "live", "--server", running.base]) == 0
    out = capsys.readouterr().out
    assert out.startswith("flowchart TD\n")
    assert running.service is not None
    for name in running.service.model.nodes:
        assert f'["{name}<br/>' in out
    assert out.count(":::unschedulable") == 1  # the HyperPod-cordoned node takes no pods

    assert main(["topology", "live", "--server", running.base, "--format", "json"]) == 0
    assert '"fragmentation"' in capsys.readouterr().out

    assert main(["topology", "live", "--server", "http://127.0.0.1:1", "--timeout", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err
