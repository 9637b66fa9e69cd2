"""Quota advice on simulated clusters whose right answer is known: a team starved by
fragmentation, one over-provisioned, one that borrows every day, one whose jobs cannot be placed
at the level they require, and teams competing for a flavor by fair-share weight. Every Kueue
object is validated against the CRDs before the model sees it; the history is fed one sample
every 10 minutes over a simulated day."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exporter.cluster.model import ClusterModel
from exporter.cluster.quota.advisor import (
    DEMAND_ABOVE_NOMINAL,
    IDLE_QUOTA_NOT_LENT,
    NOMINAL_IDLE,
    OVER_CAPACITY,
    PERSISTENT_BORROWING,
    TOPOLOGY_WAIT_PREFERRED_FITS,
    UNPLACEABLE_AT_LEVEL,
    AdvisorConfig,
    Recommendation,
    advise,
    fair_share_weights,
    fair_split,
    flavor_capacity,
    parse_quantity,
)
from exporter.cluster.quota.history import QuotaHistory
from exporter.cluster.quota.views import quota_families, recommendations_view
from exporter.core.exposition import encode_text
from exporter.sim import synthetic as s
from tests.conftest import promtool_lint
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
STEP = 600.0
DAY = 86_400.0
L3 = "topology.k8s.aws/network-node-layer-3"


def cq_name(team: str) -> str:
    return f"hyperpod-ns-{team}-clusterqueue"


class Sim:
    """A model fed the way the informers feed it, with fresh resourceVersions per update."""

    def __init__(self, domains: int, nodes_per_domain: int = 4, gpus: int = 8) -> None:
        self.model = ClusterModel()
        self.rv = 1
        self.raw: dict[str, dict[str, Any]] = {}
        self.nodes: dict[int, list[str]] = {}
        for d in range(domains):
            for i in range(nodes_per_domain):
                name = f"node-{d}-{i}"
                self.nodes.setdefault(d, []).append(name)
                layers = ("nn-l1", f"nn-l2-{d // 2}", f"nn-l3-{d}")
                self.put("Node", s.node(name, layers, gpus), T0)

    def put(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if obj.get("apiVersion", "").startswith("kueue.x-k8s.io/"):
            assert_valid_kueue(obj)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.model.apply(kind, "MODIFIED", obj, now)

    def queue(self, team: str, nominal: int, now: float = T0, **kwargs: Any) -> None:
        weight = kwargs.pop("weight", None)
        obj = s.cluster_queue(cq_name(team), nominal, **kwargs)
        if weight is not None:
            obj["spec"]["fairSharing"] = {"weight": weight}
        self.raw[team] = obj
        self.put("ClusterQueue", obj, now)
        self.put("LocalQueue", s.local_queue(f"hyperpod-ns-{team}", cq_name(team)), now)

    def raw_queue(self, team: str) -> dict[str, Any]:
        return self.raw[team]

    def running(
        self, team: str, name: str, nodes: list[str], topology: tuple[str, str] | None = None
    ) -> None:
        ns = f"hyperpod-ns-{team}"
        wl = s.workload(
            ns,
            name,
            len(nodes),
            8,
            T0,
            topology=topology,
            conditions=s.admitted_conditions(cq_name(team), T0 + 1),
            cluster_queue=cq_name(team),
            assignment=[((n,), 1) for n in nodes],
        )
        self.put("Workload", wl, T0)
        job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
        for i, node in enumerate(nodes):
            self.put("Pod", s.pod(ns, f"{name}-{i}", node, 8, job_uid, name, workload=name), T0)

    def pending(self, team: str, name: str, pods: int, topology: tuple[str, str] | None) -> None:
        message = (
            "couldn't assign flavors to pod set main: topology \"default\" doesn't allow to fit "
            f"any of {pods} pod(s)"
            if topology
            else s.quota_message(pods * 8)
        )
        wl = s.workload(
            f"hyperpod-ns-{team}",
            name,
            pods,
            8,
            T0,
            topology=topology,
            conditions=[s.condition("QuotaReserved", "False", "Pending", message, T0)],
        )
        self.put("Workload", wl, T0)

    def day(self, history: QuotaHistory, each: Callable[[int, float], None] | None = None) -> float:
        """A day of samples; `each(i, now)` changes the cluster before sample i."""
        now = T0
        for i in range(int(DAY // STEP)):
            now = T0 + i * STEP
            if each is not None:
                each(i, now)
            history.sample(self.model, now)
        return now


def new_history() -> QuotaHistory:
    return QuotaHistory(window_s=2 * DAY, bucket_s=3600.0, max_step_s=STEP, first_step_s=STEP)


def by_kind(recs: list[Recommendation], team: str) -> dict[str, Recommendation]:
    found = [r for r in recs if r.cluster_queue == cq_name(team)]
    kinds = {r.kind: r for r in found}
    assert len(kinds) == len(found), "at most one recommendation per (queue, kind)"
    return kinds


# --- (a) starved by fragmentation ------------------------------------------------------------


def test_fragmentation_starved_team_gets_topology_advice_not_more_quota() -> None:
    sim = Sim(domains=4)  # 4 layer-3 domains of 32 GPUs
    sim.queue("frag", 64)
    sim.queue("other", 64, used=64)
    for d in range(4):  # the other team holds half of every domain: 16 free in each
        sim.running("other", f"spread-{d}", sim.nodes[d][:2])
    sim.pending("frag", "needs-a-domain", 4, ("required", L3))  # 32 GPUs in one domain
    history = new_history()
    now = sim.day(history)

    recs = by_kind(advise(sim.model, history, now), "frag")
    assert set(recs) == {"topology_mode"}, recs  # no "more quota", no "less quota"
    rec = recs["topology_mode"]
    assert rec.reason == TOPOLOGY_WAIT_PREFERRED_FITS
    assert rec.current == 32 and rec.recommended == 0 and rec.level == "network-node-layer-3"
    assert rec.evidence["avg_pending_quota_gpus"] == 0
    assert rec.evidence["pending_topology_gpu_hours"] == pytest.approx(32 * DAY / 3600, rel=0.01)
    assert "quota is not the limit" in rec.detail
    assert by_kind(advise(sim.model, history, now), "other") == {}


# --- (b) over-provisioned --------------------------------------------------------------------


def test_over_provisioned_team_is_told_to_shrink_and_lend() -> None:
    sim = Sim(domains=4)
    sim.queue("idle", 64, lending_limit=0)
    sim.queue("busy", 64, used=64)
    sim.running("idle", "small", sim.nodes[0][:1])

    def wobble(i: int, now: float) -> None:  # 8 GPUs most of the day, nothing at night
        sim.queue("idle", 64, now, lending_limit=0, used=8 if i % 6 else 0)

    history = new_history()
    now = sim.day(history, wobble)
    recs = by_kind(advise(sim.model, history, now), "idle")
    nominal = recs["nominal"]
    assert (nominal.current, nominal.recommended, nominal.reason) == (64, 16, NOMINAL_IDLE)
    assert nominal.flavor == "ml.p5.48xlarge"
    assert nominal.evidence["busiest_hour_used_gpus"] <= 8
    lending = recs["lending_limit"]
    assert (lending.current, lending.recommended, lending.reason) == (0, 8, IDLE_QUOTA_NOT_LENT)
    assert "borrowing_limit" not in recs and "topology_mode" not in recs


# --- (c) borrows every day -------------------------------------------------------------------


def test_team_that_borrows_every_day_gets_more_quota_and_a_borrowing_limit() -> None:
    sim = Sim(domains=4)
    sim.queue("lender", 64, used=16)
    sim.queue("borrower", 16)

    def borrow(i: int, now: float) -> None:  # borrowing 16 GPUs in 9 of every 10 samples
        borrowing = i % 10 != 0
        sim.queue("borrower", 16, now, used=32 if borrowing else 16, borrowed=16 * borrowing)

    history = new_history()
    now = sim.day(history, borrow)
    recs = by_kind(advise(sim.model, history, now), "borrower")
    nominal = recs["nominal"]
    assert (nominal.current, nominal.recommended, nominal.reason) == (16, 32, DEMAND_ABOVE_NOMINAL)
    limit = recs["borrowing_limit"]
    assert limit.reason == PERSISTENT_BORROWING and limit.current is None
    assert limit.recommended == 8  # a granule of burst above the new nominal
    assert limit.evidence["borrowing_fraction"] == pytest.approx(0.9, abs=0.02)
    assert "borrowed in 90% of the time" in limit.detail
    lender = by_kind(advise(sim.model, history, now), "lender")
    assert lender["nominal"].recommended < 64  # idles 48 GPUs: the quota moves, not just lent


# --- (d) unplaceable at the required level ---------------------------------------------------


@pytest.mark.parametrize("nominal", [64, 32], ids=["waits-on-topology", "waits-on-quota"])
def test_quota_that_cannot_be_placed_at_the_required_level_is_flagged(nominal: int) -> None:
    """With 32 GPUs of quota Kueue says the 48-GPU job waits on quota; more quota would still
    never place it, so the advice is about topology either way."""
    sim = Sim(domains=4)  # layer-3 domains of 32 GPUs; layer-2 domains of 64
    sim.queue("wide", nominal)
    sim.pending("wide", "needs-48", 6, ("required", L3))
    history = new_history()
    now = sim.day(history)
    recs = by_kind(advise(sim.model, history, now), "wide")
    assert set(recs) == {"topology_fit"}, recs  # no quota change would help
    rec = recs["topology_fit"]
    assert (rec.current, rec.recommended, rec.reason) == (48, 32, UNPLACEABLE_AT_LEVEL)
    assert "require network-node-layer-2 instead" in rec.detail


def test_jobs_that_fit_their_level_are_not_flagged() -> None:
    sim = Sim(domains=4)
    sim.queue("fits", 64, used=32)
    sim.running("fits", "in-one-domain", sim.nodes[1], topology=("required", L3))
    history = new_history()
    now = sim.day(history)
    recs = by_kind(advise(sim.model, history, now), "fits")
    assert not {"topology_fit", "topology_mode"} & set(recs)


def test_whole_pods_per_node_decide_whether_a_domain_can_hold_a_job() -> None:
    """Each layer-3 domain has 16 GPUs on 4 nodes of 4: the 16 GPUs of a 2 x 8-GPU job, but not
    one of its pods. Kueue places whole pods on nodes, so no domain at any level can ever hold
    it, and a preferred request would not have started it either."""
    sim = Sim(domains=2, nodes_per_domain=4, gpus=4)
    sim.queue("narrow", 32)
    sim.pending("narrow", "two-by-eight", 2, ("required", L3))
    history = new_history()
    now = sim.day(history)
    recs = by_kind(advise(sim.model, history, now), "narrow")
    assert set(recs) == {"topology_fit"}, recs
    rec = recs["topology_fit"]
    assert (rec.current, rec.recommended) == (16, 0)
    assert rec.evidence["largest_domain_pods"] == 0 and rec.evidence["gpus_per_pod"] == 8
    assert "jobs of 2 pods of 8 GPUs (16 GPUs)" in rec.detail
    assert "prefer network-node-layer-3 rather than require it, or split the job" in rec.detail


GB200 = "ml.p6e-gb200.36xlarge"


def resource_flavor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": s.KUEUE_V1BETA2,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": name}},
    }


def test_flavors_are_judged_one_at_a_time_on_the_nodes_their_pods_may_use() -> None:
    """Each layer-3 domain holds 2 p5 nodes (16 GPUs) and 4 GB200 nodes (16 GPUs). A job of
    4 pods of 8 GPUs needs 32 GPUs in one domain: the domain has them only if the two
    instance types are added together, which Kueue never does (a pod set gets one flavor),
    and no GB200 node holds an 8-GPU pod. Two p5 domains together (layer 2) hold it."""
    sim = Sim(domains=2, nodes_per_domain=2, gpus=8)
    for d in range(2):
        for i in range(4):
            layers = ("nn-l1", f"nn-l2-{d // 2}", f"nn-l3-{d}")
            sim.put("Node", s.node(f"gb-{d}-{i}", layers, 4, instance_type=GB200), T0)
    for name in ("ml.p5.48xlarge", GB200):
        sim.put("ResourceFlavor", resource_flavor(name), T0)
    sim.queue("mixed", 64)
    raw = sim.raw_queue("mixed")
    flavors = raw["spec"]["resourceGroups"][0]["flavors"]
    flavors.append({"name": GB200, "resources": [{"name": s.GPU, "nominalQuota": 32}]})
    sim.put("ClusterQueue", raw, T0)
    sim.pending("mixed", "four-by-eight", 4, ("required", L3))
    history = new_history()
    now = sim.day(history)
    rec = by_kind(advise(sim.model, history, now), "mixed")["topology_fit"]
    assert (rec.current, rec.recommended) == (32, 16)
    assert rec.evidence["largest_domain_pods"] == 2
    assert "largest network-node-layer-3 domain of flavor ml.p5.48xlarge holds 2" in rec.detail
    assert "require network-node-layer-2 instead" in rec.detail

    # Capacity counts the flavor's own nodes: a cordoned one still (repairs end), a node
    # behind a taint the flavor does not tolerate not.
    assert (flavor_capacity(sim.model, "ml.p5.48xlarge"), flavor_capacity(sim.model, GB200)) == (
        32,
        32,
    )
    cordoned = s.node("node-0-0", ("nn-l1", "nn-l2-0", "nn-l3-0"), 8, unschedulable=True)
    sim.put("Node", cordoned, T0)
    tainted = s.node("node-0-1", ("nn-l1", "nn-l2-0", "nn-l3-0"), 8)
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
    sim.put("Node", tainted, T0)
    assert flavor_capacity(sim.model, "ml.p5.48xlarge") == 24


# --- capacity and fair share -----------------------------------------------------------------


def test_total_nominal_stays_within_capacity_split_by_fair_share_weight() -> None:
    sim = Sim(domains=2)  # 64 GPUs in all
    sim.queue("heavy", 32, used=32, weight=3)
    sim.queue("light", 32, used=32, weight="1")
    sim.pending("heavy", "more-h", 4, None)  # both want 32 more on quota
    sim.pending("light", "more-l", 4, None)
    history = new_history()
    now = sim.day(history)
    weights = fair_share_weights(sim.model)
    assert weights == {cq_name("heavy"): 3.0, cq_name("light"): 1.0}
    recs = advise(sim.model, history, now, AdvisorConfig(weights=weights))
    heavy, light = by_kind(recs, "heavy")["nominal"], by_kind(recs, "light")["nominal"]
    assert (heavy.recommended, heavy.reason) == (48, DEMAND_ABOVE_NOMINAL)
    assert (light.recommended, light.reason) == (16, OVER_CAPACITY)
    assert heavy.recommended + light.recommended <= 64
    assert heavy.evidence["capacity_gpus"] == 64 and "fair-share weight 3" in heavy.detail


def test_fair_split_is_weighted_max_min() -> None:
    assert fair_split({"a": 10, "b": 100, "c": 100}, {"b": 2.0}, 90) == {"a": 10, "b": 53, "c": 26}
    assert fair_split({"a": 64, "b": 64}, {"a": 3.0, "b": 1.0}, 64, 8) == {"a": 48, "b": 16}
    assert fair_split({"a": 8}, {"a": 0.0}, 0) == {"a": 0}
    assert [parse_quantity(v) for v in (2, "500m", "1.5", "x", -1, True)] == [
        2.0,
        0.5,
        1.5,
        None,
        None,
        None,
    ]


# --- history ---------------------------------------------------------------------------------


def test_history_forgets_beyond_the_window_and_counts_preemptions_once() -> None:
    sim = Sim(domains=1)
    sim.queue("a", 32, used=8)
    history = QuotaHistory(window_s=DAY, bucket_s=3600.0, max_step_s=STEP)
    now = T0
    for i in range(int(3 * DAY // STEP)):
        now = T0 + i * STEP
        history.sample(sim.model, now)
    assert history.bucket_count <= 25  # a day of hourly buckets, whatever the uptime
    summary = history.summary(cq_name("a"))
    assert summary is not None and summary.seconds <= DAY + 3600
    assert summary.avg_used == pytest.approx(8.0)

    victim = s.workload("hyperpod-ns-a", "victim", 1, 8, now, cluster_queue=cq_name("a"))
    sim.put("Workload", victim, now)
    message = "Preempted to accommodate a workload (UID: u1) due to prioritization in the Cq"
    sim.put("Event", s.preemption_event("hyperpod-ns-a", "victim", message, now - 7200), now)
    history.sample(sim.model, now + STEP)  # the event is stamped hours back: still counted
    history.sample(sim.model, now + 2 * STEP)
    history.sample(sim.model, now + 2 * STEP)  # time did not move: ignored
    summary = history.summary(cq_name("a"))
    assert summary is not None and summary.preemptions_suffered == 1
    assert history.skipped == 1


def test_single_snapshot_and_bad_input_never_crash() -> None:
    model = ClusterModel()
    assert advise(model, QuotaHistory.from_model_only(model, T0), T0) == []
    model.apply("ClusterQueue", "ADDED", {"kind": "ClusterQueue", "metadata": {"name": "x"}}, T0)
    model.apply("ClusterQueue", "ADDED", {"metadata": {"name": "y"}, "spec": "nonsense"}, T0)
    assert advise(model, QuotaHistory.from_model_only(model, T0), T0) == []
    # Queues whose weight cannot be read weigh 1, as Kueue's default.
    assert fair_share_weights(model) == {"x": 1.0, "y": 1.0}


# --- metrics and the API view ----------------------------------------------------------------


def test_metric_families_and_view_carry_bounded_labels() -> None:
    sim = Sim(domains=4)
    sim.queue("wide", 64)
    sim.queue("idle", 64, used=8, lending_limit=0)
    sim.pending("wide", "needs-48", 6, ("required", L3))
    history = QuotaHistory.from_model_only(sim.model, T0)
    recs = advise(sim.model, history, T0)
    view = recommendations_view(recs)
    assert {v["kind"] for v in view} == {"topology_fit", "nominal", "lending_limit"}
    assert all(set(v) >= {"cluster_queue", "team", "reason", "detail", "evidence"} for v in view)
    body = encode_text(quota_families(recs, sim.model))
    text = body.decode()
    assert (
        'topowatch_quota_recommended_gpus{cluster_queue="hyperpod-ns-wide-clusterqueue",'
        'team="wide",kind="topology_fit",reason="unplaceable_at_level"} 32' in text
    )
    assert 'topowatch_quota_current_gpus{cluster_queue="hyperpod-ns-idle-clusterqueue",' in text
    assert "detail" not in text  # free text never becomes a label
    assert promtool_lint(body) == ""
