"""EFA remote errors correlated across a workload's nodes (issue 14, item 2, cluster side).

One node's rising unresponsive/impaired-remote counters stay the node agent's warning; the
cluster service raises them when several nodes of one workload report at once, and names the
node they share (the rule: exporter/cluster/efa_remotes.py's docstring, cited per row). Every
scenario goes through the model's real inputs: Node, Pod and Workload objects as the informers
deliver them, the findings annotation as the node agent writes it (exporter.core.findings), and
every Kueue Workload validated against the CRDs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cluster import efa_remotes
from exporter.cluster.explain import explain_text, model_from_objects
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.service import ClusterService
from exporter.cluster.views.workloads import iso, workload_view
from exporter.core.exposition import encode_text
from exporter.core.findings import FINDINGS_ANNOTATION, Finding, findings_to_json
from exporter.sim import synthetic as s
from healthcheck.detection.reporter import REFRESH_SECONDS
from tests.conftest import ServedCluster
from tests.crds import assert_valid_kueue

NOW = 1_795_000_000.0
NS = "hyperpod-ns-alpha"
CQ = "hyperpod-ns-alpha-clusterqueue"
MIN = 60.0

# What an annotation holds: findings as the node agent writes them, raw text, or no annotation.
Annotation = Sequence[Finding] | str | None


def remote(since: float = NOW - 5 * MIN, seen: float = NOW, port: str = "rdmap16s27:1") -> Finding:
    """The node agent's `efa_remote_errors` finding (healthcheck/detection/checks/efa.py)."""
    return Finding(
        "efa_remote_errors",
        port,
        "warning",
        "none",
        "unresponsive_remote_events +12.0/s (max 1)",
        since,
        seen,
    )


def link_down(since: float = NOW - 2 * MIN) -> Finding:
    return Finding(
        "efa_link_down",
        "rdmap16s27:eth1",
        "critical",
        "reboot",
        "eth1 operstate down, carrier 0",
        since,
        NOW,
        actionable=True,
    )


def device_errors() -> Finding:
    """A warning without action: retransmission timeouts rise on a node whose peer is sick."""
    return Finding(
        "efa_device_errors",
        "rdmap16s27",
        "warning",
        "none",
        "port 1 retrans_timeout_events +30.0/s (max 5)",
        NOW - 5 * MIN,
        NOW,
    )


def node(name: str, annotation: Annotation = ()) -> dict[str, Any]:
    obj = s.node(name, ("nn-top", "nn-mid", "nn-a"))
    if annotation is not None:
        value = annotation if isinstance(annotation, str) else findings_to_json(annotation)
        obj["metadata"]["annotations"] = {FINDINGS_ANNOTATION: value}
    return obj


def admitted(name: str, nodes: Sequence[str], gpus: int) -> list[dict[str, Any]]:
    """An admitted Workload (validated against the CRD) and one bound pod per node."""
    wl = s.workload(
        NS,
        name,
        len(nodes),
        gpus,
        NOW - 3600,
        conditions=s.admitted_conditions(CQ, NOW - 3600),
        cluster_queue=CQ,
        assignment=[((n,), 1) for n in nodes],
    )
    assert_valid_kueue(wl)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    pods = [s.pod(NS, f"{name}-{i}", n, gpus, job_uid, name) for i, n in enumerate(nodes)]
    return [wl, *pods]


@dataclass
class Cluster:
    nodes: Mapping[str, Annotation]
    workloads: Mapping[str, Sequence[str]]
    gpus_per_pod: int = 8
    objects: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.objects = [node(n, a) for n, a in self.nodes.items()]
        for name, placed in self.workloads.items():
            self.objects.extend(admitted(name, placed, self.gpus_per_pod))

    def model(self) -> ClusterModel:
        model = ClusterModel()
        for obj in self.objects:
            model.apply(obj["kind"], "ADDED", obj, NOW)
        return model


@dataclass(frozen=True)
class Expect:
    correlated: bool
    suspects: tuple[str, ...] = ()
    basis: str | None = None


SCENARIOS: dict[str, tuple[Cluster, dict[str, Expect | None]]] = {
    "rule 4b: 2 of 3 nodes report, the third is the suspect": (
        Cluster({"n1": [remote()], "n2": [remote()], "n3": []}, {"job": ["n1", "n2", "n3"]}),
        {"job": Expect(True, ("n3",), "only-silent-node")},
    ),
    "rule 4c: reporters of two workloads share one silent node, that node": (
        Cluster(
            {
                "a1": [remote()],
                "a2": [remote()],
                "b1": [remote()],
                "b2": [remote()],
                "shared": [],
                "y": [],
                "z": [],
            },
            {"left": ["a1", "a2", "shared", "y"], "right": ["b1", "b2", "shared", "z"]},
            gpus_per_pod=4,  # two 4-GPU pods share a node
        ),
        {
            "left": Expect(True, ("shared",), "shared-silent-node"),
            "right": Expect(True, ("shared",), "shared-silent-node"),
        },
    ),
    "rule 4d: both nodes of a 2-node workload report, undetermined": (
        Cluster({"n1": [remote()], "n2": [remote()]}, {"pair": ["n1", "n2"]}),
        {"pair": Expect(True, (), "undetermined")},
    ),
    "rule 4d: two silent nodes nothing tells apart, undetermined": (
        Cluster(
            {"n1": [remote()], "n2": [remote()], "n3": [], "n4": []},
            {"job": ["n1", "n2", "n3", "n4"]},
        ),
        {"job": Expect(True, (), "undetermined")},
    ),
    "rule 3: one reporter alone stays a warning, no correlation": (
        Cluster({"n1": [remote()], "n2": [], "n3": []}, {"job": ["n1", "n2", "n3"]}),
        {"job": Expect(False)},
    ),
    "rule 4a: a node with its own EFA fault is the suspect": (
        Cluster(
            {"n1": [remote()], "n2": [remote()], "n3": [], "n4": [link_down()]},
            {"job": ["n1", "n2", "n3", "n4"]},
        ),
        {"job": Expect(True, ("n4",), "local-efa-fault")},
    ),
    "rule 2: an efa_* warning without action is no local fault": (
        Cluster(
            {"n1": [remote(), device_errors()], "n2": [remote()], "n3": []},
            {"job": ["n1", "n2", "n3"]},
        ),
        {"job": Expect(True, ("n3",), "only-silent-node")},
    ),
    "rule 1: findings that do not overlap in time, no correlation": (
        Cluster(
            {
                "n1": [remote(since=NOW - 3 * 3600, seen=NOW - 2 * 3600)],  # its agent went quiet
                "n2": [remote(since=NOW - MIN)],
                "n3": [],
            },
            {"job": ["n1", "n2", "n3"]},
        ),
        {"job": Expect(False)},
    ),
    "rule 1: a finding refreshed within the window overlaps, correlated": (
        Cluster(
            {
                "n1": [remote(since=NOW - 20 * MIN, seen=NOW - 9 * MIN)],
                "n2": [remote(since=NOW - MIN)],
                "n3": [],
            },
            {"job": ["n1", "n2", "n3"]},
        ),
        {"job": Expect(True, ("n3",), "only-silent-node")},
    ),
    "rule 2: a node without an agent annotation is unknown, not eliminated": (
        Cluster(
            {"n1": [remote()], "n2": [remote()], "n3": [], "n4": None},
            {"job": ["n1", "n2", "n3", "n4"]},
        ),
        {"job": Expect(True, (), "undetermined")},
    ),
    "rule 3: workloads without a reporting node are not listed": (
        Cluster({"n1": [], "n2": [], "n3": [remote()]}, {"quiet": ["n1", "n2"]}),
        {"quiet": None},
    ),
}


def judged(model: ClusterModel, now: float | None = NOW) -> dict[str, efa_remotes.Correlation]:
    return {c.workload: c for c in efa_remotes.from_model(model, now)}


@pytest.mark.parametrize("scenario", list(SCENARIOS), ids=list(SCENARIOS))
def test_scenarios(scenario: str) -> None:
    cluster, expected = SCENARIOS[scenario]
    model = cluster.model()
    found = judged(model)
    for workload, expect in expected.items():
        if expect is None:
            assert workload not in found
            continue
        got = found[workload]
        assert got.correlated is expect.correlated, got.summary
        assert tuple(s.node for s in got.suspects) == expect.suspects, got.summary
        if expect.correlated:
            assert got.basis == expect.basis, got.summary
        else:
            assert got.since is None and not got.suspects
    assert not model.problems


def test_the_correlation_starts_when_the_second_reporter_does() -> None:
    # Rule 3: it holds since the min_reporters-th reporter began.
    cluster = Cluster(
        {"n1": [remote(since=NOW - 30 * MIN)], "n2": [remote(since=NOW - 7 * MIN)], "n3": []},
        {"job": ["n1", "n2", "n3"]},
    )
    got = judged(cluster.model())["job"]
    assert got.since == NOW - 7 * MIN
    assert got.summary == (
        f"2 of its 3 nodes report unresponsive EFA remotes since {iso(NOW - 7 * MIN)} (n1, n2);"
        " they share node n3 (the only one of its nodes not reporting): suspect"
    )


def test_min_reporters_is_configurable() -> None:
    # Rule 3 with min_reporters 3: two reporters are not enough.
    cluster = Cluster({"n1": [remote()], "n2": [remote()], "n3": []}, {"job": ["n1", "n2", "n3"]})
    model = cluster.model()
    assert efa_remotes.MIN_REPORTERS == 2
    (only,) = efa_remotes.from_model(model, NOW, min_reporters=3)
    assert not only.correlated and only.reporters == ("n1", "n2")


def test_the_freshness_window_covers_the_agents_refresh() -> None:
    # Rule 1: a live agent rewrites lastSeen every REFRESH_SECONDS; two periods of slack.
    assert efa_remotes.FRESH_S >= 2 * REFRESH_SECONDS


def test_findings_age_out_with_the_clock() -> None:
    # Rule 1: the same annotations, judged an hour later with no agent rewriting: gone.
    model = SCENARIOS["rule 4b: 2 of 3 nodes report, the third is the suspect"][0].model()
    assert judged(model, NOW)["job"].correlated
    assert judged(model, NOW + 3600) == {}


def test_malformed_annotations_are_counted_never_raised_and_others_still_judged() -> None:
    good_and_bad = json.loads(findings_to_json([remote()]))
    good_and_bad.append({"check": "efa_remote_errors", "component": "x", "severity": "loud"})
    annotations: dict[str, Annotation] = {
        "n1": [remote()],
        "n2": json.dumps(good_and_bad),  # one bad entry: the good one is still read
        "n3": [],
        "n4": "not json {",
        "n5": "[" * 100_000,  # nesting deep enough to exhaust the JSON parser
        "n6": '{"check": "efa_remote_errors"}',
        "n7": [remote()],
    }
    cluster = Cluster(annotations, {"job": ["n1", "n2", "n3"], "other": ["n4", "n5", "n6", "n7"]})
    by_name = {o["metadata"]["name"]: o for o in cluster.objects if o["kind"] == "Node"}
    by_name["n7"]["metadata"]["annotations"][FINDINGS_ANNOTATION] = 7  # not even a string
    model = ClusterModel()
    for obj in cluster.objects:
        model.apply(obj["kind"], "ADDED", obj, NOW)  # nothing raises
    assert model.problems[("Node", "findings_unreadable")] == 5
    assert ("Node", "internal") not in model.problems
    assert model.nodes["n4"].findings_read is False
    assert model.nodes["n2"].findings_read is True
    found = judged(model)
    assert found["job"].correlated and [s.node for s in found["job"].suspects] == ["n3"]
    # n7's annotation was replaced by a number: no reporter is left in "other".
    assert "other" not in found


def test_findings_refreshes_do_not_invalidate_placement_answers() -> None:
    # The agent rewrites lastSeen every few minutes: placement caches keyed on node changes
    # must not be thrown away for it, but the new findings must be seen.
    model = Cluster({"n1": [], "n2": []}, {}).model()
    epoch = model._nodes_epoch
    refreshed = node("n1", [remote()])
    refreshed["metadata"]["resourceVersion"] = "2"
    model.apply("Node", "MODIFIED", refreshed, NOW)
    assert model._nodes_epoch == epoch
    assert model.nodes["n1"].efa_findings[0].check == "efa_remote_errors"


def samples(model: ClusterModel, name: str, now: float | None = NOW) -> dict[str, float]:
    text = encode_text(metrics.render(model, now=now)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[labels] = sample.value
    return out


def test_metrics_name_the_suspect_or_say_undetermined() -> None:
    suspect = SCENARIOS["rule 4b: 2 of 3 nodes report, the third is the suspect"][0].model()
    assert samples(suspect, "topowatch_efa_remote_errors_suspect") == {
        f"basis=only-silent-node,namespace={NS},node=n3,workload=job": 1.0
    }
    assert samples(suspect, "topowatch_efa_remote_errors_reporters") == {
        f"namespace={NS},workload=job": 2.0
    }
    pair = SCENARIOS["rule 4d: both nodes of a 2-node workload report, undetermined"][0].model()
    assert samples(pair, "topowatch_efa_remote_errors_suspect") == {
        f"basis=undetermined,namespace={NS},node=,workload=pair": 1.0
    }
    alone = SCENARIOS["rule 3: one reporter alone stays a warning, no correlation"][0].model()
    assert samples(alone, "topowatch_efa_remote_errors_suspect") == {}
    assert samples(alone, "topowatch_efa_remote_errors_reporters") == {
        f"namespace={NS},workload=job": 1.0
    }


def test_explain_offline_names_the_suspect_as_of_the_dump() -> None:
    # A dump has no clock: findings are judged as of the newest lastSeen in it (rule 1).
    cluster = SCENARIOS["rule 4a: a node with its own EFA fault is the suspect"][0]
    model, _ = model_from_objects(cluster.objects)
    state = model.workload_state(NS, "job")
    assert state is not None
    text = explain_text(workload_view(model, state))
    assert (
        f"EFA: 2 of its 4 nodes report unresponsive EFA remotes since {iso(NOW - 5 * MIN)}"
        " (n1, n2); node n4 (its own EFA fault: efa_link_down on rdmap16s27:eth1): suspect"
    ) in text


def test_explain_says_nothing_about_efa_when_no_node_reports() -> None:
    model = Cluster({"n1": [], "n2": []}, {"job": ["n1", "n2"]}).model()
    state = model.workload_state(NS, "job")
    assert state is not None
    view = workload_view(model, state, now=NOW)
    assert view["efa_remote_errors"] is None
    assert "EFA" not in explain_text(view)


def test_the_service_serves_the_correlation_in_its_api_and_metrics() -> None:
    clock = [NOW]
    service = ClusterService(clock=lambda: clock[0])
    cluster = SCENARIOS["rule 4c: reporters of two workloads share one silent node, that node"][0]
    for obj in cluster.objects:
        service.apply(obj["kind"], "ADDED", obj)  # as the informers deliver them
    served = ServedCluster(service)
    get: Callable[[str], Any] = lambda path: json.loads(served.get(path))  # noqa: E731
    try:
        listed = get("/api/v1/efa/remote-errors")
        assert [(e["workload"], e["basis"]) for e in listed] == [
            ("left", "shared-silent-node"),
            ("right", "shared-silent-node"),
        ]
        assert listed[0]["suspects"][0]["node"] == "shared"
        assert listed[0]["reporters"] == ["a1", "a2"]
        view = get(f"/api/v1/workloads/{NS}/left")
        assert "they share node shared" in view["efa_remote_errors"]["summary"]
        body = served.get("/metrics").decode()
        assert (
            f'topowatch_efa_remote_errors_suspect{{namespace="{NS}",workload="right",'
            'node="shared",basis="shared-silent-node"} 1'
        ) in body
        clock[0] = NOW + 3600  # no agent rewrote its findings for an hour
        assert get("/api/v1/efa/remote-errors") == []
        assert "topowatch_efa_remote_errors_suspect{" not in served.get("/metrics").decode()
    finally:
        served.stop()
