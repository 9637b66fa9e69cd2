"""Nodes, Pods and Events parsed into the model's types: HyperPod health, GPU requests the way
the scheduler counts them, and Event times from both event recorders."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from exporter.cluster.parse.core import parse_event, parse_node, parse_pod, parse_time
from tests.conftest import executed_lines

LAYER1 = "topology.k8s.aws/network-node-layer-1"
HEALTH = "sagemaker.amazonaws.com/node-health-status"


def hyperpod_node(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "hyperpod-i-02f6a1c3d5e7b9a0c1",
            "labels": {
                "node.kubernetes.io/instance-type": "ml.p5.48xlarge",
                LAYER1: "nn-4b1d9a2e6c0f8b3a7",
                "topology.k8s.aws/network-node-layer-2": "nn-a71c3e9d05b2f4e68",
                "topology.k8s.aws/network-node-layer-3": "nn-0e5f2c8a1d7b3946c",
                "kubernetes.io/hostname": "hyperpod-i-02f6a1c3d5e7b9a0c1",
                HEALTH: "Schedulable",
            },
        },
        "spec": {"providerID": "aws:///us-west-2a/i-02f6a1c3d5e7b9a0c1"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "191450m"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
        },
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        node[section][field] = value
    return node


# --- nodes ---------------------------------------------------------------------------------


def test_a_healthy_hyperpod_node() -> None:
    node = parse_node(hyperpod_node())
    assert node.name == "hyperpod-i-02f6a1c3d5e7b9a0c1"
    assert node.allocatable_gpus == 8
    assert node.schedulable
    assert node.health == "Schedulable"
    assert node.label(LAYER1) == "nn-4b1d9a2e6c0f8b3a7"
    assert [key for key, _ in node.labels] == sorted(hyperpod_node()["metadata"]["labels"])


@pytest.mark.parametrize(
    "health", ["Unschedulable", "UnschedulablePendingReplacement", "UnschedulablePendingReboot"]
)
def test_a_node_hyperpod_marked_unschedulable_takes_no_new_pods(health: str) -> None:
    obj = hyperpod_node()
    obj["metadata"]["labels"][HEALTH] = health
    node = parse_node(obj)
    assert (node.schedulable, node.health) == (False, health)


def test_cordoned_not_ready_or_unreported_nodes_are_not_schedulable() -> None:
    assert not parse_node(hyperpod_node(spec__unschedulable=True)).schedulable
    not_ready = hyperpod_node()
    not_ready["status"]["conditions"][1]["status"] = "Unknown"
    assert not parse_node(not_ready).schedulable
    no_conditions = hyperpod_node(status__conditions=[])
    assert not parse_node(no_conditions).schedulable
    no_label = hyperpod_node()
    del no_label["metadata"]["labels"][HEALTH]
    assert parse_node(no_label).schedulable and parse_node(no_label).health == ""


def test_a_cpu_node_has_no_gpus() -> None:
    node = parse_node(hyperpod_node(status__allocatable={"cpu": "4"}))
    assert node.allocatable_gpus == 0


def test_a_malformed_node_is_noted_not_raised() -> None:
    obj = hyperpod_node(status__allocatable={"nvidia.com/gpu": "eight"})
    obj["metadata"]["labels"]["broken"] = 7
    problems: list[str] = []
    node = parse_node(obj, problems)
    assert node.allocatable_gpus == 0 and node.schedulable
    assert "broken" not in dict(node.labels)
    assert problems == [
        "metadata.labels['broken']: expected a string value, got number",
        "status.allocatable: 'eight' is not a Kubernetes quantity",
    ]


# --- pods ----------------------------------------------------------------------------------


def training_pod(**spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llama3-70b-pretrain-worker-2",
            "namespace": "hyperpod-ns-research",
            "uid": "7c1d3e5f-2a4b-4c6d-8e0f-1a2b3c4d5e6f",
            "labels": {
                "kueue.x-k8s.io/job-uid": "6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3",
                "kueue.x-k8s.io/queue-name": "hyperpod-ns-research-localqueue",
                "training.kubeflow.org/replica-index": "2",
            },
            "annotations": {"kueue.x-k8s.io/workload": "pytorchjob-llama3-70b-pretrain-3f9a1"},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "llama3-70b-pretrain",
                    "uid": "6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": "hyperpod-i-02f6a1c3d5e7b9a0c3",
            "containers": [
                {
                    "name": "pytorch",
                    "resources": {
                        "requests": {"nvidia.com/gpu": "8", "cpu": "180"},
                        "limits": {"nvidia.com/gpu": "8"},
                    },
                }
            ],
            **spec,
        },
        "status": {"phase": "Running"},
    }
    return pod


def _gpus(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources}


def test_a_running_training_pod() -> None:
    pod = parse_pod(training_pod())
    assert pod.key == ("hyperpod-ns-research", "llama3-70b-pretrain-worker-2")
    assert pod.node == "hyperpod-i-02f6a1c3d5e7b9a0c3" and pod.phase == "Running"
    assert pod.gpus == 8 and pod.holds_gpus
    assert pod.workload == "pytorchjob-llama3-70b-pretrain-3f9a1"
    assert pod.job_uid == "6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3"
    assert pod.queue_name == "hyperpod-ns-research-localqueue"
    assert (pod.owner, pod.owner_uid) == (
        "PyTorchJob/llama3-70b-pretrain",
        "6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3",
    )


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ({"containers": [_gpus({"nvidia.com/gpu": 4}), _gpus({"nvidia.com/gpu": "2"})]}, 6),
        ({"containers": [_gpus(limits={"nvidia.com/gpu": "8"})]}, 8),  # request defaults to limit
        ({"containers": [_gpus({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"})]}, 1),
        ({"containers": [_gpus({"cpu": "1"})]}, 0),
        # an ordinary init container runs alone: the pod needs the larger of it and the app
        (
            {
                "initContainers": [_gpus({"nvidia.com/gpu": "8"})],
                "containers": [_gpus({"nvidia.com/gpu": "2"})],
            },
            8,
        ),
        # a sidecar (restartable init container) runs beside the app: it adds
        (
            {
                "initContainers": [{**_gpus({"nvidia.com/gpu": "1"}), "restartPolicy": "Always"}],
                "containers": [_gpus({"nvidia.com/gpu": "2"})],
            },
            3,
        ),
        # an init container after a sidecar runs beside that sidecar
        (
            {
                "initContainers": [
                    {**_gpus({"nvidia.com/gpu": "1"}), "restartPolicy": "Always"},
                    _gpus({"nvidia.com/gpu": "4"}),
                ],
                "containers": [_gpus({"nvidia.com/gpu": "2"})],
            },
            5,
        ),
    ],
)
def test_gpus_are_counted_the_way_the_scheduler_counts_them(
    spec: dict[str, Any], gpus: int
) -> None:
    assert parse_pod(training_pod(**spec)).gpus == gpus


def test_pods_that_do_not_hold_gpus() -> None:
    pending = training_pod()
    del pending["spec"]["nodeName"]
    pending["status"]["phase"] = "Pending"
    assert parse_pod(pending).node == "" and not parse_pod(pending).holds_gpus
    done = training_pod()
    done["status"]["phase"] = "Succeeded"
    assert not parse_pod(done).holds_gpus


def test_owner_is_the_controller_else_the_first_reference() -> None:
    obj = training_pod()
    refs = obj["metadata"]["ownerReferences"]
    refs.insert(0, {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-cm"})
    assert parse_pod(obj).owner == "PyTorchJob/llama3-70b-pretrain"
    refs[1]["controller"] = False
    assert (parse_pod(obj).owner, parse_pod(obj).owner_uid) == ("ConfigMap/cm", "u-cm")
    del obj["metadata"]["ownerReferences"]
    assert (parse_pod(obj).owner, parse_pod(obj).owner_uid) == ("", "")


def test_a_plain_pod_outside_kueue() -> None:
    obj = training_pod()
    obj["metadata"].pop("annotations")
    obj["metadata"]["labels"] = {"app": "nccl-tests"}
    pod = parse_pod(obj)
    assert (pod.workload, pod.job_uid, pod.queue_name) == ("", "", "")


def test_a_malformed_pod_is_noted_and_logged_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    obj = training_pod(containers={"name": "pytorch"})
    obj["metadata"]["name"] = ["not", "a", "name"]
    problems: list[str] = []
    pod = parse_pod(obj, problems)
    assert (pod.name, pod.gpus, pod.namespace) == ("", 0, "hyperpod-ns-research")
    assert problems == [
        "metadata.name: expected a string, got list",
        "spec.containers: expected a list, got object",
    ]
    with caplog.at_level("WARNING"):
        parse_pod(obj)
    assert "malformed Pod hyperpod-ns-research/" in caplog.text
    assert "spec.containers: expected a list, got object" in caplog.text


def _set(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value


# parse_pod type-tests each field in line and calls the checked helper only when the test
# fails: each row is one field of the wrong JSON type, the note the helper writes, and the
# default the Pod then holds (what `text`/`mapping`/`items` promise for any field).
MISTYPED_POD_FIELDS = [
    (("metadata", "namespace"), 5, "metadata.namespace: expected a string, got number"),
    (("metadata", "uid"), [], "metadata.uid: expected a string, got list"),
    (("spec", "nodeName"), {}, "spec.nodeName: expected a string, got object"),
    (("status", "phase"), 1.5, "status.phase: expected a string, got number"),
    (("metadata", "labels"), [], "metadata.labels: expected an object, got list"),
    (("metadata", "annotations"), "x", "metadata.annotations: expected an object, got string"),
    (
        ("metadata", "annotations", "kueue.x-k8s.io/workload"),
        3,
        "metadata.annotations: expected a string, got number",
    ),
    (
        ("metadata", "labels", "kueue.x-k8s.io/job-uid"),
        True,
        "metadata.labels: expected a string, got boolean",
    ),
    (("spec", "schedulingGates"), "gate", "spec.schedulingGates: expected a list, got string"),
    (("status", "conditions"), 3, "status.conditions: expected a list, got number"),
    (
        ("metadata", "ownerReferences"),
        "job",
        "metadata.ownerReferences: expected a list, got string",
    ),
    (
        ("metadata", "ownerReferences", 0, "kind"),
        7,
        "metadata.ownerReferences[].kind: expected a string, got number",
    ),
]


@pytest.mark.parametrize(("path", "value", "note"), MISTYPED_POD_FIELDS)
def test_each_mistyped_pod_field_is_noted_and_read_as_its_default(
    path: tuple[Any, ...], value: Any, note: str
) -> None:
    good = parse_pod(training_pod(schedulingGates=[{"name": "g"}]))
    obj = training_pod(schedulingGates=[{"name": "g"}])
    _set(obj, path, value)
    problems: list[str] = []
    pod = parse_pod(obj, problems)
    assert problems == [note]
    fields = ("namespace", "uid", "node", "phase", "workload", "job_uid", "queue_name", "owner")
    changed = {
        field
        for field in (*fields, "owner_uid", "gated", "gpus")
        if getattr(pod, field) != getattr(good, field)
    }
    expected = {
        ("metadata", "namespace"): {"namespace"},
        ("metadata", "uid"): {"uid"},
        ("spec", "nodeName"): {"node"},
        ("status", "phase"): {"phase"},
        ("metadata", "labels"): {"job_uid", "queue_name"},
        ("metadata", "annotations"): {"workload"},
        ("metadata", "annotations", "kueue.x-k8s.io/workload"): {"workload"},
        ("metadata", "labels", "kueue.x-k8s.io/job-uid"): {"job_uid"},
        ("spec", "schedulingGates"): {"gated"},
        ("status", "conditions"): set(),
        ("metadata", "ownerReferences"): {"owner", "owner_uid"},
        ("metadata", "ownerReferences", 0, "kind"): {"owner"},
    }[path]
    assert changed == expected
    for field in expected - {"gated", "owner", "owner_uid"}:
        assert getattr(pod, field) == ""


def test_string_subclasses_read_like_strings() -> None:
    """The in-line test is `type(x) is str`; a str subclass (a YAML loader's, say) still reads
    through the checked helper, never as absent."""

    class Tagged(str):
        pass

    obj = training_pod()
    obj["metadata"]["namespace"] = Tagged("team-a")
    obj["spec"]["nodeName"] = Tagged("node-1")
    problems: list[str] = []
    pod = parse_pod(obj, problems)
    assert (pod.namespace, pod.node, problems) == ("team-a", "node-1", [])


@pytest.mark.parametrize("junk", [None, 7, "pod", [], {}, {"metadata": []}, {"spec": 3}])
def test_junk_is_an_empty_pod(junk: Any) -> None:
    problems: list[str] = []
    pod = parse_pod(junk, problems)
    assert (pod.name, pod.gpus, pod.holds_gpus) == ("", 0, False)
    assert problems and not any(p.startswith("unexpected") for p in problems)


def test_parsing_a_pod_costs_a_fixed_small_amount_of_work() -> None:
    """~3 us a pod when timed; counted here (timings flake on a busy CI machine) as the Python
    lines a parse runs: a fixed number per pod, whatever the number of pods."""
    pods = [training_pod() for _ in range(5_000)]
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"worker-{i}"

    def parse(some: list[dict[str, Any]]) -> Callable[[], object]:
        return lambda: [parse_pod(pod) for pod in some]

    few, many = executed_lines(parse(pods[:500])), executed_lines(parse(pods))
    # ~115 lines a pod now; the bound leaves room for more fields but catches a regression in
    # kind (a deep copy, a second pass, a lookup that grows with the pods already parsed).
    assert many / len(pods) < 400, f"{many / len(pods):.0f} lines per pod"
    assert many <= 10 * few + 1_000, (few, many)


# --- events --------------------------------------------------------------------------------

PREEMPTED_MESSAGE = (
    "Preempted to accommodate a workload (UID: 0d6f2b8e-4c1a-4e59-9f3e-7a2b1c0d9e11, JobUID:"
    " 6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3) due to reclamation within the cohort; preemptor path:"
    " /hyperpod-cohort/hyperpod-ns-research-clusterqueue; preemptee path:"
    " /hyperpod-cohort/hyperpod-ns-platform-clusterqueue"
)


def core_event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": "pytorchjob-bert-sweep-17-5d0e2.18a9c3f2b4d6e7a1",
            "namespace": "hyperpod-ns-platform",
            "uid": "ab12cd34-ef56-4789-a0b1-c2d3e4f5a6b7",
            "creationTimestamp": "2026-03-02T09:14:08Z",
        },
        "involvedObject": {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "namespace": "hyperpod-ns-platform",
            "name": "pytorchjob-bert-sweep-17-5d0e2",
            "uid": "3e8d1f60-9c2b-47a5-b0e3-82f4c6d9a154",
        },
        "reason": "Preempted",
        "message": PREEMPTED_MESSAGE,
        "type": "Normal",
        "count": 2,
        "firstTimestamp": "2026-03-02T09:14:08Z",
        "lastTimestamp": "2026-03-02T09:20:08Z",
        "source": {"component": "kueue-admission"},
    }
    event.update(changes)
    return event


def test_a_core_v1_event_from_the_legacy_recorder() -> None:
    event = parse_event(core_event())
    assert (event.namespace, event.uid) == ("hyperpod-ns-platform", core_event()["metadata"]["uid"])
    assert (event.involved_kind, event.involved_namespace, event.involved_name) == (
        "Workload",
        "hyperpod-ns-platform",
        "pytorchjob-bert-sweep-17-5d0e2",
    )
    assert event.involved_uid == "3e8d1f60-9c2b-47a5-b0e3-82f4c6d9a154"
    assert (event.reason, event.type, event.message) == ("Preempted", "Normal", PREEMPTED_MESSAGE)
    assert event.count == 2
    assert event.first_seen == 1772442848.0  # 2026-03-02T09:14:08Z
    assert event.last_seen == 1772443208.0  # six minutes later


def test_an_event_from_the_new_recorder_takes_times_from_event_time_and_series() -> None:
    obj = core_event(
        count=None,
        firstTimestamp=None,
        lastTimestamp=None,
        eventTime="2026-03-02T09:14:08.123456Z",
        series={"count": 5, "lastObservedTime": "2026-03-02T09:19:08.000001Z"},
        reportingComponent="kueue-admission",
    )
    event = parse_event(obj)
    assert event.count == 5
    assert event.first_seen == pytest.approx(1772442848.123456)  # eventTime
    assert event.last_seen == pytest.approx(1772443148.000001)  # series.lastObservedTime


def test_an_event_with_no_times_falls_back_to_its_creation() -> None:
    event = parse_event(core_event(count=0, firstTimestamp=None, lastTimestamp=None))
    assert event.count == 1
    assert event.first_seen == event.last_seen == 1772442848.0  # metadata.creationTimestamp


def test_an_events_k8s_io_v1_event_reads_the_same() -> None:
    legacy = core_event()
    modern = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": legacy["metadata"],
        "regarding": legacy["involvedObject"],
        "note": PREEMPTED_MESSAGE,
        "reason": "Preempted",
        "type": "Normal",
        "eventTime": "2026-03-02T09:14:08.000000Z",
        "deprecatedCount": 2,
        "deprecatedFirstTimestamp": "2026-03-02T09:14:08Z",
        "deprecatedLastTimestamp": "2026-03-02T09:20:08Z",
    }
    assert parse_event(modern) == parse_event(legacy)


def test_a_malformed_event_is_noted_not_raised() -> None:
    obj = core_event(involvedObject="Workload/x", count="many", lastTimestamp="later")
    problems: list[str] = []
    event = parse_event(obj, problems)
    assert (event.involved_kind, event.count) == ("", 1)
    assert event.last_seen == event.first_seen  # an unreadable time falls back
    assert problems == [
        "involvedObject: expected an object, got string",
        "count: expected an integer, got string 'many'",
    ]
    problems.clear()
    empty = parse_event({"metadata": {}}, problems)
    assert (empty.count, empty.first_seen, empty.last_seen) == (1, None, None)
    assert problems == ["metadata missing"]


# --- times ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-03-02T09:14:05Z", 1772442845.0),
        ("2026-03-02T09:14:05.5Z", 1772442845.5),
        ("2026-03-02T09:14:05.123456Z", 1772442845.123456),
        ("2026-03-02T09:14:05.123456789Z", 1772442845.123456),  # RFC3339Nano, truncated
        ("2026-03-02T11:14:05+02:00", 1772442845.0),
        ("2026-03-02t09:14:05z", 1772442845.0),
        ("2026-03-02T09:14:05", 1772442845.0),  # no offset: read as UTC
        (datetime(2026, 3, 2, 9, 14, 5, tzinfo=UTC), 1772442845.0),
        (datetime(2026, 3, 2, 11, 14, 5, tzinfo=timezone(timedelta(hours=2))), 1772442845.0),
        (datetime(2026, 3, 2, 9, 14, 5), 1772442845.0),
        (1772442845, 1772442845.0),
        ("", None),
        ("yesterday", None),
        ("2026-13-02T09:14:05Z", None),
        (None, None),
        (True, None),
        (float("nan"), None),
        ([], None),
    ],
)
def test_parse_time(value: object, expected: float | None) -> None:
    assert parse_time(value) == expected
