"""Slurm jobs against the topology: where running jobs landed, why pending ones wait.

Rules the rows rest on:
- hops: exporter.topology.labels.hops, the Kueue side's definition (three layers: same leaf
  (layer-3) -> 2, same layer-2 -> 4, same layer-1 -> 6); domains spanned and the one
  UltraServer as exporter.topology.locality counts them.
- reasons: https://slurm.schedmd.com/job_reason_codes.html and squeue(1) JOB REASON CODES.
- free nodes: sinfo(1) NODE STATE CODES: IDLE is "not allocated to any jobs and is available
  for use"; DRAIN/FAIL/RESERVED/... take a node out of new allocations.
- squeue --json shapes per version: tests/fixtures/slurm/README.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.cli.slurm_explain import ExplainSlurmError, explain_slurm
from exporter.core.exposition import encode_text
from exporter.slurm.explain import as_dict, text
from exporter.slurm.metrics import slurm_families
from exporter.slurm.placement import (
    REASONS,
    free_capacity,
    judge,
    node_is_free,
    reason_meaning,
)
from exporter.sources.slurm.commands import SlurmCli
from exporter.sources.slurm.jobs import SlurmJob, parse_jobs
from exporter.sources.slurm.nodes import parse_nodes
from exporter.topology.files import load_placements
from exporter.topology.labels import Placement
from tests.slurm_harness import binary, running_slurmctld

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"
VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")


def place(l1: str, l2: str, l3: str, ultra: str = "", name: str = "") -> Placement:
    return Placement("us-east-1", "use1-az1", (l1, l2, l3), ultra, "p6e-gb200.36xlarge", name)


# nn-1 > nn-2a > {leaf-a: n1 n2, leaf-b: n3 n4}; nn-1 > nn-2b > leaf-c: n5..n8; n9 outside nn-1
TOPOLOGY: dict[str, Placement] = {
    "n1": place("nn-1", "nn-2a", "leaf-a", "us-1", "n1"),
    "n2": place("nn-1", "nn-2a", "leaf-a", "us-1", "n2"),
    "n3": place("nn-1", "nn-2a", "leaf-b", "us-2", "n3"),
    "n4": place("nn-1", "nn-2a", "leaf-b", "us-2", "n4"),
    **{f"n{i}": place("nn-1", "nn-2b", "leaf-c", "", f"n{i}") for i in range(5, 9)},
    "n9": place("nn-9", "nn-2z", "leaf-z", "", "n9"),
}


@dataclass(frozen=True)
class Node:
    name: str
    state: str = "idle"
    flags: frozenset[str] = field(default_factory=frozenset)
    partitions: tuple[str, ...] = ("gpu",)


def job(**overrides: object) -> SlurmJob:
    base = SlurmJob(
        job_id="42",
        name="train",
        user="alice",
        partition="gpu",
        state="RUNNING",
        state_flags=frozenset(),
        reason="None",
        reason_detail="",
        nodes=(),
        node_count=None,
        max_nodes=None,
        switches=None,
        contiguous=False,
        dependency="",
        required_nodes="",
        excluded_nodes="",
        gpus=None,
        submit_time=None,
        start_time=None,
        api_version="v0.0.38",
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def running(*nodes: str, **overrides: object) -> SlurmJob:
    return job(nodes=nodes, node_count=len(nodes), **overrides)


def pending(reason: str, needs: int, **overrides: object) -> SlurmJob:
    return job(state="PENDING", reason=reason, node_count=needs, **overrides)


# --- running jobs: the Kueue side's locality rules ------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "hops", "leaves", "layer2", "one_ultra", "rule"),
    [
        (("n1", "n2"), 2, 1, 1, True, "same leaf: each node climbs one link"),
        (("n1", "n3"), 4, 2, 1, False, "same layer-2: two links each; two UltraServers"),
        (("n1", "n5"), 6, 2, 2, False, "same layer-1 only: three links each"),
        (("n1", "n9"), 8, 2, 2, False, "no shared layer: 2 x (layers + 1)"),
        (("n5", "n6", "n7"), 2, 1, 1, None, "no UltraServer membership: unknown"),
        (("n1",), 0, 1, 1, True, "one node: zero hops"),
    ],
)
def test_running_job_locality(
    nodes: tuple[str, ...],
    hops: int,
    leaves: int,
    layer2: int,
    one_ultra: bool | None,
    rule: str,
) -> None:
    judged = judge(running(*nodes), TOPOLOGY)
    assert judged.worst_pair_hops == hops, rule
    assert judged.leaves == leaves
    assert judged.leaf_level == "network-node-layer-3"
    assert judged.domains["network-node-layer-2"] == layer2
    assert judged.domains["node"] == len(nodes)
    assert judged.one_ultraserver is one_ultra, rule
    assert judged.pending is None and not judged.problems


def test_running_job_on_nodes_outside_the_topology_says_unknown() -> None:
    judged = judge(running("n1", "ghost-7"), TOPOLOGY)
    assert judged.unplaced == ("ghost-7",)
    assert judged.worst_pair_hops is None  # cannot be known, never guessed
    assert judged.ultraserver == ""
    assert judged.problems == ("unknown: nodes missing from the topology",)


@pytest.mark.parametrize(
    ("nodes", "switches", "met"),
    [
        (("n1", "n2"), 1, True),  # --switches=1 in one leaf
        (("n1", "n3"), 1, False),  # the wait ran out: slurmctld started it over two leaves
        (("n1", "n3", "n5"), 3, True),
        (("n1", "n3"), None, None),  # not asked: no verdict
    ],
)
def test_switches_request_of_a_running_job(
    nodes: tuple[str, ...], switches: int | None, met: bool | None
) -> None:
    assert judge(running(*nodes, switches=switches), TOPOLOGY).switches_met is met


# --- free nodes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "free", "rule"),
    [
        (Node("n1"), True, "IDLE: not allocated to any jobs and available for use"),
        (Node("n1", "IDLE"), True, "state is compared case-insensitively"),
        (Node("n1", "mixed"), False, "MIXED: part of it runs a job; GPU jobs take whole nodes"),
        (Node("n1", "allocated"), False, "ALLOCATED"),
        (Node("n1", "down"), False, "DOWN"),
        (Node("n1", flags=frozenset({"DRAIN"})), False, "IDLE+DRAIN is drained"),
        (Node("n1", flags=frozenset({"RESERVED"})), False, "in an advanced reservation"),
        (Node("n1", flags=frozenset({"NOT_RESPONDING"})), False, "not responding"),
        (Node("n1", flags=frozenset({"PLANNED"})), False, "planned for a higher-priority job"),
        (Node("n1", flags=frozenset({"REBOOT_REQUESTED"})), False, "rebooting when idle"),
        (Node("n1", flags=frozenset({"CLOUD", "POWERED_DOWN"})), True, "resumed on allocation"),
    ],
)
def test_node_is_free(node: Node, free: bool, rule: str) -> None:
    assert node_is_free(node) is free, rule


def test_free_capacity_per_leaf_switch_and_partition() -> None:
    nodes = [
        Node("n1"),
        Node("n2", "allocated"),
        Node("n3"),
        Node("n4"),
        Node("n5"),
        Node("n6"),
        Node("n7", flags=frozenset({"DRAIN"})),
        Node("n8", partitions=("cpu",)),
        Node("x1"),  # free but not in the topology
    ]
    capacity = free_capacity(nodes, TOPOLOGY, ["gpu"])
    assert capacity.free_nodes == 6
    assert capacity.free_unplaced == 1
    assert capacity.per_leaf == (("leaf-b", 2), ("leaf-c", 2), ("leaf-a", 1))
    assert capacity.largest_leaf() == ("leaf-b", 2)
    assert capacity.best_leaves(2) == 4
    assert capacity.per_ultraserver == (("us-2", 2), ("us-1", 1))
    assert free_capacity(nodes, TOPOLOGY, []).free_nodes == 7  # every partition


# --- pending jobs: reasons and topology context ------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "words", "kind"),
    [
        ("Resources", "resources requested by the job are not available", "capacity"),
        ("Priority", "higher priority jobs exist for the partition", "queue"),
        ("ReqNodeNotAvail", "node specifically required by the job is not currently", "capacity"),
        ("Dependency", "dependency on another job that has not been satisfied", "user"),
        ("JobHeldUser", "held by the user or an account coordinator", "user"),
        ("JobHeldAdmin", "held by a privileged user", "admin"),
        ("BeginTime", "earliest start time has not yet been reached", "time"),
        ("PartitionConfig", "violates some limit on the partition", "admin"),
        ("AssocGrpGRESMinutes", "association has reached an aggregate limit", "admin"),
        ("QOSMaxNodePerJobLimit", "exceeds a maximum limit", "admin"),
        ("SomethingNew", "not a reason topowatch knows", "other"),
    ],
)
def test_reason_meanings_follow_the_slurm_docs(reason: str, words: str, kind: str) -> None:
    meaning, found = reason_meaning(reason)
    assert words in meaning
    assert found == kind


def test_reason_table_covers_the_common_reasons() -> None:
    # job_reason_codes.html "Common Reasons" (the prefixed families are matched by prefix)
    for reason in ("BeginTime", "Dependency", "Priority", "Resources"):
        assert reason in REASONS


FREE = [Node("n1"), Node("n2"), Node("n3", "allocated"), Node("n4")] + [
    Node(f"n{i}") for i in range(5, 8)
]  # leaf-a 2 free, leaf-b 1, leaf-c 3 (n8 absent from sinfo)


def test_pending_with_switches_1_names_the_largest_free_leaf() -> None:
    judged = judge(pending("Resources", 4, switches=1), TOPOLOGY, FREE)
    assert judged.pending is not None
    assert judged.pending.lines[0] == (
        "needs 4 nodes in one leaf switch (--switches=1); the largest free leaf switch "
        "(network-node-layer-3) is leaf-c with 3"
    )
    assert (
        "6 nodes free in partition gpu across 3 leaf switches (leaf-c 3, leaf-a 2, leaf-b 1)"
        in judged.pending.lines
    )


def test_pending_with_switches_2_counts_the_two_freest_leaves() -> None:
    judged = judge(pending("Priority", 5, switches=2), TOPOLOGY, FREE)
    assert judged.pending is not None
    assert judged.pending.lines[0] == (
        "needs 5 nodes in at most 2 leaf switches (--switches=2); the 2 freest leaf switches "
        "have 5 together (leaf-c 3, leaf-a 2)"
    )
    assert "enough by node count now" in judged.pending.lines[1]


def test_a_long_switch_list_names_the_freest_and_counts_the_rest() -> None:
    topology = {f"m{i}": place("nn-1", "nn-2", f"leaf-{i:02d}", "", f"m{i}") for i in range(12)}
    nodes = [Node(f"m{i}") for i in range(12)]
    judged = judge(pending("Resources", 20), topology, nodes)
    assert judged.pending is not None
    assert judged.pending.lines[0] == (
        "12 nodes free in partition gpu across 12 leaf switches (leaf-00 1, leaf-01 1, "
        "leaf-02 1, leaf-03 1, leaf-04 1, leaf-05 1, leaf-06 1, leaf-07 1, and 4 more)"
    )


@pytest.mark.parametrize(
    ("needs", "expected"),
    [
        (9, "needs 9 nodes: 3 more than are free"),
        (5, "needs 5 nodes: enough nodes are free by count, so what is missing is not the node"),
    ],
)
def test_pending_for_resources_compares_needed_with_free(needs: int, expected: str) -> None:
    judged = judge(pending("Resources", needs), TOPOLOGY, FREE)
    assert judged.pending is not None
    assert any(line.startswith(expected) for line in judged.pending.lines)
    if needs == 5:  # no one leaf switch has 5 free: it would span
        assert judged.pending.lines[-1].startswith("no one leaf switch holds 5 free nodes")


@pytest.mark.parametrize("reason", ["Priority", "Dependency", "JobHeldUser", "JobHeldAdmin"])
def test_no_topology_context_where_topology_is_not_the_question(reason: str) -> None:
    judged = judge(pending(reason, 4), TOPOLOGY, FREE)
    assert judged.pending is not None
    assert judged.pending.capacity is None and judged.pending.lines == ()


def test_contiguous_is_said_but_not_judged() -> None:
    judged = judge(pending("Priority", 2, contiguous=True), TOPOLOGY, FREE)
    assert judged.pending is not None
    assert judged.pending.lines[0].startswith("asks for contiguous nodes (--contiguous)")


def test_pending_without_node_states_says_capacity_is_unknown() -> None:
    judged = judge(pending("Resources", 2), TOPOLOGY, [])
    assert judged.pending is not None
    assert judged.pending.lines == ("no node states were read, so free capacity is unknown",)


def test_pending_in_several_partitions_counts_all_of_them() -> None:
    nodes = [Node("n1", partitions=("a",)), Node("n2", partitions=("b",)), Node("n3")]
    judged = judge(pending("Resources", 3, partition="a,b"), TOPOLOGY, nodes)
    assert judged.pending is not None and judged.pending.capacity is not None
    assert judged.pending.capacity.free_nodes == 2


# --- squeue --json across versions -------------------------------------------------------------


FIXTURE_TOPOLOGY = {
    "gpu-1": Placement("", "", ("sw-top", "sw-a"), "", "", "gpu-1"),
    "gpu-2": Placement("", "", ("sw-top", "sw-a"), "", "", "gpu-2"),
    "gpu-3": Placement("", "", ("sw-top", "sw-b"), "", "", "gpu-3"),
    "gpu-4": Placement("", "", ("sw-top", "sw-b"), "", "", "gpu-4"),
}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_squeue_version_parses_alike(version: str) -> None:
    jobs, problems = parse_jobs((FIXTURES / f"squeue_{version}.json").read_text())
    assert problems == []
    assert all(j.api_version == version and not j.problems for j in jobs)
    by_name = {j.name: j for j in jobs}
    assert [(j.job_id, j.state, j.reason) for j in jobs] == [
        ("1", "RUNNING", "None"),
        ("2", "PENDING", "JobHeldUser"),
        ("3", "PENDING", "Dependency"),
        ("4", "PENDING", "Resources"),
        ("5", "PENDING", "Priority"),
        ("6", "PENDING", "PartitionConfig"),
    ]
    spread = by_name["spread"]
    assert spread.nodes == ("gpu-2", "gpu-3") and spread.allocated
    assert spread.user == "root" and spread.partition == "all"
    assert spread.submit_time is not None and spread.start_time is not None
    assert by_name["held"].start_time is None
    assert by_name["after"].dependency == "afterok:1(unfulfilled)"
    assert by_name["big"].node_count == 3
    assert by_name["big"].state_flags == (
        frozenset() if version in ("v0.0.38", "v0.0.39") else frozenset({"REQUEUED"})
    )
    assert by_name["oneswitch"].switches == (None if version == "v0.0.38" else 1)
    judged = judge(spread, FIXTURE_TOPOLOGY)
    assert (judged.leaves, judged.worst_pair_hops) == (2, 4)  # same top switch: 2 links each


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.41"])
def test_nodes_come_from_job_resources_when_the_job_list_is_empty(version: str) -> None:
    document = json.loads((FIXTURES / f"squeue_{version}.json").read_text())
    document["jobs"][0]["nodes"] = ""
    jobs, _ = parse_jobs(json.dumps(document))
    assert jobs[0].nodes == ("gpu-2", "gpu-3")
    resources = document["jobs"][0]["job_resources"]
    if version == "v0.0.41":
        resources["nodes"]["list"] = ""
    else:
        resources["nodes"] = ""
    jobs, _ = parse_jobs(json.dumps(document))
    assert jobs[0].nodes == ("gpu-2", "gpu-3")  # from allocated_nodes / nodes.allocation


def test_array_task_ids_read_as_squeue_shows_them() -> None:
    document = {
        "jobs": [
            {"job_id": 17, "array_job_id": 15, "array_task_id": 2, "job_state": "PENDING"},
            {
                "job_id": 18,
                "array_job_id": {"set": True, "infinite": False, "number": 15},
                "array_task_id": {"set": True, "infinite": False, "number": 3},
                "job_state": ["PENDING"],
            },
        ]
    }
    jobs, problems = parse_jobs(json.dumps(document))
    assert [j.job_id for j in jobs] == ["15_2", "15_3"] and problems == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "unknown: squeue output is not JSON"),
        ("[]", "unknown: squeue output is not a JSON object"),
        ('{"jobs": 3}', "unknown: squeue output has no jobs list"),
        ('{"jobs": [7]}', "unknown: jobs[0] is not an object"),
        ('{"jobs": [], "errors": [{"error": "boom"}]}', "squeue reported an error: boom"),
    ],
)
def test_unreadable_documents_are_problems(text: str, problem: str) -> None:
    jobs, problems = parse_jobs(text)
    assert jobs == []
    assert problems and problems[0].startswith(problem)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"job_state": "RUNNING", "nodes": "n[1-2"}, "unknown: nodes hostlist"),
        ({"job_state": {"odd": 1}}, "unknown: job_state"),
        ({"job_state": "WEIRD"}, "unknown: job_state"),
        ({"job_state": "PENDING", "node_count": "three"}, "unknown: node_count"),
        ({"job_state": "PENDING", "node_count": -1}, "unknown: node_count"),
        ({"job_state": "RUNNING", "nodes": 5}, "unknown: nodes"),
        ({"job_id": None, "job_state": "PENDING"}, "unknown: no job_id"),
    ],
)
def test_garbage_in_a_job_is_a_counted_problem(entry: dict[str, object], problem: str) -> None:
    record = {"job_id": 9, **entry}
    jobs, problems = parse_jobs(json.dumps({"jobs": [record, {"job_id": 10}]}))
    assert problems == [] and len(jobs) == 2  # the other job still reads
    assert any(p.startswith(problem) for p in jobs[0].problems)
    families = {f.name: f for f in slurm_families(jobs, [], TOPOLOGY, "c1")}
    samples = families["topowatch_slurm_job_problems"].samples
    kind = " ".join(problem.split()[:2])  # the label keeps the kind, not the garbage itself
    assert any(f'problem="{kind}' in labels for labels, _ in samples)


# --- metrics ---------------------------------------------------------------------------------


def test_metric_families_share_the_kueue_names_with_slurm_labels() -> None:
    jobs = [
        running("n1", "n3", job_id="1", gpus=16, switches=1),
        running("n5", "n6", job_id="2", name="eval", user="bob"),
        pending("Resources", 4, job_id="3", switches=1),
        pending("Priority", 2, job_id="4"),
        pending("Priority", 2, job_id="5"),
    ]
    body = encode_text(slurm_families(jobs, FREE, TOPOLOGY, "c1")).decode()
    head = 'scheduler="slurm",cluster="c1"'
    j1 = f'{head},job_id="1",name="train",user="alice",partition="gpu"'
    assert f"topowatch_workload_worst_pair_hops{{{j1}}} 4\n" in body
    assert f'topowatch_workload_domains{{{j1},level="network-node-layer-3"}} 2\n' in body
    assert f'topowatch_workload_domains{{{j1},level="node"}} 2\n' in body
    assert (
        f'topowatch_workload_topology_satisfied{{{j1},mode="switches",'
        f'level="network-node-layer-3"}} 0\n' in body
    )
    assert f"topowatch_workload_gpus{{{j1}}} 16\n" in body
    assert f"topowatch_slurm_job_one_ultraserver{{{j1}}} 0\n" in body
    assert 'job_id="2",name="eval",user="bob",partition="gpu"} 2\n' in body  # hops, same leaf
    assert (
        f'topowatch_pending_workloads{{{head},partition="gpu",cause="Priority",class="queue"}} 2'
        in body
    )
    j3 = f'{head},job_id="3",name="train",user="alice",partition="gpu",reason="Resources"'
    assert f'topowatch_slurm_pending_job_nodes{{{j3},nodes="needed"}} 4\n' in body
    assert f'topowatch_slurm_pending_job_nodes{{{j3},nodes="free"}} 6\n' in body
    assert f'topowatch_slurm_pending_job_nodes{{{j3},nodes="largest_free_leaf"}} 3\n' in body
    assert 'job_id="4"' not in body.split("topowatch_slurm_pending_job_nodes")[-1]
    assert f"topowatch_cluster_workload_series_dropped{{{head}}} 0\n" in body


def test_per_job_series_are_capped() -> None:
    jobs = [running("n1", job_id=str(i)) for i in range(5)]
    families = {f.name: f for f in slurm_families(jobs, [], TOPOLOGY, "c1", job_cap=2)}
    assert len(families["topowatch_workload_worst_pair_hops"].samples) == 2
    assert families["topowatch_cluster_workload_series_dropped"].samples[0][1] == "3"


def test_families_parse_as_prometheus_text() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    jobs, problems = parse_jobs((FIXTURES / "squeue_v0.0.40.json").read_text())
    nodes, _ = parse_nodes((FIXTURES / "sinfo_v0.0.38.json").read_text())
    body = encode_text(slurm_families(jobs, nodes, FIXTURE_TOPOLOGY, "c1", problems)).decode()
    names = {family.name for family in text_string_to_metric_families(body)}
    assert "topowatch_workload_worst_pair_hops" in names
    assert "topowatch_pending_workloads" in names


# --- explain ---------------------------------------------------------------------------------


def test_explain_text_of_a_running_job() -> None:
    """Each level names its switches with the job's nodes on each, as the Kueue side names
    its domains ("network-node-layer-3: nn-a (2 pods), nn-b (1 pod)")."""
    item = judge(running("n1", "n3", gpus=16), TOPOLOGY)
    said = text(item)
    assert said.splitlines() == [
        'Slurm job 42 "train" (user alice, partition gpu): RUNNING',
        "  nodes (2): n[1,3]",
        "  holds: 2 nodes, 16 GPUs",
        "  spans: 1 network-node-layer-1, 1 network-node-layer-2, 2 network-node-layer-3, "
        "2 ultraserver",
        "    network-node-layer-1: nn-1",
        "    network-node-layer-2: nn-2a",
        "    network-node-layer-3: leaf-a (1 node), leaf-b (1 node)",
        "    UltraServer: us-1 (1 node), us-2 (1 node)",
        "  leaf switches (network-node-layer-3): 2 (leaf-a, leaf-b)",
        "  worst-pair hops: 4 (links between the two farthest nodes, as the Kueue side counts "
        "them)",
        "  UltraServer: not one; 2 UltraServers (or nodes outside any)",
    ]
    assert as_dict(item)["placement"]["where"]["network-node-layer-3"] == [
        {"domain": "leaf-a", "nodes": 1},
        {"domain": "leaf-b", "nodes": 1},
    ]


def test_explain_text_and_json_of_a_pending_job() -> None:
    item = judge(pending("Resources", 4, switches=1, reason_detail="Resources"), TOPOLOGY, FREE)
    said = text(item)
    assert "  asks: 4 nodes, --switches=1" in said
    assert "  reason: Resources [capacity]: The resources requested by the job" in said
    assert "job_reason_codes.html" in said
    assert "  topology: needs 4 nodes in one leaf switch (--switches=1)" in said
    body = as_dict(item)
    assert body["pending"]["free"]["per_leaf_switch"] == {"leaf-c": 3, "leaf-a": 2, "leaf-b": 1}
    assert body["pending"]["class"] == "capacity"
    json.dumps(body)


class FakeSlurm(SlurmCli):
    def __init__(self, squeue: str, nodes: str) -> None:
        super().__init__(env={})
        self.squeue, self.nodes = squeue, nodes

    def squeue_json(self) -> str:
        return self.squeue

    def nodes_json(self) -> str:
        return self.nodes


TOPOLOGY_CONF = """SwitchName=sw-top Switches=sw-a,sw-b
SwitchName=sw-a Nodes=gpu-[1-2]
SwitchName=sw-b Nodes=gpu-[3-4]
"""


def test_explain_slurm_with_a_topology_file(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(TOPOLOGY_CONF)
    fake = FakeSlurm(
        (FIXTURES / "squeue_v0.0.41.json").read_text(),
        (FIXTURES / "sinfo_v0.0.38.json").read_text(),
    )
    said = explain_slurm("1", conf, False, fake)
    assert "  spans: 1 network-node-layer-1, 2 network-node-layer-2" in said
    assert "    network-node-layer-2: sw-a (1 node), sw-b (1 node)" in said  # topology.conf's
    assert "  worst-pair hops: 4" in said
    assert f"  topology file: {conf} (4 nodes)" in said
    big = json.loads(explain_slurm("4", conf, True, fake))
    assert big["pending"]["reason"] == "Resources"
    assert big["pending"]["topology"][:2] == [
        "2 nodes free in partition all across 2 leaf switches (sw-a 1, sw-b 1)",
        "needs 3 nodes: 1 more than are free",
    ]
    with pytest.raises(ExplainSlurmError, match="no job 99"):
        explain_slurm("99", conf, False, fake)


# --- a real slurmctld with one slurmd per node -------------------------------------------------


@pytest.mark.real_component
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs jobs as root here")
def test_real_slurm_jobs_placement_and_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    with running_slurmctld(tmp_path, names, TOPOLOGY_CONF, slurmd=True) as env:

        def sbatch(*argv: str) -> str:
            done = subprocess.run(
                [binary("sbatch"), "--parsable", "-o", "/dev/null", *argv, "--wrap", "sleep 300"],
                env=env,
                capture_output=True,
                text=True,
                cwd=tmp_path,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout.strip().split(";")[0]

        spread = sbatch("-J", "spread", "-N", "2", "-w", "gpu-2,gpu-3")
        held = sbatch("-J", "held", "--hold", "-N", "1")
        after = sbatch("-J", "after", "-N", "1", f"--dependency=afterok:{spread}")
        big = sbatch("-J", "big", "-N", "3")
        cli = SlurmCli(env=env)
        wanted = {spread: "RUNNING", held: "JobHeldUser", after: "Dependency", big: "Resources"}
        deadline = time.monotonic() + 30
        while True:
            jobs, problems = parse_jobs(cli.squeue_json())
            seen = {j.job_id: (j.state if j.allocated else j.reason) for j in jobs}
            if all(seen.get(k) == v for k, v in wanted.items()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert problems == [] and seen == wanted
        conf = tmp_path / "topology.conf"
        placements = load_placements(conf)
        running_job = judge(next(j for j in jobs if j.job_id == spread), placements)
        assert (running_job.leaves, running_job.worst_pair_hops) == (2, 4)
        assert running_job.domains["network-node-layer-2"] == 2

        said = explain_slurm(big, conf, False, cli)
        assert "reason: Resources [capacity]" in said
        assert "needs 3 nodes: 1 more than are free" in said  # gpu-1 and gpu-4 are idle
        assert "2 nodes free in partition all across 2 leaf switches (sw-a 1, sw-b 1)" in said

        monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
        assert main(["explain", "--slurm", held, "--json"]) == 0  # topology.conf found beside
        body = json.loads(capsys.readouterr().out)
        assert body["pending"]["reason"] == "JobHeldUser"
        assert body["topology_file"] == str(conf)
        assert main(["explain", "--slurm", after]) == 0
        out = capsys.readouterr().out
        assert "reason: Dependency [user]" in out and f"dependency: afterok:{spread}" in out
        assert main(["explain", "--slurm", spread]) == 0
        out = capsys.readouterr().out
        assert "nodes (2): gpu-[2-3]" in out and "worst-pair hops: 4" in out
        # the switches named, as topology.conf names them (the Kueue side names its domains)
        assert "    network-node-layer-1: sw-top\n" in out
        assert "    network-node-layer-2: sw-a (1 node), sw-b (1 node)\n" in out
        assert "  leaf switches (network-node-layer-2): 2 (sw-a, sw-b)\n" in out
