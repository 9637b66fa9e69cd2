"""Nodes in a HyperPod deep health check or with an EC2 scheduled event are unavailable, not free:
in the topology tree, the metrics, placement's exclusions, pending causes and explain, the topology
view and the quota advisor. The EC2 source runs against botocore's Stubber, which checks every
request and response against the real EC2 service model. Every Kueue fixture validates against
the CRDs."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import botocore.session
import pytest
from botocore.stub import Stubber
from prometheus_client.parser import text_string_to_metric_families

from exporter.cluster.explain import explain_text
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.parse.core import instance_id_of, parse_node
from exporter.cluster.quota.advisor import (
    NOMINAL_IDLE,
    ShapeCapacity,
    _PodShape,
    advise,
    flavor_capacity,
    flavor_unavailable,
)
from exporter.cluster.quota.history import QuotaHistory
from exporter.cluster.run import poll_ec2_events
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import topology_view, workload_view
from exporter.core.exposition import encode_text
from exporter.sim import synthetic as s
from exporter.sources.ec2_events import (
    EVENT_CODES,
    Ec2EventsError,
    Ec2EventsSource,
    ScheduledEvent,
    events_from_statuses,
)
from exporter.topology.labels import DEEP_HEALTH_CHECK_KEY, HEALTH_STATUS_KEY
from exporter.topology.tree import TopologyTree
from tests.cluster.test_cluster_model import topology_pending_workload
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
L3 = "topology.k8s.aws/network-node-layer-3"
L3_NAME = "network-node-layer-3"
CQ = "hyperpod-ns-alpha-clusterqueue"
NS = "hyperpod-ns-alpha"
HOUR = 3600.0


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


def node(
    name: str, l3: str, deep_health: str = "", health: str = "Schedulable", instance: str = ""
) -> dict[str, Any]:
    obj = s.node(name, ("nn-top", "nn-mid", l3), health=health)
    if deep_health:
        obj["metadata"]["labels"][DEEP_HEALTH_CHECK_KEY] = deep_health
    obj["spec"]["providerID"] = f"aws:///us-east-2a/{instance or 'i-' + name}"
    return obj


def two_domains(model: ClusterModel, deep: dict[str, str] | None = None) -> None:
    """nn-a holds n1, n2; nn-b holds n3, n4; 8 GPUs each. `deep`: node -> DHC status."""
    deep = deep or {}
    for name, l3 in (("n1", "nn-a"), ("n2", "nn-a"), ("n3", "nn-b"), ("n4", "nn-b")):
        model.apply("Node", "ADDED", node(name, l3, deep.get(name, "")), T0)


def domain_gpus(model: ClusterModel) -> dict[tuple[str, str, str], float]:
    """(level, domain, state) -> GPUs, from the rendered exposition."""
    text = encode_text(metrics.render(model)).decode()
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "topowatch_cluster_domain_gpus":
            continue
        for sample in family.samples:
            labels = sample.labels
            out[(labels["level"], labels["domain"], labels["state"])] = sample.value
    return out


def gauge(model: ClusterModel, name: str) -> dict[frozenset[tuple[str, str]], float]:
    text = encode_text(metrics.render(model)).decode()
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


# --- the tree ---------------------------------------------------------------------------------


def test_tree_counts_unavailable_gpus_apart_from_free_and_unschedulable() -> None:
    tree = TopologyTree()
    labels = {"topology.k8s.aws/network-node-layer-1": "nn-x"}
    tree.set_node("a", labels, 8, True)
    tree.set_node("b", labels, 8, True, available=False)
    tree.set_node("c", labels, 8, False, available=False)  # both: counted unavailable only
    tree.set_node("d", labels, 8, False)
    tree.add_used("b", 2)
    got = tree.usage("network-node-layer-1", "nn-x")
    assert got is not None
    assert (got.allocatable, got.used, got.free, got.unschedulable, got.unavailable) == (
        32,
        2,
        8,
        8,
        16,
    )
    tree.set_node("b", labels, 8, True, available=True)  # the check passed
    got = tree.usage("network-node-layer-1", "nn-x")
    assert got is not None and (got.free, got.unavailable) == (14, 8)
    tree.remove_node("c")
    got = tree.usage("network-node-layer-1", "nn-x")
    assert got is not None and (got.free, got.unschedulable, got.unavailable) == (14, 8, 0)


# --- deep health checks in the model ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "free", "unavailable"),
    [("InProgress", 0, 8), ("Failed", 0, 8), ("Passed", 8, 0), ("", 8, 0)],
)
def test_deep_health_status_decides_whether_a_node_is_free(
    status: str, free: int, unavailable: int
) -> None:
    model = ClusterModel()
    model.apply("Node", "ADDED", node("n1", "nn-a", status), T0)
    assert model.tree.node_free("n1") == free
    usage = model.tree.usage("node", "n1")
    assert usage is not None and (usage.unavailable, usage.unschedulable) == (unavailable, 0)
    assert not model.problems


def test_a_node_running_the_check_is_unavailable_even_while_hyperpod_marks_it_unschedulable() -> (
    None
):
    model = ClusterModel()
    model.apply("Node", "ADDED", node("n1", "nn-a", "InProgress", health="Unschedulable"), T0)
    usage = model.tree.usage("node", "n1")
    assert usage is not None and (usage.free, usage.unschedulable, usage.unavailable) == (0, 0, 8)
    exclusion = model.eligibility("").excluded[0]
    assert (exclusion.cause, exclusion.detail) == (
        "deep-health-check",
        "deep health check InProgress",
    )


@pytest.mark.parametrize("garbage", ["inprogress", "Running", "x" * 300, "\x00\xff"])
def test_an_unreadable_deep_health_status_is_counted_and_not_free(garbage: str) -> None:
    model = ClusterModel()
    model.apply("Node", "ADDED", node("n1", "nn-a", garbage), T0)
    assert model.tree.node_free("n1") == 0
    assert model.problems[("Node", "deep_health_unreadable")] == 1
    assert model.nodes["n1"].unavailable == "deep-health-check"


def test_a_passed_check_gives_the_gpus_back() -> None:
    model = ClusterModel()
    model.apply("Node", "ADDED", node("n1", "nn-a", "InProgress"), T0)
    obj = node("n1", "nn-a", "Passed")
    obj["metadata"]["resourceVersion"] = "2"
    model.apply("Node", "MODIFIED", obj, T0 + 60)
    assert model.tree.node_free("n1") == 8
    assert model.tree.usage("node", "n1").unavailable == 0  # type: ignore[union-attr]


def test_metrics_carry_the_unavailable_state_and_free_leaves_it_out() -> None:
    model = ClusterModel()
    two_domains(model, {"n1": "InProgress", "n2": "Failed"})
    got = domain_gpus(model)
    assert got[(L3_NAME, "nn-a", "unavailable")] == 16
    assert got[(L3_NAME, "nn-a", "free")] == 0
    assert got[(L3_NAME, "nn-a", "unschedulable")] == 0
    assert got[(L3_NAME, "nn-b", "free")] == 16
    assert got[(L3_NAME, "nn-b", "unavailable")] == 0
    free = gauge(model, "topowatch_cluster_free_gpus")
    assert free[frozenset({("flavor", ""), ("level", L3_NAME)})] == 16
    nodes = gauge(model, "topowatch_cluster_unavailable_nodes")
    assert nodes[frozenset({("cause", "deep-health-check")})] == 2
    assert nodes[frozenset({("cause", "scheduled-event")})] == 0


def test_per_flavor_metrics_count_unavailable_gpus() -> None:
    model = ClusterModel()
    two_domains(model, {"n3": "InProgress"})
    model.apply(
        "ResourceFlavor",
        "ADDED",
        kueue(
            {
                "apiVersion": s.KUEUE_V1BETA2,
                "kind": "ResourceFlavor",
                "metadata": {"name": "ml.p5.48xlarge", "resourceVersion": "1"},
                "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}},
            }
        ),
        T0,
    )
    text = encode_text(metrics.render(model)).decode()
    want = (
        'topowatch_cluster_domain_gpus{flavor="ml.p5.48xlarge",level="network-node-layer-3",'
        'domain="nn-b",state="unavailable"} 8'
    )
    assert want in text
    assert (
        'topowatch_cluster_domain_gpus{flavor="ml.p5.48xlarge",level="network-node-layer-3",'
        'domain="nn-b",state="free"} 8'
    ) in text


def test_topology_view_names_the_unavailable_nodes() -> None:
    model = ClusterModel()
    two_domains(model, {"n2": "InProgress"})
    view = topology_view(model)
    assert view["unavailable_nodes"] == [
        {
            "node": "n2",
            "cause": "deep-health-check",
            "detail": "deep health check InProgress",
            "gpus": 8,
        }
    ]
    region = view["tree"][0]
    assert (region["unavailable"], region["free"]) == (8, 24)


# --- pending causes and explain ---------------------------------------------------------------


def pending_pair(model: ClusterModel) -> Any:
    """A queue with room for 48 GPUs; a job asking for 2 pods of 8 in one layer-3 domain."""
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ, 64, used=16)), T0)
    model.apply("LocalQueue", "ADDED", kueue(s.local_queue(NS, CQ)), T0)
    model.apply("Workload", "ADDED", topology_pending_workload(NS), T0)
    state = model.workload_state(NS, "waiting")
    assert state is not None
    return state


def occupy(model: ClusterModel, node_name: str) -> None:
    wl = kueue(
        s.workload(
            NS,
            f"on-{node_name}",
            1,
            8,
            T0,
            conditions=s.admitted_conditions(CQ, T0),
            cluster_queue=CQ,
            assignment=[((node_name,), 1)],
        )
    )
    model.apply("Workload", "ADDED", wl, T0)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    model.apply("Pod", "ADDED", s.pod(NS, f"on-{node_name}-0", node_name, 8, job_uid, "x"), T0)


def test_explain_says_the_deep_health_check_blocks_the_job() -> None:
    model = ClusterModel()
    two_domains(model, {"n1": "InProgress", "n2": "InProgress"})
    occupy(model, "n3")  # nn-b has 8 free; nn-a would have 16 but for the check
    state = pending_pair(model)
    cause = model.pending_cause(state.workload)
    assert cause is not None and cause.cause == "topology"
    assert cause.topology_message.endswith(
        "; blocked because 2 nodes of nn-a are in a deep health check (n1, n2)"
    )
    view = workload_view(model, state)
    text = explain_text(view)
    assert "blocked because 2 nodes of nn-a are in a deep health check (n1, n2)" in text
    assert (
        "these nodes were back: 2 nodes of nn-a are in a deep health check (n1, n2)"
        in view["would_run_if"]
    )


def test_explain_mentions_unavailable_nodes_that_would_not_be_enough() -> None:
    model = ClusterModel()
    two_domains(model, {"n1": "InProgress"})
    occupy(model, "n2")
    occupy(model, "n3")  # nn-a: n1 checked, n2 busy; nn-b: 8 free
    state = pending_pair(model)
    cause = model.pending_cause(state.workload)
    assert cause is not None
    assert cause.topology_message.endswith(
        "; also unavailable: 1 node is in a deep health check (n1)"
    )


def test_no_note_when_nothing_is_unavailable() -> None:
    model = ClusterModel()
    two_domains(model)
    occupy(model, "n1")
    occupy(model, "n3")
    cause = model.pending_cause(pending_pair(model).workload)
    assert cause is not None and "unavailable" not in cause.topology_message
    assert "blocked because" not in cause.topology_message


# --- EC2 scheduled events in the model --------------------------------------------------------


def event(code: str, starts_in_h: float, ends_in_h: float | None = None) -> ScheduledEvent:
    end = None if ends_in_h is None else T0 + ends_in_h * HOUR
    return ScheduledEvent(
        code, f"The instance is scheduled for {code}", T0 + starts_in_h * HOUR, end
    )


def test_provider_id_gives_the_instance_id() -> None:
    assert instance_id_of("aws:///us-east-2a/i-0abc") == "i-0abc"
    for bad in (None, 7, "", "gce://p/z/i-1", "aws:///us-east-2a/", "aws:///us-east-2a/x"):
        assert instance_id_of(bad) == ""
    assert parse_node(node("n1", "nn-a")).instance_id == "i-n1"


def test_scheduled_events_make_nodes_unavailable_within_the_horizon() -> None:
    model = ClusterModel()
    two_domains(model)
    marked = model.set_scheduled_events(
        {
            "i-n1": [event("system-reboot", 2)],
            "i-n2": [event("instance-retirement", 24 * 10)],  # beyond the 48 h horizon
            "i-n3": [event("system-maintenance", -2, -1)],  # already over
            "i-elsewhere": [event("instance-stop", 0)],  # no Node has it: ignored
        },
        T0,
    )
    assert marked == 1
    assert model.nodes["n1"].unavailable == "scheduled-event"
    assert model.nodes["n1"].unavailable_detail == "system-reboot from 2026-11-18T13:06:40Z"
    assert [n for n, v in model.nodes.items() if v.unavailable] == ["n1"]
    assert model.tree.node_free("n1") == 0
    got = domain_gpus(model)
    assert got[(L3_NAME, "nn-a", "unavailable")] == 8
    exclusion = model.eligibility("").excluded[0]
    assert (exclusion.node, exclusion.cause) == ("n1", "scheduled-event")
    nodes = gauge(model, "topowatch_cluster_unavailable_nodes")
    assert nodes[frozenset({("cause", "scheduled-event")})] == 1

    # A later poll with a wider horizon catches the retirement; the reboot is gone.
    model.set_scheduled_events(
        {"i-n2": [event("instance-retirement", 24 * 10)]}, T0, 11 * 24 * HOUR
    )
    assert [n for n, v in model.nodes.items() if v.unavailable] == ["n2"]
    assert model.tree.node_free("n1") == 8


def test_a_node_added_after_the_poll_gets_its_event_and_deep_health_wins() -> None:
    model = ClusterModel()
    model.set_scheduled_events({"i-n9": [event("system-reboot", 1)]}, T0)
    model.apply("Node", "ADDED", node("n9", "nn-a"), T0)
    assert model.nodes["n9"].unavailable == "scheduled-event"
    model.set_scheduled_events({"i-n8": [event("system-reboot", 1)]}, T0)
    model.apply("Node", "ADDED", node("n8", "nn-a", "InProgress"), T0)
    assert model.nodes["n8"].unavailable == "deep-health-check"
    assert model.nodes["n8"].scheduled_event.startswith("system-reboot")


def test_explain_names_nodes_with_scheduled_events() -> None:
    model = ClusterModel()
    two_domains(model)
    occupy(model, "n3")
    model.set_scheduled_events({"i-n1": [event("system-reboot", 1)]}, T0)
    cause = model.pending_cause(pending_pair(model).workload)
    assert cause is not None
    assert cause.topology_message.endswith(
        "; blocked because 1 node of nn-a has an EC2 scheduled event"
        " (n1: system-reboot from 2026-11-18T12:06:40Z)"
    )


# --- the quota advisor ----------------------------------------------------------------------


def test_advisor_plans_on_unavailable_gpus_and_says_how_many_are_out() -> None:
    model = ClusterModel()
    two_domains(model, {"n1": "InProgress", "n2": "Failed"})
    flavor = "ml.p5.48xlarge"
    assert flavor_capacity(model, flavor) == 32  # quota is planned for the cluster's structure
    assert flavor_unavailable(model, flavor) == 16
    # A job of 2 pods of 8 can still be placed in nn-a once the checks are done.
    fit = ShapeCapacity(model).fit(flavor, L3, _PodShape(2, 8))
    assert fit.fits


def test_idle_advice_says_part_of_the_idle_may_be_unavailable_capacity() -> None:
    model = ClusterModel()
    two_domains(model, {"n4": "InProgress"})
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ, 32, used=0)), T0)
    history = QuotaHistory(window_s=2 * 86_400.0, bucket_s=HOUR, max_step_s=600, first_step_s=600)
    now = T0
    for i in range(144):
        now = T0 + i * 600
        history.sample(model, now)
    recs = [r for r in advise(model, history, now) if r.kind == "nominal"]
    assert len(recs) == 1 and recs[0].reason == NOMINAL_IDLE
    assert recs[0].evidence["flavor_unavailable_gpus"] == 8
    assert "8 GPUs of ml.p5.48xlarge are unavailable now" in recs[0].detail


# --- the EC2 source, against the real service model ------------------------------------------


def stubbed() -> tuple[Any, Stubber]:
    client = botocore.session.get_session().create_client(
        "ec2",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client, Stubber(client)


def request(token: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "IncludeAllInstances": True,
        "Filters": [{"Name": "event.code", "Values": list(EVENT_CODES)}],
        "MaxResults": 1000,
    }
    if token:
        out["NextToken"] = token
    return out


def status(instance: str, *events: dict[str, Any]) -> dict[str, Any]:
    return {
        "InstanceId": instance,
        "AvailabilityZone": "us-east-1a",
        "InstanceState": {"Code": 16, "Name": "running"},
        "Events": list(events),
    }


WHEN = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)


def ev(code: str, description: str = "scheduled") -> dict[str, Any]:
    return {"Code": code, "Description": description, "NotBefore": WHEN, "InstanceEventId": "e-1"}


def test_source_reads_every_page_and_skips_events_that_are_over() -> None:
    client, stub = stubbed()
    stub.add_response(
        "describe_instance_status",
        {
            "InstanceStatuses": [
                status("i-1", ev("system-reboot"), ev("instance-stop", "[Completed] done")),
                status("i-2", ev("instance-reboot", "[Canceled] not needed")),
            ],
            "NextToken": "page-2",
        },
        request(),
    )
    stub.add_response(
        "describe_instance_status",
        {"InstanceStatuses": [status("i-3", ev("instance-retirement"), ev("system-maintenance"))]},
        request("page-2"),
    )
    with stub:
        got = Ec2EventsSource(client, sleep=lambda _: None).poll()
        stub.assert_no_pending_responses()
    assert sorted(got) == ["i-1", "i-3"]
    assert [e.code for e in got["i-1"]] == ["system-reboot"]
    assert got["i-1"][0].not_before == WHEN.timestamp()
    assert [e.code for e in got["i-3"]] == ["instance-retirement", "system-maintenance"]


def test_source_retries_throttling_with_backoff() -> None:
    client, stub = stubbed()
    for _ in range(2):
        stub.add_client_error("describe_instance_status", "RequestLimitExceeded", "slow down")
    stub.add_response(
        "describe_instance_status", {"InstanceStatuses": [status("i-1", ev("system-reboot"))]}
    )
    slept: list[float] = []
    source = Ec2EventsSource(client, sleep=slept.append, jitter=lambda: 1.0, base_delay_s=0.5)
    with stub:
        got = source.poll()
    assert list(got) == ["i-1"]
    assert slept == [0.5, 1.0]
    assert source.counts == {"throttles": 2, "ok": 1}


def test_a_throttle_storm_is_counted_and_raised_not_crashed() -> None:
    client, stub = stubbed()
    for _ in range(4):
        stub.add_client_error("describe_instance_status", "Throttling", "Rate exceeded")
    slept: list[float] = []
    source = Ec2EventsSource(client, attempts=4, sleep=slept.append, jitter=lambda: 1.0)
    with stub, pytest.raises(Ec2EventsError, match="throttled 4 times"):
        source.poll()
    assert source.counts == {"throttles": 4, "throttled": 1}
    assert slept == [0.5, 1.0, 2.0]  # no sleep after the last attempt


def test_other_api_errors_are_counted_and_raised() -> None:
    client, stub = stubbed()
    stub.add_client_error("describe_instance_status", "UnauthorizedOperation", "no")
    source = Ec2EventsSource(client, sleep=lambda _: None)
    with stub, pytest.raises(Ec2EventsError, match="UnauthorizedOperation"):
        source.poll()
    assert source.counts == {"error": 1}


def test_malformed_statuses_are_skipped_and_counted() -> None:
    got, bad = events_from_statuses(
        [
            "garbage",
            {"InstanceId": 7, "Events": []},
            {"InstanceId": "i-1", "Events": "nope"},
            {"InstanceId": "i-2", "Events": [None, {"Code": 3}, {"Code": "system-reboot"}]},
            {"InstanceId": "i-3", "Events": [{"Code": "some-new-code", "Description": "x"}]},
        ]
    )
    assert bad == 5
    assert list(got) == ["i-2"] and got["i-2"][0].not_before is None
    assert events_from_statuses(None) == ({}, 1)


# --- wiring into the service -------------------------------------------------------------------


class FlakySource:
    """Throttled twice, then events; counts as Ec2EventsSource does."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.calls = 0

    def poll(self) -> dict[str, tuple[ScheduledEvent, ...]]:
        self.calls += 1
        if self.calls <= 2:
            self.counts["throttled"] = self.counts.get("throttled", 0) + 1
            raise Ec2EventsError("throttled")
        self.counts["ok"] = self.counts.get("ok", 0) + 1
        return {"i-n1": (ScheduledEvent("system-reboot", "x", T0 + HOUR),)}


def test_service_polls_survive_throttling_and_feed_the_model() -> None:
    service = ClusterService(clock=lambda: T0)
    two_domains(service.model)
    source = FlakySource()
    service.ec2_event_counts = source.counts

    async def run() -> None:
        task = asyncio.create_task(poll_ec2_events(service, source, 0.001))  # type: ignore[arg-type]
        for _ in range(2000):
            await asyncio.sleep(0.001)
            if service.model.nodes["n1"].unavailable:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert service.model.nodes["n1"].unavailable == "scheduled-event"
    body = service.metrics_body(openmetrics=False).decode()
    assert 'topowatch_cluster_ec2_event_polls_total{result="throttled"} 2' in body
    assert 'topowatch_cluster_unavailable_nodes{cause="scheduled-event"} 1' in body


def test_without_the_flag_no_ec2_families_are_served() -> None:
    service = ClusterService(clock=lambda: T0)
    assert "ec2_event" not in service.metrics_body(openmetrics=False).decode()


def test_health_status_label_key_is_unchanged() -> None:
    # The deep-health key sits beside HyperPod's node-health-status key in labels.py.
    assert DEEP_HEALTH_CHECK_KEY.startswith("sagemaker.amazonaws.com/")
    assert HEALTH_STATUS_KEY == "sagemaker.amazonaws.com/node-health-status"


def test_the_source_imports_boto3_only_when_a_client_is_built() -> None:
    code = (
        "import sys, exporter.sources.ec2_events as m, exporter.cluster.run; "
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'eager'; "
        "c = m.ec2_events_client('us-east-1'); "
        "assert c.meta.config.retries['total_max_attempts'] == 1"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_chart_passes_the_ec2_flags_the_service_accepts() -> None:
    from exporter.cli import build_parser
    from tests.deploy.test_chart import CHART, args_of, flag, pod_specs, render

    values = {"cluster": {"ec2Events": {"enabled": True, "region": "us-east-2"}}}
    args = args_of(dict(pod_specs(tuple(render(CHART, values))))["topowatch-cluster"])
    assert "--ec2-events" in args and flag(args, "--ec2-region") == "us-east-2"
    parsed = build_parser().parse_args(args)
    assert parsed.ec2_events and parsed.ec2_events_interval == 300.0
    assert parsed.ec2_events_horizon == 48.0
    default = args_of(dict(pod_specs(tuple(render(CHART, None))))["topowatch-cluster"])
    assert not any(a.startswith("--ec2") for a in default)


def test_explain_names_both_causes_in_one_domain() -> None:
    model = ClusterModel()
    two_domains(model, {"n1": "Failed"})
    occupy(model, "n3")
    model.set_scheduled_events({"i-n2": [event("instance-retirement", 1)]}, T0)
    cause = model.pending_cause(pending_pair(model).workload)
    assert cause is not None
    assert cause.topology_message.endswith(
        "; blocked because 1 node of nn-a is in a deep health check (n1) and 1 has an EC2"
        " scheduled event (n2: instance-retirement from 2026-11-18T12:06:40Z)"
    )
