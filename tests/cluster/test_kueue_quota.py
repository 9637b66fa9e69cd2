"""The quota model against Kueue's own rules: a table of small cohort forests and answers.

Every row is a few ClusterQueue and Cohort objects, validated against the real Kueue CRDs
(tests/crds.py) before they are parsed, the usage the model's workload accounting would pass
in, and the answers Kueue would give, with the rule each rests on (doc page, KEP, or the file
and function of kubernetes-sigs/kueue@ff69552e79ad). Where Kueue's docs or tests work an
example, the row reproduces it with their numbers. Rows that hold bad input say whether the
API server would have stored it at all (a quota of "abc" fails the CRD pattern and comes only
from a damaged dump; a negative lendingLimit passes the CRD and only the webhook refuses it).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cluster.capacity.quota import (
    BAD_QUANTITY,
    BAD_USAGE,
    COHORT_CYCLE,
    DUPLICATE_QUOTA,
    MALFORMED_QUOTA,
    NEGATIVE_QUANTITY,
    UNKNOWN_FLAVOR,
    UNKNOWN_QUEUE,
    QuotaTree,
)
from exporter.cluster.objects import ClusterQueue, Cohort, ResourceQuota
from exporter.cluster.parse.kueue import (
    parse_cluster_queue,
    parse_cohort,
    quota_amount,
    resource_quotas,
)
from tests.crds import kueue_validator

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kueue"
GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"
P5 = "ml.p5.48xlarge"
GB200 = "ml.p6e-gb200.36xlarge"
DEFAULT = "default-flavor"
GI = 2**30
Obj = dict[str, Any]
Usage = Mapping[str, Mapping[tuple[str, str], int]]


# --- objects as the API server stores them ---------------------------------------------------


def res(
    name: str,
    nominal: int | str,
    borrowing: int | str | None = None,
    lending: int | str | None = None,
) -> Obj:
    """One resources[] entry of a flavor's quota."""
    entry: Obj = {"name": name, "nominalQuota": nominal}
    if borrowing is not None:
        entry["borrowingLimit"] = borrowing
    if lending is not None:
        entry["lendingLimit"] = lending
    return entry


def groups(flavors: Mapping[str, Sequence[Obj]]) -> list[Obj]:
    """spec.resourceGroups: flavors covering the same resources share one group."""
    by_cover: dict[tuple[str, ...], list[Obj]] = {}
    for flavor, resources in flavors.items():
        cover = tuple(r["name"] for r in resources)
        by_cover.setdefault(cover, []).append({"name": flavor, "resources": list(resources)})
    return [{"coveredResources": list(cover), "flavors": fl} for cover, fl in by_cover.items()]


def cq(
    name: str,
    flavors: Mapping[str, Sequence[Obj]],
    cohort: str = "",
    version: str = "v1beta2",
    status: Obj | None = None,
) -> Obj:
    """A ClusterQueue; v1beta1 names its cohort spec.cohort, v1beta2 spec.cohortName."""
    spec: Obj = {"namespaceSelector": {}, "resourceGroups": groups(flavors)}
    if cohort:
        spec["cohortName" if version == "v1beta2" else "cohort"] = cohort
    obj: Obj = {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def cohort(
    name: str,
    flavors: Mapping[str, Sequence[Obj]] | None = None,
    parent: str = "",
    version: str = "v1beta2",
) -> Obj:
    """A Cohort object: its parent (spec.parentName) and the quota it adds to its tree."""
    spec: Obj = {}
    if parent:
        spec["parentName"] = parent
    if flavors:
        spec["resourceGroups"] = groups(flavors)
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "Cohort",
        "metadata": {"name": name},
        "spec": spec,
    }


def gpus(
    nominal: int | str, borrowing: int | str | None = None, lending: int | str | None = None
) -> list[Obj]:
    return [res(GPU, nominal, borrowing, lending)]


def cpus(
    nominal: int | str, borrowing: int | str | None = None, lending: int | str | None = None
) -> list[Obj]:
    return [res(CPU, nominal, borrowing, lending)]


def crd_problems(obj: Obj) -> list[str]:
    group_version = obj["apiVersion"].split("/", 1)[1]
    return kueue_validator(obj["kind"], group_version)(obj)


def parse_all(objects: Sequence[Obj]) -> tuple[list[ClusterQueue], list[Cohort]]:
    queues = [parse_cluster_queue(o, []) for o in objects if o["kind"] == "ClusterQueue"]
    cohorts = [parse_cohort(o, []) for o in objects if o["kind"] == "Cohort"]
    return queues, cohorts


# --- the table -----------------------------------------------------------------------------

# An expectation: (question, queue, flavor, resource, answer). The answer is an amount in
# Kueue's units (millicores for cpu), or "unknown:<cause>".
Expect = tuple[str, str, str, str, int | str]


@dataclass(frozen=True)
class Row:
    id: str
    rule: str  # the Kueue rule and where it is written
    objects: tuple[Obj, ...]
    usage: Usage
    expect: tuple[Expect, ...]
    flavors: tuple[str, ...] | None = None  # the ResourceFlavors that exist, when checked
    crd_invalid: frozenset[str] = field(default_factory=frozenset)  # names the CRD refuses
    causes: tuple[str, ...] = ()  # QuotaProblem causes the tree must record, in order


ROWS: tuple[Row, ...] = (
    # --- Kueue's worked examples ----------------------------------------------------------
    Row(
        "doc-borrowing-example",
        "cluster_queue.md 'Borrowing example': with team-b-cq idle, team-a-cq can admit"
        " 12+9=21 CPUs and 48+36=84Gi of memory",
        (
            cq("team-a-cq", {DEFAULT: [res(CPU, 9), res(MEMORY, "36Gi")]}, "team-ab"),
            cq("team-b-cq", {DEFAULT: [res(CPU, 12), res(MEMORY, "48Gi")]}, "team-ab"),
        ),
        {},
        (
            ("available", "team-a-cq", DEFAULT, CPU, 21_000),
            ("available", "team-a-cq", DEFAULT, MEMORY, 84 * GI),
            ("potential", "team-a-cq", DEFAULT, CPU, 21_000),
        ),
    ),
    Row(
        "doc-borrowing-limit",
        "cluster_queue.md 'BorrowingLimit': team-a-cq (9, borrowingLimit 1) can admit 9+1=10"
        " CPUs; team-b-cq, with no limit, up to 12+9",
        (
            cq("team-a-cq", {DEFAULT: cpus(9, borrowing=1)}, "team-ab"),
            cq("team-b-cq", {DEFAULT: cpus(12)}, "team-ab"),
        ),
        {},
        (
            ("available", "team-a-cq", DEFAULT, CPU, 10_000),
            ("potential", "team-a-cq", DEFAULT, CPU, 10_000),
            ("available", "team-b-cq", DEFAULT, CPU, 21_000),
        ),
    ),
    Row(
        "doc-lending-limit",
        "cluster_queue.md 'LendingLimit': team-b-cq (12, lendingLimit 1) using 11 or less,"
        " team-a-cq can admit 9+1=10 CPUs; team-a-cq lends all, so team-b-cq can use 9+12",
        (
            cq("team-a-cq", {DEFAULT: cpus(9)}, "team-ab"),
            cq("team-b-cq", {DEFAULT: cpus(12, lending=1)}, "team-ab"),
        ),
        {"team-b-cq": {(DEFAULT, CPU): 11_000}},
        (
            ("available", "team-a-cq", DEFAULT, CPU, 10_000),
            ("available", "team-b-cq", DEFAULT, CPU, 10_000),  # 21 in all, 11 in use
            ("potential", "team-b-cq", DEFAULT, CPU, 21_000),
            ("lent", "team-b-cq", DEFAULT, CPU, 0),
        ),
    ),
    Row(
        "doc-cohort-shared-pool",
        "cohort.md 'Configuring Quotas': a Cohort's nominalQuota is a shared pool; a"
        " ClusterQueue with nominalQuota 0 'may access the 12 shared CPUs defined by its Cohort'",
        (
            cohort("hello-cohort", {DEFAULT: cpus(12)}),
            cq("my-cluster-queue", {DEFAULT: cpus(0)}, "hello-cohort"),
        ),
        {},
        (
            ("available", "my-cluster-queue", DEFAULT, CPU, 12_000),
            ("borrowed", "my-cluster-queue", DEFAULT, CPU, 0),
        ),
    ),
    Row(
        "kep1224-two-queues",
        "keps/1224-lending-limit test plan: with cq-b's lendingLimit set, cq-a can borrow as"
        " much as cq-b's lendingLimit, or min(that, cq-a's borrowingLimit)",
        (
            cq("cq-a", {P5: gpus(8)}, "lend"),
            cq("cq-a-limited", {P5: gpus(8, borrowing=2)}, "lend-limited"),
            cq("cq-b", {P5: gpus(8, lending=4)}, "lend"),
            cq("cq-b2", {P5: gpus(8, lending=4)}, "lend-limited"),
        ),
        {},
        (
            ("available", "cq-a", P5, GPU, 8 + 4),
            ("available", "cq-a-limited", P5, GPU, 8 + 2),
        ),
    ),
    Row(
        "kep1224-three-queues",
        "keps/1224-lending-limit test plan: cq-b lendingLimit set, cq-c unset: cq-a borrows"
        " cq-b's lendingLimit + cq-c's nominalQuota; both set: the two lendingLimits; a"
        " borrowingLimit takes the min",
        (
            cq("cq-a", {P5: gpus(8)}, "one"),
            cq("cq-b", {P5: gpus(8, lending=4)}, "one"),
            cq("cq-c", {P5: gpus(8)}, "one"),
            cq("cq-a2", {P5: gpus(8, borrowing=6)}, "two"),
            cq("cq-b2", {P5: gpus(8, lending=4)}, "two"),
            cq("cq-c2", {P5: gpus(8)}, "two"),
            cq("cq-a3", {P5: gpus(8)}, "three"),
            cq("cq-b3", {P5: gpus(8, lending=4)}, "three"),
            cq("cq-c3", {P5: gpus(8, lending=2)}, "three"),
            cq("cq-a4", {P5: gpus(8, borrowing=3)}, "four"),
            cq("cq-b4", {P5: gpus(8, lending=4)}, "four"),
            cq("cq-c4", {P5: gpus(8, lending=2)}, "four"),
        ),
        {},
        (
            ("available", "cq-a", P5, GPU, 8 + 4 + 8),
            ("available", "cq-a2", P5, GPU, 8 + min(4 + 8, 6)),
            ("available", "cq-a3", P5, GPU, 8 + 4 + 2),
            ("available", "cq-a4", P5, GPU, 8 + min(4 + 2, 3)),
        ),
    ),
    Row(
        "kueue-snapshot-lending-limit",
        "pkg/cache/scheduler/snapshot_test.go TestSnapshotAddRemoveWorkloadWithLendingLimit"
        " 'still using quota over GuaranteedQuota': lend-a (10, lendingLimit 4) using 7,"
        " lend-b (10, lendingLimit 6) using 4; the cohort's Usage is 1 (7 - (10-4))",
        (
            cq("lend-a", {DEFAULT: cpus(10, lending=4)}, "lend"),
            cq("lend-b", {DEFAULT: cpus(10, lending=6)}, "lend"),
        ),
        {"lend-a": {(DEFAULT, CPU): 7_000}, "lend-b": {(DEFAULT, CPU): 4_000}},
        (
            # lend-a: 3 of its own + 6 lend-b lends; lend-b: 6 of its own + (4 - 1) lend-a lends
            ("available", "lend-a", DEFAULT, CPU, 9_000),
            ("available", "lend-b", DEFAULT, CPU, 9_000),
            ("potential", "lend-a", DEFAULT, CPU, 16_000),
        ),
    ),
    # --- what the issue found wrong ------------------------------------------------------------
    Row(
        "cohort-exhausted-by-others-borrowing",
        "resource_node.go available(): the root's SubtreeQuota - Usage holds everyone's"
        " borrowing. team-c borrows all of team-b's unused 32; the old headroom helper said 32",
        (
            cq("team-a", {P5: gpus(32)}, "ml"),
            cq("team-b", {P5: gpus(32)}, "ml"),
            cq("team-c", {P5: gpus(0)}, "ml"),
        ),
        {"team-a": {(P5, GPU): 32}, "team-c": {(P5, GPU): 32}},
        (
            ("available", "team-a", P5, GPU, 0),
            ("borrowed", "team-c", P5, GPU, 32),
            ("lent", "team-b", P5, GPU, 32),
            ("available", "team-b", P5, GPU, 0),
        ),
    ),
    Row(
        "queue-that-borrows-itself",
        "resource_node.go available(): a queue's own borrowing is in the cohort's Usage. team-a"
        " (32) uses 48; team-b's 32 less team-a's 16 leaves 16; the old helper said 32",
        (
            cq("team-a", {P5: gpus(32)}, "ml"),
            cq("team-b", {P5: gpus(32)}, "ml"),
        ),
        {"team-a": {(P5, GPU): 48}},
        (
            ("available", "team-a", P5, GPU, 16),
            ("borrowed", "team-a", P5, GPU, 16),
            ("lent", "team-b", P5, GPU, 16),
            ("available", "team-b", P5, GPU, 16),
        ),
    ),
    Row(
        "lending-limit-caps-what-a-queue-lends",
        "ClusterQueue CRD lendingLimit: 'ClusterQueue reserves for its exclusive use ..."
        " nominalQuota - lendingLimit' (localQuota, resource_node.go)",
        (
            cq("team-a", {P5: gpus(16)}, "ml"),
            cq("team-b", {P5: gpus(32, lending=8)}, "ml"),
        ),
        {"team-a": {(P5, GPU): 20}},
        (
            ("available", "team-a", P5, GPU, 4),  # 8 lendable, 4 already borrowed
            ("lent", "team-b", P5, GPU, 4),
            ("available", "team-b", P5, GPU, 28),  # 24 kept back + 4 still in the cohort
            ("potential", "team-a", P5, GPU, 24),
        ),
    ),
    Row(
        "borrowing-limit-caps-what-a-queue-borrows",
        "ClusterQueue CRD borrowingLimit: 'Workloads in a ClusterQueue can consume ..."
        " nominalQuota+borrowingLimit' (available(): storedInParent - usedInParent + limit)",
        (
            cq("team-a", {P5: gpus(16, borrowing=8)}, "ml"),
            cq("team-b", {P5: gpus(32)}, "ml"),
        ),
        {"team-a": {(P5, GPU): 20}},
        (
            ("available", "team-a", P5, GPU, 4),  # 28 free in the cohort, 16+8-20 allowed
            ("potential", "team-a", P5, GPU, 24),
            ("borrowed", "team-a", P5, GPU, 4),
            ("available", "team-b", P5, GPU, 28),
        ),
    ),
    Row(
        "hierarchical-cohort",
        "keps/79-hierarchical-cohorts: a Cohort's quota is shared with its subtree, its"
        " borrowingLimit bounds what the subtree borrows from the parent; accumulateFromChild"
        " (resource_node.go) passes quota and usage up",
        (
            cohort("org", {P5: gpus(16)}),
            cohort("research", {P5: gpus(8, borrowing=4)}, parent="org"),
            cq("research-a", {P5: gpus(8)}, "research"),
            cq("research-b", {P5: gpus(8)}, "research"),
            cq("production", {P5: gpus(16)}, "org"),
        ),
        {"research-a": {(P5, GPU): 8}, "research-b": {(P5, GPU): 12}},
        (
            # research: 24 of quota, 20 used: 4 left in the subtree, 4 more from org
            ("available", "research-a", P5, GPU, 8),
            ("available", "research-b", P5, GPU, 8),
            ("potential", "research-a", P5, GPU, 8 + 8 + 8 + 4),
            # production: its 16 + org's 16 + research's unused 4
            ("available", "production", P5, GPU, 36),
            ("borrowed", "research-b", P5, GPU, 4),
        ),
    ),
    Row(
        "hierarchical-cohort-story-1",
        "keps/79-hierarchical-cohorts Story 1: 'research org's top Cohort will simply set"
        " borrowingLimit to 0': production may borrow research's quota, not the other way",
        (
            cohort("company"),
            cohort("research", {P5: gpus(0, borrowing=0)}, parent="company"),
            cohort("production", {P5: gpus(0)}, parent="company"),
            cq("research-a", {P5: gpus(16)}, "research"),
            cq("serving", {P5: gpus(16)}, "production"),
        ),
        {"research-a": {(P5, GPU): 16}, "serving": {(P5, GPU): 4}},
        (
            ("available", "research-a", P5, GPU, 0),
            ("potential", "research-a", P5, GPU, 16),
            ("available", "serving", P5, GPU, 12),
            ("potential", "serving", P5, GPU, 32),
        ),
    ),
    Row(
        "hierarchical-lending-limit-on-a-cohort",
        "Cohort CRD: 'LendingLimit limits how much members of this Cohort subtree can lend to"
        " the parent subtree' (localQuota of a Cohort, resource_node.go)",
        (
            cohort("org"),
            cohort("research", {P5: gpus(0, lending=0)}, parent="org"),
            cq("research-a", {P5: gpus(16)}, "research"),
            cq("production", {P5: gpus(8)}, "org"),
        ),
        {"production": {(P5, GPU): 8}},
        (
            ("available", "production", P5, GPU, 0),
            ("available", "research-a", P5, GPU, 16 + 0),  # nothing spare in production
        ),
    ),
    Row(
        "cohort-parent-not-defined",
        "Cohort CRD parentName: 'References a non-existent Cohort. We use default Cohort (no"
        " borrowing/lending limits)'",
        (
            cohort("research", {P5: gpus(4)}, parent="nowhere"),
            cq("research-a", {P5: gpus(8)}, "research"),
            cq("stray", {P5: gpus(8)}, "nowhere"),
        ),
        {},
        (
            ("available", "research-a", P5, GPU, 8 + 4 + 8),
            ("available", "stray", P5, GPU, 8 + 4 + 8),
        ),
    ),
    Row(
        "two-flavors-separate-quotas",
        "cluster_queue.md 'Flavors and borrowing semantics': quota is per (flavor, resource);"
        " a queue borrows only in flavors it defines",
        (
            cq("team-a", {P5: gpus(16), GB200: gpus(8)}, "ml"),
            cq("team-b", {P5: gpus(16)}, "ml"),
        ),
        {"team-a": {(P5, GPU): 16}},
        (
            ("available", "team-a", P5, GPU, 16),
            ("available", "team-a", GB200, GPU, 8),
            ("available", "team-b", P5, GPU, 16),
        ),
    ),
    Row(
        "flavor-with-no-quota-in-the-queue",
        "cluster_queue.md: 'A ClusterQueue can only borrow quota for flavors that the"
        " ClusterQueue defines'; cohort.md: it 'must define nominal quota ... even if 0'",
        (
            cq("team-a", {P5: gpus(16), GB200: gpus(8)}, "ml"),
            cq("team-b", {P5: gpus(16)}, "ml"),
        ),
        {},
        (
            ("available", "team-b", GB200, GPU, 0),
            ("potential", "team-b", GB200, GPU, 0),
            ("available", "team-b", P5, CPU, 0),
        ),
    ),
    Row(
        "v1beta1-cohort-and-v1beta2-cohortName",
        "ClusterQueue CRD: v1beta1 spec.cohort, v1beta2 spec.cohortName name the same cohort;"
        " Cohort v1beta1 and v1beta2 both spell the parent spec.parentName",
        (
            cq("old", {P5: gpus(8)}, "mixed", version="v1beta1"),
            cq("new", {P5: gpus(8)}, "mixed", version="v1beta2"),
            cohort("mixed", {P5: gpus(4)}, parent="top", version="v1beta1"),
            cohort("top", {P5: gpus(2)}, version="v1beta1"),
        ),
        {"new": {(P5, GPU): 2}},
        (
            ("available", "old", P5, GPU, 8 + 8 + 4 + 2 - 2),
            ("available", "new", P5, GPU, 8 + 8 + 4 + 2 - 2),
        ),
    ),
    Row(
        "no-cohort",
        "cluster_queue.md 'Cohort': with no cohort a ClusterQueue 'cannot borrow quota from"
        " any other ClusterQueue'; cache.go getUsage: borrowed is 0 without a cohort",
        (
            cq("alone", {P5: gpus(16)}),
            cq("neighbour", {P5: gpus(16)}),
        ),
        {"alone": {(P5, GPU): 4}},
        (
            ("available", "alone", P5, GPU, 12),
            ("borrowed", "alone", P5, GPU, 0),
            ("lent", "neighbour", P5, GPU, 0),
        ),
    ),
    Row(
        "over-admitted",
        "resource_node.go available() 'may return a negative number in the case of"
        " overadmission - e.g. capacity was removed'; ClusterQueueSnapshot.Available clamps at 0",
        (cq("shrunk", {P5: gpus(8)}),),
        {"shrunk": {(P5, GPU): 12}},
        (("available", "shrunk", P5, GPU, 0),),
    ),
    # --- bad input: the affected answers are unknown, the rest stay exact ----------------------
    Row(
        "flavor-that-does-not-exist",
        "clusterqueue.go updateQueueStatus/inactiveReason: a ClusterQueue referencing a missing"
        " ResourceFlavor is inactive (FlavorNotFound); its quota still counts in the cohort",
        (
            cq("typo", {"ml.p5.48xlarg": gpus(8)}, "ml"),
            cq("same-typo", {"ml.p5.48xlarg": gpus(8)}, "ml"),
        ),
        {},
        (
            ("available", "typo", "ml.p5.48xlarg", GPU, f"unknown:{UNKNOWN_FLAVOR}"),
            ("available", "typo", P5, GPU, f"unknown:{UNKNOWN_FLAVOR}"),
            ("borrowed", "typo", "ml.p5.48xlarg", GPU, 0),  # its own quota and usage only
        ),
        flavors=(P5,),
        causes=(UNKNOWN_FLAVOR, UNKNOWN_FLAVOR),
    ),
    Row(
        "flavor-that-does-not-exist-neighbour",
        "as above: the inactive queue's quota is still in the cohort's SubtreeQuota",
        (
            cq("typo", {GB200: gpus(8), P5: gpus(8)}, "ml"),
            cq("fine", {P5: gpus(8)}, "ml"),
        ),
        {},
        (
            ("available", "typo", P5, GPU, f"unknown:{UNKNOWN_FLAVOR}"),
            ("available", "fine", P5, GPU, 16),
        ),
        flavors=(P5,),
        causes=(UNKNOWN_FLAVOR,),
    ),
    Row(
        "cohort-cycle",
        "Cohort CRD parentName: 'If a cycle is created, we disable all members of the Cohort,"
        " including ClusterQueues'; hierarchy/cycle.go HasCycle, snapshot.go 'HasCycle'",
        (
            cohort("left", parent="right"),
            cohort("right", parent="left"),
            cohort("below", parent="left"),
            cq("in-cycle", {P5: gpus(8)}, "left"),
            cq("under-cycle", {P5: gpus(8)}, "below"),
            cq("elsewhere", {P5: gpus(8)}, "fine"),
        ),
        {},
        (
            ("available", "in-cycle", P5, GPU, f"unknown:{COHORT_CYCLE}"),
            ("available", "under-cycle", P5, GPU, f"unknown:{COHORT_CYCLE}"),
            ("lent", "under-cycle", P5, GPU, f"unknown:{COHORT_CYCLE}"),
            ("borrowed", "under-cycle", P5, GPU, 0),
            ("available", "elsewhere", P5, GPU, 8),
        ),
        causes=(COHORT_CYCLE,),
    ),
    Row(
        "quota-abc",
        "ClusterQueue CRD nominalQuota pattern (a Quantity): 'abc' is refused by the API"
        " server, so it comes only from a damaged dump; every answer resting on it is unknown",
        (
            cq("broken", {P5: [res(GPU, "abc")], GB200: [res(GPU, 8)]}, "ml"),
            cq("mate", {P5: gpus(8), GB200: gpus(8)}, "ml"),
            cq("apart", {P5: gpus(8)}, "other"),
        ),
        {},
        (
            ("available", "broken", P5, GPU, f"unknown:{BAD_QUANTITY}"),
            ("borrowed", "broken", P5, GPU, f"unknown:{BAD_QUANTITY}"),
            ("available", "mate", P5, GPU, f"unknown:{BAD_QUANTITY}"),
            ("available", "broken", GB200, GPU, 16),
            ("available", "mate", GB200, GPU, 16),
            ("available", "apart", P5, GPU, 8),
        ),
        crd_invalid=frozenset({"broken"}),
        causes=(BAD_QUANTITY,),
    ),
    Row(
        "negative-lending-limit",
        "pkg/webhooks clusterqueue_webhook.go validateResourceQuantity refuses negatives (the"
        " CRD pattern allows '-4'); keps/1224: 'No new workloads can be admitted when the"
        " LendingLimit ... less than 0'",
        (
            cq("negative", {P5: gpus(8, lending="-4")}, "ml"),
            cq("mate", {P5: gpus(8)}, "ml"),
        ),
        {},
        (
            ("available", "negative", P5, GPU, f"unknown:{NEGATIVE_QUANTITY}"),
            ("available", "mate", P5, GPU, f"unknown:{NEGATIVE_QUANTITY}"),
            ("borrowed", "mate", P5, GPU, 0),
        ),
        causes=(NEGATIVE_QUANTITY,),
    ),
    Row(
        "negative-usage",
        "usage is the model's own accounting; a negative amount is a bug upstream, not quota",
        (cq("team-a", {P5: gpus(8)}, "ml"), cq("team-b", {P5: gpus(8)}, "ml")),
        {"team-a": {(P5, GPU): -3}},
        (
            ("available", "team-a", P5, GPU, f"unknown:{BAD_USAGE}"),
            ("available", "team-b", P5, GPU, f"unknown:{BAD_USAGE}"),
        ),
        causes=(BAD_USAGE,),
    ),
    Row(
        "unknown-queue",
        "a question about a ClusterQueue the model has not seen has no answer",
        (cq("team-a", {P5: gpus(8)}),),
        {"gone": {(P5, GPU): 8}},
        (("available", "gone", P5, GPU, f"unknown:{UNKNOWN_QUEUE}"),),
        causes=(UNKNOWN_QUEUE,),
    ),
)


def _ask(tree: QuotaTree, question: str, queue: str, flavor: str, resource: str) -> int | str:
    answer = getattr(tree, question)(queue, flavor, resource)
    assert answer.reason, answer
    if answer.amount is None:
        assert answer.reason.startswith("unknown: "), answer
        return f"unknown:{answer.cause}"
    return int(answer.amount)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_quota_answers_follow_kueue(row: Row) -> None:
    for obj in row.objects:
        problems = crd_problems(obj)
        name = obj["metadata"]["name"]
        if name in row.crd_invalid:
            assert problems, f"{name}: the CRD was expected to refuse this object"
        else:
            assert problems == [], f"{name} is not a valid {obj['kind']}: {problems}"
    queues, cohorts = parse_all(row.objects)
    tree = QuotaTree.build(queues, cohorts, row.usage, flavors=row.flavors)
    got = [(q, qu, f, r, _ask(tree, q, qu, f, r)) for q, qu, f, r, _ in row.expect]
    assert got == list(row.expect), row.rule
    assert [p.cause for p in tree.problems] == list(row.causes), tree.problems


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_answers_do_not_depend_on_the_order_objects_arrive(row: Row) -> None:
    """Informers deliver in any order; the answer is a function of the set of objects."""
    queues, cohorts = parse_all(row.objects)
    want = QuotaTree.build(queues, cohorts, row.usage, flavors=row.flavors)
    shuffle = random.Random(row.id)
    orders = list(itertools.islice(itertools.permutations(range(len(queues))), 24))
    for order in orders:
        reordered = [queues[i] for i in order]
        mixed = list(cohorts)
        shuffle.shuffle(mixed)
        tree = QuotaTree.build(reordered, mixed, row.usage, flavors=row.flavors)
        for question, queue, flavor, resource, _ in row.expect:
            got = getattr(tree, question)(queue, flavor, resource)
            assert got == getattr(want, question)(queue, flavor, resource)
        assert sorted(map(str, tree.problems)) == sorted(map(str, want.problems))


# --- reasons people read ---------------------------------------------------------------------


def _tree(objects: Sequence[Obj], usage: Usage) -> QuotaTree:
    queues, cohorts = parse_all(objects)
    return QuotaTree.build(queues, cohorts, usage)


def test_the_reason_says_where_the_amount_comes_from() -> None:
    tree = _tree(
        (cq("team-a", {P5: gpus(32)}, "ml"), cq("team-b", {P5: gpus(32)}, "ml")),
        {"team-a": {(P5, GPU): 48}},
    )
    answer = tree.available("team-a", P5, GPU)
    assert str(answer) == (
        f"16 {GPU} in {P5}: 0 of its own unused nominal quota (32 nominal, 48 in use);"
        " 16 more from cohort tree 'ml'; it already borrows 16"
    )
    assert str(tree.available("team-b", P5, GPU)) == (
        f"16 {GPU} in {P5}: 16 of its own unused nominal quota (32 nominal, 0 in use);"
        " 0 more from cohort tree 'ml'; others use 16 of its unused quota"
    )


def test_the_reason_names_the_borrowing_limit_that_binds() -> None:
    tree = _tree(
        (
            cohort("org"),
            cohort("research", {P5: gpus(0, borrowing=2)}, parent="org"),
            cq("research-a", {P5: gpus(4)}, "research"),
            cq("production", {P5: gpus(16)}, "org"),
        ),
        {},
    )
    assert str(tree.available("research-a", P5, GPU)) == (
        f"6 {GPU} in {P5}: 4 of its own unused nominal quota (4 nominal, 0 in use);"
        " 2 more from cohort tree 'org'; capped by the borrowingLimit 2 of Cohort 'research'"
    )
    assert tree.cohort_path("research-a") == ("research", "org")


def test_cpu_amounts_read_as_cores() -> None:
    tree = _tree((cq("cpu-queue", {DEFAULT: cpus("1500m")}),), {})
    assert str(tree.available("cpu-queue", DEFAULT, CPU)).startswith("1500m cpu in")
    tree = _tree((cq("cpu-queue", {DEFAULT: cpus(2)}),), {})
    assert str(tree.available("cpu-queue", DEFAULT, CPU)).startswith("2 cpu in")


def test_unknown_answers_name_the_problem_and_the_problem_names_the_cause() -> None:
    tree = _tree(
        (cohort("loop", parent="loop"), cq("stuck", {P5: gpus(8)}, "loop")),
        {},
    )
    answer = tree.available("stuck", P5, GPU)
    assert answer.amount is None and not answer.known
    assert answer.reason == (
        "unknown: Cohort 'loop': cohort cycle loop -> loop; Kueue admits nothing in this tree"
        " until it is removed"
    )
    assert [p.cause for p in tree.problems_of("stuck")] == [COHORT_CYCLE]
    line = tree.line("stuck", P5, GPU)
    assert (line.available.cause, line.potential.cause, line.lent.cause) == (COHORT_CYCLE,) * 3
    assert tree.cohort_path("stuck") == ("loop",)


def test_line_gathers_one_pair() -> None:
    tree = _tree(
        (cq("team-a", {P5: gpus(16, borrowing=8)}, "ml"), cq("team-b", {P5: gpus(32)}, "ml")),
        {"team-a": {(P5, GPU): 20}},
    )
    line = tree.line("team-a", P5, GPU)
    assert line.quota == ResourceQuota(P5, GPU, 16, 8, None)
    assert (line.usage, line.usage_source) == (20, "workloads")
    assert (line.borrowed.amount, line.lent.amount) == (4, 0)
    assert (line.available.amount, line.potential.amount) == (4, 24)
    assert tree.queues() == ("team-a", "team-b")
    assert tree.quotas("team-a") == ((P5, GPU),)


# --- usage: the model's accounting, the status only as a fallback ------------------------------


def _with_reservation(name: str, cohort_name: str, nominal: int, reserved: int) -> Obj:
    status = {
        "flavorsReservation": [{"name": P5, "resources": [{"name": GPU, "total": reserved}]}],
        "flavorsUsage": [{"name": P5, "resources": [{"name": GPU, "total": 0}]}],
    }
    return cq(name, {P5: gpus(nominal)}, cohort_name, status=status)


def test_usage_comes_from_the_caller_and_status_only_when_asked() -> None:
    """Kueue's quota is held from reservation on (clusterqueue.go updateWorkloadUsage), which
    status.flavorsReservation reports; flavorsUsage counts admitted workloads only."""
    objects = (_with_reservation("team-a", "ml", 32, 24), _with_reservation("team-b", "ml", 32, 0))
    for obj in objects:
        assert crd_problems(obj) == []
    queues, cohorts = parse_all(objects)
    assert queues[0].reservation == ((P5, GPU, 24),)
    by_workloads = QuotaTree.build(queues, cohorts, {"team-a": {(P5, GPU): 8}})
    assert by_workloads.available("team-b", P5, GPU).amount == 56
    assert by_workloads.line("team-b", P5, GPU).usage_source == "none"
    quota_only = QuotaTree.build(queues, cohorts)
    assert quota_only.available("team-b", P5, GPU).amount == 64
    from_status = QuotaTree.build(queues, cohorts, status_fallback=True)
    assert from_status.available("team-b", P5, GPU).amount == 40
    mixed = QuotaTree.build(queues, cohorts, {"team-b": {}}, status_fallback=True)
    assert mixed.available("team-b", P5, GPU).amount == 40
    assert mixed.line("team-a", P5, GPU).usage_source == "status"
    assert mixed.line("team-b", P5, GPU).usage_source == "workloads"


def test_usage_in_a_flavor_the_queue_no_longer_has_still_counts() -> None:
    """addUsage (resource_node.go) adds any assigned (flavor, resource); with no localQuota it
    all lands in the cohort, as after a quota was removed with workloads still admitted."""
    tree = _tree(
        (cq("team-a", {P5: gpus(8)}, "ml"), cq("team-b", {P5: gpus(8)}, "ml")),
        {"team-a": {(GB200, GPU): 4, (P5, GPU): 2}},
    )
    assert tree.available("team-b", P5, GPU).amount == 14
    assert tree.available("team-a", GB200, GPU).amount == 0


# --- more bad input --------------------------------------------------------------------------


def test_a_duplicate_quota_counts_the_last_one_as_kueue_does() -> None:
    queue = ClusterQueue(
        "dup",
        "",
        (),
        0,
        0,
        0,
        0,
        0,
        (),
        quotas=(ResourceQuota(P5, GPU, 8, None, None), ResourceQuota(P5, GPU, 4, None, None)),
    )
    tree = QuotaTree.build([queue])
    assert tree.available("dup", P5, GPU).amount == 4
    assert [p.cause for p in tree.problems] == [DUPLICATE_QUOTA]


def test_unreadable_resource_groups_make_the_whole_tree_unknown() -> None:
    obj = cq("mangled", {P5: gpus(8)}, "ml")
    obj["spec"]["resourceGroups"][0]["flavors"] = {P5: 8}
    assert crd_problems(obj)
    queues, cohorts = parse_all((obj, cq("mate", {P5: gpus(8)}, "ml"), cq("apart", {P5: gpus(8)})))
    tree = QuotaTree.build(queues, cohorts)
    assert tree.available("mangled", P5, GPU).cause == MALFORMED_QUOTA
    assert tree.available("mate", P5, GPU).cause == MALFORMED_QUOTA
    assert tree.available("apart", P5, GPU).amount == 8


def test_bad_usage_keys_and_values_never_raise() -> None:
    queues, cohorts = parse_all((cq("team-a", {P5: gpus(8)}, "ml"),))
    junk: Any = {"team-a": {"p5": 3, (P5, GPU): "8"}}
    tree = QuotaTree.build(queues, cohorts, junk)
    assert tree.available("team-a", P5, GPU).cause == BAD_USAGE
    assert {p.cause for p in tree.problems} == {BAD_USAGE}


def test_junk_objects_never_raise() -> None:
    """Every field of a valid ClusterQueue and Cohort replaced by junk: parsing and the tree
    answer, they do not raise."""
    base = (
        cohort("org", {P5: gpus(8, lending=2)}, parent="top"),
        cq("team-a", {P5: gpus(8, 2, 2)}, "org"),
    )
    junk_values: tuple[Any, ...] = (None, "abc", -1, [], {}, True, "1e999", 1.5, "-0.5")
    paths = (
        ("spec",),
        ("spec", "resourceGroups"),
        ("spec", "resourceGroups", 0),
        ("spec", "resourceGroups", 0, "flavors", 0, "name"),
        ("spec", "resourceGroups", 0, "flavors", 0, "resources"),
        ("spec", "resourceGroups", 0, "flavors", 0, "resources", 0, "name"),
        ("spec", "resourceGroups", 0, "flavors", 0, "resources", 0, "nominalQuota"),
        ("spec", "resourceGroups", 0, "flavors", 0, "resources", 0, "borrowingLimit"),
        ("spec", "resourceGroups", 0, "flavors", 0, "resources", 0, "lendingLimit"),
        ("metadata", "name"),
    )
    for which, path, value in itertools.product(range(2), paths, junk_values):
        objects = [yaml.safe_load(yaml.safe_dump(o)) for o in base]
        target: Any = objects[which]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        queues, cohorts = parse_all(objects)
        tree = QuotaTree.build(queues, cohorts, {"team-a": {(P5, GPU): 1}}, flavors=(P5,))
        for question in ("available", "potential", "borrowed", "lent"):
            answer = getattr(tree, question)("team-a", P5, GPU)
            assert answer.known or answer.reason.startswith("unknown: "), (path, value)


# --- the parsers' side ---------------------------------------------------------------------


def test_every_quota_of_a_cluster_queue_in_kueue_units() -> None:
    with (FIXTURES / "clusterqueue-v1beta2.yaml").open() as handle:
        queue = parse_cluster_queue(yaml.safe_load(handle))
    assert queue.quotas == (
        ResourceQuota(P5, CPU, 1_472_000, None, None),
        ResourceQuota(P5, MEMORY, 15104 * 2**30, None, None),
        ResourceQuota(P5, GPU, 64, 32, 16),
        ResourceQuota(P5, "vpc.amazonaws.com/efa", 256, None, None),
    )
    assert queue.quota_problems == ()
    assert queue.reservation == ((P5, CPU, 1_800_000), (P5, GPU, 80))


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_a_cohort_of_either_version(version: str) -> None:
    obj = cohort("research", {P5: gpus(8, 4, 2)}, parent="org", version=version)
    obj["spec"]["fairSharing"] = {"weight": "0.75"}
    assert crd_problems(obj) == []
    problems: list[str] = []
    parsed = parse_cohort(obj, problems)
    assert parsed == Cohort("research", "org", (ResourceQuota(P5, GPU, 8, 4, 2),), (), 0.75)
    assert problems == []
    assert parse_cohort(cohort("root")) == Cohort("root", "")


def test_a_bad_cohort_quota_is_kept_with_its_cause() -> None:
    obj = cohort("research", {P5: gpus("abc", lending="-1")}, parent="org")
    problems: list[str] = []
    parsed = parse_cohort(obj, problems)
    (quota,) = parsed.quotas
    assert quota.cause == BAD_QUANTITY
    assert "nominalQuota: 'abc' is not a Kubernetes quantity" in quota.problem
    assert "lendingLimit: '-1' is negative" in quota.problem
    assert problems == [quota.problem]
    assert parse_cohort({"spec": []}, []) == Cohort("", "")


def test_resource_quotas_says_what_it_could_not_read() -> None:
    spec = {
        "resourceGroups": [
            {"flavors": [{"resources": [res(GPU, 8)]}, {"name": P5, "resources": [{"x": 1}]}]},
            "junk",
        ]
    }
    quotas, problems = resource_quotas(spec)
    assert quotas == ()
    assert problems == (
        "spec.resourceGroups[0].flavors[0].name missing",
        "spec.resourceGroups[0].flavors[1].resources[0].name missing",
        "spec.resourceGroups[1]: expected an object, got string",
    )


@pytest.mark.parametrize(
    ("resource", "value", "amount"),
    [
        (GPU, 8, 8),
        (GPU, "8", 8),
        (CPU, 8, 8000),
        (CPU, "0.1", 100),  # exact: a float would make it 101
        (CPU, "100m", 100),
        (CPU, "1.0001", 1001),  # Quantity.MilliValue rounds up
        (MEMORY, "36Gi", 36 * GI),
        (MEMORY, "1.5k", 1500),
        (MEMORY, "2e3", 2000),
        (MEMORY, "1E3", 1000),
        (MEMORY, "1E", 10**18),
        (GPU, "0.5", 1),  # Quantity.Value rounds up
        (GPU, "-4", -4),
        (GPU, "+4", 4),
    ],
)
def test_quota_amount_counts_as_kueue_does(resource: str, value: object, amount: int) -> None:
    assert quota_amount(resource, value) == amount


@pytest.mark.parametrize(
    "value", ["abc", "", "1e99", "1e-99", "8 GPUs", None, True, [], float("nan")]
)
def test_quota_amount_refuses_what_is_not_a_quantity(value: object) -> None:
    with pytest.raises(ValueError):
        quota_amount(GPU, value)
