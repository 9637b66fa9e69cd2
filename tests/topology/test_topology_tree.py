"""The topology tree: label parsing, hop distance, GPU accounting per domain, rendering."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from exporter.topology.tree import (
    LABEL_KEY_OF_LEVEL,
    LEVELS,
    NETWORK_LEVELS,
    DomainUsage,
    LevelFragmentation,
    Placement,
    TopologyTree,
    hops,
    level_of_label_key,
    render_tree,
)
from tests.conftest import reference

L1, L2, L3, L4 = NETWORK_LEVELS
ZONE_KEY = "topology.kubernetes.io/zone"
REGION_KEY = "topology.kubernetes.io/region"
US_KEY = "topology.k8s.aws/ultraserver-id"
LAYER_KEY = "topology.k8s.aws/network-node-layer-{}"


def labels(
    *layers: str, zone: str = "us-east-1a", region: str = "us-east-1", us: str = ""
) -> dict[str, str]:
    out = {REGION_KEY: region, ZONE_KEY: zone, "node.kubernetes.io/instance-type": "p5.48xlarge"}
    for depth, value in enumerate(layers, start=1):
        if value:
            out[LAYER_KEY.format(depth)] = value
    if us:
        out[US_KEY] = us
    return out


def place(*layers: str) -> Placement:
    return Placement.from_labels(labels(*layers))


# -- labels and hops ---------------------------------------------------------------------------


def test_label_keys_map_both_ways() -> None:
    assert LABEL_KEY_OF_LEVEL["network-node-layer-3"] == "topology.k8s.aws/network-node-layer-3"
    assert LABEL_KEY_OF_LEVEL["node"] == "kubernetes.io/hostname"
    for level, key in LABEL_KEY_OF_LEVEL.items():
        assert level_of_label_key(key) == level
    assert set(LABEL_KEY_OF_LEVEL) == set(LEVELS)
    assert level_of_label_key(US_KEY) == "ultraserver"
    assert level_of_label_key("example.com/rack") is None


def test_placement_reads_every_label_and_keeps_gaps_in_place() -> None:
    full = Placement.from_labels(
        {**labels("nn-a", "nn-b", "nn-c", "nn-d", us="us-1"), "kubernetes.io/hostname": "h1"}
    )
    assert full.layers == ("nn-a", "nn-b", "nn-c", "nn-d")
    assert (full.region, full.zone, full.ultraserver) == ("us-east-1", "us-east-1a", "us-1")
    assert full.instance_type == "p5.48xlarge"
    assert [full.domain_at(level) for level in LEVELS] == [
        "us-east-1",
        "us-east-1a",
        "nn-a",
        "nn-b",
        "nn-c",
        "nn-d",
        "h1",
    ]
    assert full.domain_at("ultraserver") == "us-1"

    gap = place("nn-a", "", "nn-c")  # layer-2 label missing
    assert gap.layers == ("nn-a", "", "nn-c")
    assert gap.domain_at(L2) is None and gap.domain_at(L3) == "nn-c"
    assert gap.domain_at(L4) is None and gap.domain_at("rack") is None

    bare = Placement.from_labels({})
    assert bare.layers == () and bare.zone == "" and bare.domain_at("zone") is None


def test_placement_ignores_malformed_label_values() -> None:
    weird: dict[str, Any] = {ZONE_KEY: 7, LAYER_KEY.format(1): None, LAYER_KEY.format(2): "nn-b"}
    parsed = Placement.from_labels(weird)
    assert parsed.zone == "" and parsed.layers == ("", "nn-b")
    assert Placement.from_labels(None).layers == ()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (("x", "y", "z"), ("x", "y", "z"), 2),  # two instances under one layer-3 node
        (("x", "y", "z1"), ("x", "y", "z2"), 4),
        (("x", "y1", "z1"), ("x", "y2", "z2"), 6),
        (("x1", "y1", "z1"), ("x2", "y2", "z2"), 8),  # meet above the network tree
        (("w", "x", "y", "z1"), ("w", "x", "y", "z2"), 4),  # four layers
        (("w1", "x", "y", "z"), ("w2", "x2", "y2", "z2"), 10),
        (("w", "x", "y"), ("w", "x", "y", "z"), 3),  # 3-layer instance beside a 4-layer one
        (("", "y", "z1"), ("x", "y", "z2"), 4),  # layer-1 label lost: layer-2 ids still meet
    ],
)
def test_hops_counts_links_to_the_lowest_shared_network_node(
    a: tuple[str, ...], b: tuple[str, ...], expected: int
) -> None:
    assert hops(place(*a), place(*b)) == expected
    assert hops(place(*b), place(*a)) == expected


def test_hops_is_zero_for_one_node_and_unknown_without_network_labels() -> None:
    assert hops(place("x", "y", "z"), place("x", "y", "z"), same_node=True) == 0
    assert hops(place("x", "y", "z"), place()) is None
    assert hops(place(), place()) is None


def test_hops_on_the_published_p5_topology() -> None:
    data = json.loads(reference("aws/describe-instance-topology-p5.json").read_text())
    tree = TopologyTree()
    places = []
    for instance in data["Instances"]:
        node_labels = labels(*instance["NetworkNodes"], zone=instance["AvailabilityZone"])
        tree.set_node(instance["InstanceId"], node_labels, 8, True)
        places.append(Placement.from_labels(node_labels))
    # All four share layer-1 and layer-2 but sit under different layer-3 nodes.
    assert {hops(a, b) for i, a in enumerate(places) for b in places[i + 1 :]} == {4}
    layer2 = tree.usage(L2, "nn-224a2a4d9df61a975")
    assert layer2 is not None and (layer2.nodes, layer2.allocatable, layer2.free) == (4, 32, 32)
    assert [c.level for c in tree.children(L2, "nn-224a2a4d9df61a975")] == [L3] * 4
    assert tree.levels_present() == ["region", "zone", L1, L2, L3, "node"]


# -- accounting ------------------------------------------------------------------------------


def small_cluster() -> TopologyTree:
    """Two layer-3 blocks under one layer-2 node, plus one block elsewhere."""
    tree = TopologyTree()
    tree.set_node("a1", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, True)
    tree.set_node("a2", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, True)
    tree.set_node("b1", labels("nn-1", "nn-2", "nn-3b"), 8, True)
    tree.set_node("c1", labels("nn-9", "nn-8", "nn-3c", zone="us-east-1b"), 8, True)
    return tree


def test_usage_totals_roll_up_every_level() -> None:
    tree = small_cluster()
    tree.add_used("a1", 8)
    tree.add_used("b1", 2)
    assert tree.usage("zone", "us-east-1a") == DomainUsage(
        "zone", "us-east-1a", "us-east-1", 3, 24, 10, 0, 14
    )
    assert tree.usage("region", "us-east-1") == DomainUsage(
        "region", "us-east-1", None, 4, 32, 10, 0, 22
    )
    assert tree.usage(L3, "nn-3a") == DomainUsage(L3, "nn-3a", "nn-2", 2, 16, 8, 0, 8)
    assert tree.usage("node", "b1") == DomainUsage("node", "b1", "nn-3b", 1, 8, 2, 0, 6)
    assert tree.ultraservers() == [DomainUsage("ultraserver", "us-x", None, 2, 16, 8, 0, 8)]
    assert tree.node_free("a1") == 0 and tree.node_free("b1") == 6
    assert tree.usage(L3, "nn-missing") is None and tree.usage("rack", "x") is None


def test_free_counts_only_gpus_a_new_pod_could_get() -> None:
    tree = small_cluster()
    tree.set_node("a2", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, schedulable=False)
    tree.add_used("a2", 3)  # a pod still running on the cordoned node
    tree.add_used("a1", 12)  # over-committed: must not eat into b1's free GPUs
    layer2 = tree.usage(L2, "nn-2")
    assert layer2 is not None
    assert (layer2.allocatable, layer2.used, layer2.unschedulable, layer2.free) == (24, 15, 8, 8)
    assert tree.node_free("a2") == 0
    tree.set_node("a2", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, schedulable=True)
    layer2 = tree.usage(L2, "nn-2")
    assert layer2 is not None and (layer2.unschedulable, layer2.free) == (0, 13)


def test_usage_seen_before_its_node_is_applied_when_the_node_arrives() -> None:
    tree = TopologyTree()
    tree.add_used("late", 4)
    tree.add_used("late", 2)
    assert tree.node_free("late") == 0 and tree.usage("node", "late") is None
    tree.set_node("late", labels("x", "y", "z"), 8, True)
    assert tree.node_free("late") == 2
    zone = tree.usage("zone", "us-east-1a")
    assert zone is not None and (zone.used, zone.free) == (6, 2)


def test_usage_never_goes_negative_and_outlives_a_removed_node() -> None:
    tree = small_cluster()
    tree.add_used("a1", -5)
    assert tree.node_used("a1") == 0 and tree.node_free("a1") == 8
    tree.add_used("a1", 6)
    tree.remove_node("a1")  # informer deleted the Node before its pods
    assert tree.usage("node", "a1") is None
    zone = tree.usage("zone", "us-east-1a")
    assert zone is not None and (zone.nodes, zone.used) == (2, 0)
    tree.add_used("a1", -2)  # one pod goes away meanwhile
    tree.set_node("a1", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, True)
    assert tree.node_free("a1") == 4


def test_a_node_that_moves_takes_its_capacity_and_use_along() -> None:
    tree = small_cluster()
    tree.add_used("b1", 5)
    tree.set_node("b1", labels("nn-9", "nn-8", "nn-3c", zone="us-east-1b"), 8, True)
    assert tree.usage(L3, "nn-3b") is None  # its only node left
    assert [d.domain for d in tree.children(L2, "nn-2")] == ["nn-3a"]
    moved = tree.usage(L3, "nn-3c")
    assert moved is not None and (moved.nodes, moved.used, moved.free) == (2, 5, 11)
    zone_a, zone_b = tree.usage("zone", "us-east-1a"), tree.usage("zone", "us-east-1b")
    assert zone_a is not None and (zone_a.nodes, zone_a.allocatable, zone_a.used) == (2, 16, 0)
    assert zone_b is not None and (zone_b.nodes, zone_b.allocatable, zone_b.used) == (2, 16, 5)
    assert tree.nodes_in("zone", "us-east-1b") == ["b1", "c1"]


def test_a_missing_intermediate_layer_leaves_the_node_under_an_unknown_parent() -> None:
    tree = small_cluster()
    tree.set_node("gap", labels("nn-1", "", "nn-3z"), 8, True)
    assert tree.usage(L1, "nn-1") is not None and tree.nodes_in(L1, "nn-1")[-1] == "gap"
    assert "gap" not in tree.nodes_in(L2, "nn-2")
    orphan = tree.usage(L3, "nn-3z")
    assert orphan is not None and orphan.parent == "" and orphan.free == 8
    assert [d.domain for d in tree.children(L1, "nn-1")] == ["nn-2"]
    roots = render_tree(tree)
    assert [(r["level"], r["domain"]) for r in roots] == [("region", "us-east-1"), (L3, "nn-3z")]
    assert roots[1]["children"][0]["domain"] == "gap"
    assert hops(tree.placement("gap"), tree.placement("a1")) == 6  # type: ignore[arg-type]


def test_nodes_without_network_labels_hang_under_their_zone() -> None:
    tree = TopologyTree()
    tree.set_node("cpu-1", labels(), 0, True)
    tree.set_node("nolabels", {}, 8, True)
    assert tree.placement("cpu-1") == Placement.from_labels(labels())
    assert [(d.level, d.domain) for d in tree.children("zone", "us-east-1a")] == [("node", "cpu-1")]
    assert tree.levels_present() == ["region", "zone", "node"]
    assert tree.usage("node", "nolabels") == DomainUsage("node", "nolabels", "", 1, 8, 0, 0, 8)
    assert tree.fragmentation(L1) == LevelFragmentation(L1, 0, 0, 0, "")


def test_fragmentation_reports_the_largest_free_block_and_how_split_the_rest_is() -> None:
    tree = small_cluster()
    tree.add_used("a1", 4)
    frag = tree.fragmentation(L3)
    assert frag == LevelFragmentation(L3, 3, 28, 12, "nn-3a")
    assert frag.ratio == pytest.approx(1 - 12 / 28)
    largest = tree.largest_free(L3)
    assert largest is not None and (largest.domain, largest.free) == ("nn-3a", 12)

    tree.add_used("a2", 8)  # the largest block shrinks below the others: a tie, smallest id wins
    assert tree.fragmentation(L3) == LevelFragmentation(L3, 3, 20, 8, "nn-3b")
    for node in ("a1", "b1", "c1"):
        tree.add_used(node, 8)
    assert tree.largest_free(L3) is None
    assert tree.fragmentation(L3) == LevelFragmentation(L3, 3, 0, 0, "")
    assert tree.fragmentation(L3).ratio == 0.0
    assert tree.fragmentation("no-such-level").domains == 0


def test_domains_children_and_nodes_are_sorted() -> None:
    tree = small_cluster()
    assert [d.domain for d in tree.domains(L3)] == ["nn-3a", "nn-3b", "nn-3c"]
    assert [d.domain for d in tree.children(L3, "nn-3a")] == ["a1", "a2"]
    assert tree.nodes_in(L1, "nn-1") == ["a1", "a2", "b1"]
    assert tree.children("zone", "nowhere") == [] and tree.nodes_in(L1, "nowhere") == []
    assert tree.domains("rack") == []
    assert tree.levels_present() == ["region", "zone", L1, L2, L3, "node", "ultraserver"]


def test_version_moves_on_every_change_and_only_then() -> None:
    tree = small_cluster()
    seen = tree.version
    tree.set_node("a1", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 8, True)  # resync, no change
    tree.add_used("a1", 0)
    tree.add_used("b1", -1)  # already 0
    tree.remove_node("unknown")
    assert tree.version == seen
    changes: list[Callable[[], None]] = [
        lambda: tree.add_used("a1", 1),
        lambda: tree.set_node("a1", labels("nn-1", "nn-2", "nn-3a", us="us-x"), 4, True),
        lambda: tree.set_node("a1", labels("nn-1", "nn-2", "nn-3b"), 4, True),
        lambda: tree.remove_node("a1"),
    ]
    for change in changes:
        change()
        assert tree.version > seen
        seen = tree.version


def test_malformed_input_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    tree = TopologyTree()
    with caplog.at_level(logging.WARNING, logger="exporter.topology.tree"):
        tree.set_node("n1", labels("x"), "8", True)  # type: ignore[arg-type]
        tree.set_node("n2", labels("x"), -4, True)
        tree.set_node("", labels("x"), 8, True)
        tree.add_used("n1", 1.5)  # type: ignore[arg-type]
    assert tree.usage(L1, "x") == DomainUsage(L1, "x", "us-east-1a", 2, 0, 0, 0, 0)
    assert tree.node_used("n1") == 0
    messages = caplog.text
    assert "not an integer" in messages and "negative" in messages and "no usable name" in messages


# -- rendering -------------------------------------------------------------------------------


def test_render_tree_nests_domains_with_their_totals() -> None:
    tree = small_cluster()
    tree.add_used("a1", 8)
    [region] = render_tree(tree)
    assert (region["domain"], region["nodes"], region["used"], region["free"]) == (
        "us-east-1",
        4,
        8,
        24,
    )
    zone_a = region["children"][0]
    layer3a = zone_a["children"][0]["children"][0]["children"][0]
    assert (layer3a["level"], layer3a["domain"], layer3a["free"]) == (L3, "nn-3a", 8)
    assert [n["domain"] for n in layer3a["children"]] == ["a1", "a2"]
    assert layer3a["children"][0] == {
        "level": "node",
        "domain": "a1",
        "nodes": 1,
        "allocatable": 8,
        "used": 8,
        "unschedulable": 0,
        "unavailable": 0,
        "free": 0,
        "children": [],
    }
    json.dumps(render_tree(tree))  # JSON-friendly


def test_render_tree_stops_at_the_level_limit() -> None:
    tree = small_cluster()

    def deepest(entries: list[dict[str, Any]]) -> set[str]:
        found: set[str] = set()
        for entry in entries:
            found |= deepest(entry["children"]) if entry["children"] else {entry["level"]}
        return found

    assert deepest(render_tree(tree)) == {"node"}
    assert deepest(render_tree(tree, level_limit=L2)) == {L2}
    assert render_tree(TopologyTree()) == []
    with pytest.raises(ValueError, match="unknown level"):
        render_tree(tree, level_limit="rack")


# -- randomized check against a brute-force recompute --------------------------------------------


def random_labels(rng: random.Random) -> dict[str, str]:
    """Mostly a consistent hierarchy; sometimes labels go missing or contradict the hierarchy."""
    region = rng.choice(["r1", "r2"])
    zone = f"{region}{rng.choice('ab')}"
    path = [f"nn-{zone}-{rng.randrange(2)}"]
    for _ in range(2 if rng.random() < 0.6 else 3):
        path.append(f"{path[-1]}.{rng.randrange(2)}")
    if rng.random() < 0.05:
        path[rng.randrange(len(path))] = f"nn-stray-{rng.randrange(2)}"
    out = {REGION_KEY: region, ZONE_KEY: zone}
    out.update({LAYER_KEY.format(i): v for i, v in enumerate(path, start=1)})
    if rng.random() < 0.3:
        out[US_KEY] = f"us-{rng.randrange(3)}"
    return {k: v for k, v in out.items() if rng.random() > 0.08}


def brute_force(
    nodes: Mapping[str, tuple[dict[str, str], int, bool, bool]], used: Mapping[str, int]
) -> tuple[dict[tuple[str, str], DomainUsage], dict[tuple[str, str], set[tuple[str, str]]]]:
    """Every domain's totals and children, recomputed from scratch from the node list."""
    totals: dict[tuple[str, str], list[int]] = {}
    members: dict[tuple[str, str], int] = Counter()
    parents: dict[tuple[str, str], Counter[str]] = {}
    children: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for name, (node_labels, allocatable, schedulable, available) in nodes.items():
        node_used = used.get(name, 0)
        free = max(0, allocatable - node_used) if schedulable and available else 0
        layer_values = [node_labels.get(LAYER_KEY.format(i), "") for i in range(1, 5)]
        deepest = max((i for i, v in enumerate(layer_values) if v), default=-1)
        chain: list[tuple[str, str]] = [
            ("region", node_labels.get(REGION_KEY, "")),
            ("zone", node_labels.get(ZONE_KEY, "")),
            *zip(NETWORK_LEVELS[: deepest + 1], layer_values[: deepest + 1], strict=True),
            ("node", name),
        ]
        keys = [key for key in chain if key[1]]
        if node_labels.get(US_KEY):
            keys.append(("ultraserver", node_labels[US_KEY]))
        for key in keys:
            row = totals.setdefault(key, [0, 0, 0, 0, 0])
            row[0] += allocatable
            row[1] += node_used
            row[2] += 0 if schedulable or not available else allocatable
            row[3] += free
            row[4] += 0 if available else allocatable
            members[key] += 1
        for index in range(1, len(chain)):
            if chain[index][1]:
                parents.setdefault(chain[index], Counter())[chain[index - 1][1]] += 1
                if chain[index - 1][1]:
                    children.setdefault(chain[index - 1], set()).add(chain[index])
    expected = {}
    for key, (allocatable, node_used, unschedulable, free, unavailable) in totals.items():
        votes = parents.get(key)
        parent = min(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0] if votes else None
        expected[key] = DomainUsage(
            key[0],
            key[1],
            parent,
            members[key],
            allocatable,
            node_used,
            unschedulable,
            free,
            unavailable,
        )
    return expected, children


def assert_matches(
    tree: TopologyTree,
    expected: dict[tuple[str, str], DomainUsage],
    children: dict[tuple[str, str], set[tuple[str, str]]],
) -> None:
    for level in (*LEVELS, "ultraserver"):
        want = sorted(
            (u for (lvl, _), u in expected.items() if lvl == level), key=lambda u: u.domain
        )
        assert tree.domains(level) == want, level
        free = sum(u.free for u in want)
        best = min(want, key=lambda u: (-u.free, u.domain), default=None)
        if best is None or best.free == 0:
            assert tree.largest_free(level) is None
            assert tree.fragmentation(level) == LevelFragmentation(level, len(want), free, 0, "")
        else:
            assert tree.largest_free(level) == best
            assert tree.fragmentation(level) == LevelFragmentation(
                level, len(want), free, best.free, best.domain
            )
        for usage in want:
            below = {(c.level, c.domain) for c in tree.children(level, usage.domain)}
            assert below == children.get((level, usage.domain), set())
            assert len(tree.nodes_in(level, usage.domain)) == usage.nodes


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_agree_with_a_brute_force_recompute(seed: int) -> None:
    rng = random.Random(seed)
    tree = TopologyTree()
    nodes: dict[str, tuple[dict[str, str], int, bool, bool]] = {}
    used: Counter[str] = Counter()
    names = [f"node-{i}" for i in range(24)]
    before, seen = brute_force(nodes, used), tree.version
    for _ in range(300):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.35:
            entry = (
                random_labels(rng),
                rng.choice([0, 4, 8, 8]),
                rng.random() < 0.8,
                rng.random() < 0.8,  # available: no deep health check or EC2 event
            )
            if name in nodes and rng.random() < 0.5:  # same place, new capacity or state
                entry = (nodes[name][0], entry[1], entry[2], entry[3])
            nodes[name] = entry
            tree.set_node(name, *entry)
        elif roll < 0.45:
            nodes.pop(name, None)
            tree.remove_node(name)
        else:
            delta = rng.randint(-6, 6)
            used[name] = max(0, used[name] + delta)
            tree.add_used(name, delta)
        after = brute_force(nodes, +used)
        assert_matches(tree, *after)
        for name_ in names:
            assert tree.node_free(name_) == (
                after[0][("node", name_)].free if name_ in nodes else 0
            )
        if after != before:
            assert tree.version > seen  # callers caching derived views must see the change
        before, seen = after, tree.version
    assert len(tree) == len(nodes)
