"""The book's cheap paths answer as the full ones do: a pod bound anew, the GPU-second ledger's
transfer against two moves; and what the book counts for the surfaces (interruptions that
settled here, hardware incidents per node)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from exporter.cluster.elastic.idle import DemandCause
from exporter.cluster.goodput.attribution import SETTLE_S
from exporter.cluster.goodput.gpu_seconds import GpuSecondLedger
from exporter.sim import synthetic as syn
from exporter.store.sqlstore import open_store
from tests.cluster.goodput.harness import NS, T0, World, finding, xid79
from tests.cluster.goodput.test_interruptions import settle
from tests.cluster.goodput.test_restart import restored
from tests.crds import assert_valid_kueue

Slot = tuple[str, str]


@pytest.mark.parametrize(
    "allocatable",
    [(0, 4, 8), (64, 96, 128)],
    ids=["nodes over their allocatable", "nodes with room for their pods"],
)
def test_a_transfer_is_two_moves_and_a_read_changes_nothing(
    allocatable: tuple[int, ...],
) -> None:
    """`transfer` against `move` out and `move` in; one ledger read at random moments (a
    read settles what is pending), the other only at the end. Only nodes with room for their
    pods have idle GPUs to split by demand."""
    rng = random.Random(11)
    a, b = GpuSecondLedger(), GpuSecondLedger()
    now = T0 + 0.5
    pods: list[tuple[str, Slot, int]] = []
    slots: list[Slot] = [(t, c) for t in ("t1", "t2") for c in ("running", "restarting")]
    for _ in range(4000):
        if rng.random() < 0.3:
            now += rng.choice((0.001, 0.25, 2.0))
        node = f"n{rng.randrange(6)}"
        roll = rng.random()
        if roll < 0.02:
            for ledger in (a, b):
                ledger.remove_node(node, now)
        elif roll < 0.08:
            key, gpus = rng.randrange(4), rng.choice((4, 8, 16))
            cause: DemandCause = rng.choice(("claimable", "topology", "quota"))
            gone, flavor = rng.random() < 0.2, rng.choice("fg")  # drawn once: both alike
            for ledger in (a, b):
                if gone:
                    ledger.remove_demand(key, now)
                else:
                    ledger.set_demand(key, flavor, cause, gpus, now)
        elif roll < 0.2:
            state = (rng.choice("fg"), f"d{rng.randrange(2)}", rng.choice(allocatable))
            why = rng.choice(("", "", "cordoned", "finding"))
            for ledger in (a, b):
                ledger.set_node(node, *state, why, now)
        elif roll < 0.6 and pods:
            index = rng.randrange(len(pods))
            source, slot, gpus = pods[index]
            target = f"n{rng.randrange(6)}"
            a.transfer(source, target, slot, gpus, round(now * 1000))
            b.move(source, slot, None, gpus, now)
            b.move(target, None, slot, gpus, now)
            pods[index] = (target, slot, gpus)
        else:
            slot, gpus = rng.choice(slots), rng.choice((1, 4, 8))
            for ledger in (a, b):
                ledger.move(node, None, slot, gpus, now)
            pods.append((node, slot, gpus))
        if rng.random() < 0.1:
            a.totals(now)
    assert a.now_counts() == b.now_counts()
    assert a.totals(now + 5).as_dict() == b.totals(now + 5).as_dict()
    assert a.totals(now + 5).residual_ms() == 0


def test_pods_bound_anew_move_their_gpus_and_nothing_else() -> None:
    w = World()
    for name in ("a", "b", "c"):
        w.node(name)
    w.run_job("train", ["a", "b"], ready=False)  # restarting: its pods not Ready
    w.at(T0 + 60).pod("train-0", "c", "train", "train", ready=False)  # bound anew
    w.at(T0 + 120).pod("train-0", "a", "train", "train", ready=False)
    totals = w.book.gpu_seconds(T0 + 180)
    assert totals.residual_ms() == 0
    assert totals.seconds("restarting") == 16 * 180
    assert totals.seconds("idle") == 8 * 180 * 3 - 16 * 180
    good = w.book.job_goodput(NS, "train", T0 + 180)
    assert good is not None and good.phase == "restarting" and good.interruptions == 0
    # a Ready pod of a running job that goes elsewhere is an interruption, not a move
    w.at(T0 + 200).run_job("serve", ["c"])
    w.at(T0 + 300).pod("serve-0", "b", "serve", "serve")
    assert len(w.entries("serve")) == 1


def test_interruptions_total_counts_what_settled_here(tmp_path: Path) -> None:
    w = World()
    w.node("a")
    w.node("b")
    w.run_job("train", ["a"])
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("train-0")
    w.run_job("done", ["b"])
    finished = [{"type": "Finished", "status": "True", "reason": "Succeeded"}]
    w.at(T0 + 150).workload("done", 1, conditions=finished)
    w.delete_pod("done-0")
    assert w.book.interruptions_total == {}  # not settled yet
    w.book.tick(T0 + 150 + SETTLE_S)
    assert dict(w.book.interruptions_total) == {("node_fault", "gpu", "llm"): 1}
    # restored entries are the history store's: never counted by the new process
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}")
    w.at(T0 + 400).run_job("late", ["b"])
    w.delete_pod("late-0")
    store.write(w.book.dirty_rows(T0 + 401))
    again = restored(store)
    again.book.tick(T0 + 400 + 2 * SETTLE_S)
    assert [e.settled for e in again.entries("late")] == [True]
    assert again.book.interruptions_total == {}
    store.close()


def test_hardware_incidents_within_the_window() -> None:
    day = 86_400.0
    w = World()
    w.node("a")
    w.node("b")
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    late = finding("ecc_uncorrectable", "gpu1", T0 + 3 * day, "critical", "reboot")
    w.at(T0 + 3 * day).node("a", findings=[late])
    w.node("b", findings=[finding("xid_app_repeat", "gpu0", T0 + 3 * day, "critical", "none")])
    assert w.book.hardware_incidents(T0 + 3 * day) == {"a": 2}
    assert w.book.hardware_incidents(T0 + 9 * day) == {"a": 1}
    assert w.book.hardware_incidents(T0 + 20 * day) == {}


def test_a_nodes_place_follows_the_models_flavor_not_its_other_labels() -> None:
    """The book counts a node where the model places it: its ResourceFlavor (a flavor whose
    nodeLabels select it, created after the node was seen, takes its GPU-seconds from then on)
    and its layer-3 domain; a HyperPod health label that flips moves neither."""
    w = World()
    w.node("a")
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "p5-reserved", "resourceVersion": "1"},
        "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}},
    }
    assert_valid_kueue(flavor)
    w.at(T0 + 100).apply("ResourceFlavor", flavor)
    w.at(T0 + 150).node("a", health="UnschedulablePendingReboot")
    w.at(T0 + 200).node("a")
    capacity = w.book.gpu_seconds(T0 + 300).capacity
    assert capacity == {
        ("ml.p5.48xlarge", "nn-3a"): 8 * 100_000,  # before the flavor existed
        ("p5-reserved", "nn-3a"): 8 * 200_000,  # from then on, health flips or not
    }


def test_a_node_filled_and_made_unavailable_in_one_millisecond_has_no_idle_left() -> None:
    """A settle that moves a node's free GPUs to another category (here a finding) in the
    millisecond its pods fill it: its idle count leaves its flavor too, so the idle reasons
    still add up to the idle GPU-seconds (residual 0) and none are idle afterwards."""
    ledger = GpuSecondLedger()
    slot = ("t1", "running")
    ledger.set_node("n", "f", "d", 8, "", T0)
    ledger.move("n", None, slot, 4, T0)
    ledger.totals(T0 + 10)  # settled: 4 idle
    ledger.move("n", None, slot, 4, T0 + 20)
    ledger.set_node("n", "f", "d", 8, "finding", T0 + 20)
    totals = ledger.totals(T0 + 30)
    assert totals.residual_ms() == 0
    assert sum(totals.idle_reasons.values()) == 4 * 20_000  # idle only before T0 + 20
    assert ledger.now_counts() == {"running": 8}


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_a_checkpoint_written_to_an_otherwise_unchanged_workload_is_read(where: str) -> None:
    """The book skips a Workload rewrite that changes nothing it reads; a checkpoint time (the
    configured annotation, else label) is something it reads, whatever else stays."""
    key = "topowatch.io/last-checkpoint"
    w = World()
    w.node("a")
    obj = w.workload("ckpt", 1)
    w.pod("ckpt-0", "a", "ckpt", "ckpt")
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "900"}}
    obj["metadata"][where] = {**obj["metadata"].get(where, {}), key: syn.rfc3339(T0 - 600)}
    w.apply("Workload", obj)
    w.at(T0 + 100).delete_pod("ckpt-0")
    settle(w, T0 + 100 + SETTLE_S)
    (entry,) = w.entries("ckpt")
    assert entry.work_lost_gpu_seconds == 8 * 700


def test_a_node_event_that_changes_only_allocatable_gpus_reaches_the_ledger() -> None:
    """The book tells the ledger a node's state only when it moved: allocatable GPUs are part
    of it, though no fact of the node's health changed."""
    w = World()
    w.node("a")
    obj = w.nodes["a"]
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "900"}}
    obj["status"] = {**obj["status"], "allocatable": {**obj["status"]["allocatable"]}}
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    w.at(T0 + 100).apply("Node", obj)
    totals = w.book.gpu_seconds(T0 + 200)
    assert totals.residual_ms() == 0
    assert totals.seconds("idle") == 8 * 100 + 4 * 100
