"""Kueue objects of both API versions, and Kueue's own words, parsed into the model's types.

Fixtures under tests/fixtures/kueue/ are HyperPod-shaped objects, each validated against the
real Kueue CRDs first (tests/crds.py), so a parse test can never pass on a field no cluster
would store. Preemption messages are quoted from Kueue's source at the version named beside
each one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cluster.objects import DomainAssignment, FlavorQuota, PreemptionNote, TopologyRequest
from exporter.cluster.parse.kueue import (
    MAX_DOMAINS,
    PREEMPTED_REASONS,
    decode_topology_assignment,
    parse_cluster_queue,
    parse_local_queue,
    parse_preemption_message,
    parse_priority_class,
    parse_quantity,
    parse_resource_flavor,
    parse_topology,
    parse_workload,
    reason_for_cause,
    topology_request,
)
from tests.conftest import executed_lines, reference
from tests.crds import assert_valid_kueue, kueue_validator

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kueue"
LAYER1 = "topology.k8s.aws/network-node-layer-1"
LAYER2 = "topology.k8s.aws/network-node-layer-2"
LAYER3 = "topology.k8s.aws/network-node-layer-3"
HOSTNAME = "kubernetes.io/hostname"


def fixture(name: str) -> dict[str, Any]:
    with (FIXTURES / name).open() as handle:
        obj: dict[str, Any] = yaml.safe_load(handle)
    return obj


# --- fixtures and the CRD validator --------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_fixture_is_valid_against_the_kueue_crds(path: Path) -> None:
    with path.open() as handle:
        for obj in yaml.safe_load_all(handle):
            assert_valid_kueue(obj)


def test_validator_rejects_a_misspelled_field_and_a_wrong_type() -> None:
    workload = fixture("workload-v1beta2-admitted-tas.yaml")
    workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resouces"] = {}
    workload["spec"]["priority"] = "high"
    with pytest.raises(AssertionError) as raised:
        assert_valid_kueue(workload)
    message = str(raised.value)
    assert "'resouces' was unexpected" in message
    assert "spec.podSets[0].template.spec.containers[0]" in message
    assert "spec.priority: 'high' is not of type 'integer'" in message


def test_validator_knows_which_version_has_which_field() -> None:
    queue = fixture("clusterqueue-v1beta2.yaml")
    as_v1beta1 = kueue_validator("ClusterQueue", "v1beta1")
    queue["apiVersion"] = "kueue.x-k8s.io/v1beta1"
    assert any("'cohortName' was unexpected" in p for p in as_v1beta1(queue))
    queue["spec"]["cohort"] = queue["spec"].pop("cohortName")
    assert as_v1beta1(queue) == []

    workload = fixture("workload-v1beta2-admitted-tas.yaml")
    workload["apiVersion"] = "kueue.x-k8s.io/v1beta1"  # slices and priorityClassRef are v1beta2
    problems = kueue_validator("Workload", "v1beta1")(workload)
    assert any("'priorityClassRef' was unexpected" in p for p in problems)
    assert any("'domains' is a required property" in p for p in problems)


def test_validator_checks_metadata_list_keys_formats_and_numeric_ranges() -> None:
    flavor = fixture("resourceflavor-v1beta2.yaml")
    flavor["metadata"]["namespace"] = "hyperpod-ns-research"  # cluster-scoped kind
    workload = fixture("workload-v1beta2-admitted-tas.yaml")
    del workload["metadata"]["namespace"]
    workload["spec"]["podSets"].append(copy.deepcopy(workload["spec"]["podSets"][0]))
    workload["status"]["conditions"][0]["lastTransitionTime"] = "yesterday"
    workload["spec"]["priority"] = 2**40  # format: int32

    assert kueue_validator("ResourceFlavor", "v1beta2")(flavor) == [
        "metadata.namespace: set on cluster-scoped ResourceFlavor"
    ]
    problems = "\n".join(kueue_validator("Workload", "v1beta2")(workload))
    assert "metadata.namespace: None is not a DNS-1123 label" in problems
    assert "spec.podSets: duplicate keys ['name'] [\"worker\"]" in problems
    assert "status.conditions[0].lastTransitionTime: 'yesterday' is not a 'date-time'" in problems
    assert "spec.priority" in problems and "int32" in problems


def test_validator_refuses_unknown_kinds_and_versions() -> None:
    with pytest.raises(AssertionError, match="not served"):
        kueue_validator("Workload", "v1alpha1")
    with pytest.raises(AssertionError, match="no Kueue CRD"):
        kueue_validator("Wokload", "v1beta2")
    with pytest.raises(AssertionError, match="not a Kueue object"):
        assert_valid_kueue({"kind": "Workload"})


# --- preemption messages -------------------------------------------------------------------

PREEMPTOR = "0d6f2b8e-4c1a-4e59-9f3e-7a2b1c0d9e11"
JOB = "6b1e9c44-2f0d-4a8b-b3c5-19d0e2f7a6c3"

# (message, expected note, expected Preempted reason)
MESSAGES = [
    # Kueue v0.3-v0.6, pkg/scheduler/preemption/preemption.go applyPreemptionWithSSA:
    # workload.SetEvictedCondition(w, kueue.WorkloadEvictedByPreemption, <this text>)
    (
        "Preempted to accommodate a higher priority Workload",
        PreemptionNote("", "", (), (), "", "v0.4"),
        "Unknown",
    ),
    # Kueue v0.3-v0.6, same file, IssuePreemptions: recorder.Eventf(target.Obj, Normal,
    # "Preempted", "Preempted by another workload in the %s", origin)
    (
        "Preempted by another workload in the ClusterQueue",
        PreemptionNote("", "", (), (), "in the ClusterQueue", "v0.4"),
        "InClusterQueue",
    ),
    # Kueue v0.7, same file, IssuePreemptions:
    # fmt.Sprintf("Preempted to accommodate a workload (UID: %s) in the %s", preemptor UID, origin)
    (
        f"Preempted to accommodate a workload (UID: {PREEMPTOR}) in the cohort",
        PreemptionNote(PREEMPTOR, "", (), (), "in the cohort", "v0.7"),
        "InCohortReclamation",
    ),
    # Kueue v0.8-v0.10, same file: fmt.Sprintf("Preempted to accommodate a workload (UID: %s)
    # due to %s", preemptor.Obj.UID, HumanReadablePreemptionReasons[target.Reason])
    (
        "Preempted to accommodate a workload (UID: d34468c2-1ce5-47cd-a61d-689be78b6121)"
        " due to prioritization in the ClusterQueue",
        PreemptionNote(
            "d34468c2-1ce5-47cd-a61d-689be78b6121",
            "",
            (),
            (),
            "prioritization in the ClusterQueue",
            "v0.10",
        ),
        "InClusterQueue",
    ),
    # Kueue v0.8-v0.10 HumanReadablePreemptionReasons spelled fair sharing in lower case
    (
        f"Preempted to accommodate a workload (UID: {PREEMPTOR}) due to fair sharing within the"
        " cohort",
        PreemptionNote(PREEMPTOR, "", (), (), "fair sharing within the cohort", "v0.10"),
        "InCohortFairSharing",
    ),
    # Kueue v0.11-v0.14, same file, preemptionMessage (kubernetes-sigs/kueue#4524):
    # "Preempted to accommodate a workload (UID: %s, JobUID: %s) due to %s"
    (
        f"Preempted to accommodate a workload (UID: {PREEMPTOR}, JobUID: {JOB}) due to"
        " reclamation within the cohort while borrowing",
        PreemptionNote(
            PREEMPTOR, JOB, (), (), "reclamation within the cohort while borrowing", "v0.11"
        ),
        "InCohortReclaimWhileBorrowing",
    ),
    # Kueue v0.11+ writes UNKNOWN for a preemptor without the job-uid label (issue #7067 quotes
    # this one from a cluster)
    (
        "Preempted to accommodate a workload (UID: df90xyz9e-qq69-1297-98eb-abcd3e7bcd46, JobUID:"
        " UNKNOWN) due to Fair Sharing within the cohort",
        PreemptionNote(
            "df90xyz9e-qq69-1297-98eb-abcd3e7bcd46",
            "",
            (),
            (),
            "Fair Sharing within the cohort",
            "v0.11",
        ),
        "InCohortFairSharing",
    ),
    # Kueue v0.15+, same file (kubernetes-sigs/kueue#7522), the example in CHANGELOG-0.15.md:
    # "...due to %s; preemptor path: %s; preemptee path: %s", paths "/" + cohorts... + "/" + cq
    (
        "Preempted to accommodate a workload (UID: wl-in, JobUID: job-in) due to reclamation"
        " within the cohort; preemptor path: /r/c/q; preemptee path: /r/q_borrowing",
        PreemptionNote(
            "wl-in",
            "job-in",
            ("r", "c", "q"),
            ("r", "q_borrowing"),
            "reclamation within the cohort",
            "v0.15",
        ),
        "InCohortReclamation",
    ),
    # Kueue v0.15+ with nothing known: cmp.Or(x, "UNKNOWN") for UID, JobUID, both paths and,
    # for an empty reason, HumanReadablePreemptionReasons[""] == "UNKNOWN"
    (
        "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to UNKNOWN;"
        " preemptor path: UNKNOWN; preemptee path: UNKNOWN",
        PreemptionNote("", "", (), (), "UNKNOWN", "v0.15"),
        "Unknown",
    ),
    # Kueue with priority boost (kubernetes-sigs/kueue#9120): the Event on the preemptee appends
    # effective priorities to the condition message (quoted from preemption_test.go)
    (
        "Preempted to accommodate a workload (UID: wl-foo, JobUID: job-foo) due to prioritization"
        " in the ClusterQueue; preemptor path: /tas-main; preemptee path: /tas-main; preemptor"
        " effective priority: 3 (base: 3, boost: 0); preemptee effective priority: 1 (base: 1,"
        " boost: 0)",
        PreemptionNote(
            "wl-foo",
            "job-foo",
            ("tas-main",),
            ("tas-main",),
            "prioritization in the ClusterQueue",
            "v0.15",
        ),
        "InClusterQueue",
    ),
    # Kueue v0.20 (alpha ConfigurablePreemptions): HumanReadablePreemptionReasons maps
    # ConfigurablePreemption to "the configured preemption rules"
    (
        "Preempted to accommodate a workload (UID: wl-hero, JobUID: job-hero) due to the"
        " configured preemption rules; preemptor path: /org/hero-cq; preemptee path: /org/batch-cq",
        PreemptionNote(
            "wl-hero",
            "job-hero",
            ("org", "hero-cq"),
            ("org", "batch-cq"),
            "the configured preemption rules",
            "v0.15",
        ),
        "ConfigurablePreemption",
    ),
]


@pytest.mark.parametrize(
    ("message", "note", "reason"), MESSAGES, ids=[m[1].format for m in MESSAGES]
)
def test_each_preemption_message_format_names_preemptor_paths_and_cause(
    message: str, note: PreemptionNote, reason: str
) -> None:
    parsed = parse_preemption_message(message)
    assert parsed == note
    assert reason_for_cause(parsed.cause) == reason
    assert reason in (*PREEMPTED_REASONS, "Unknown")


def test_a_message_wrapped_by_yaml_or_kubectl_still_parses() -> None:
    wrapped = (
        f"Preempted to accommodate a workload (UID: {PREEMPTOR},\n    JobUID: {JOB}) due to"
        " prioritization in the\n    ClusterQueue"
    )
    parsed = parse_preemption_message(wrapped)
    assert parsed is not None
    assert (parsed.preemptor_uid, parsed.preemptor_job_uid) == (PREEMPTOR, JOB)
    assert reason_for_cause(parsed.cause) == "InClusterQueue"


@pytest.mark.parametrize(
    "message",
    [
        "",
        "The workload is deactivated",
        "Exceeded the PodsReady timeout hyperpod-ns-research/pytorchjob-llama3-70b-pretrain-3f9a1",
        # the Event on the preemptor names its victim, not its preemptor
        "Preempted workload hyperpod-ns-platform/pytorchjob-bert-sweep-17-5d0e2 (UID: 3e8d1f60)"
        " in ClusterQueue hyperpod-ns-platform-clusterqueue",
        "Preempted to accommodate a workload (UID: x) because it felt like it",
        "Preempted to accommodate a workload (UID: x) in the datacenter",
    ],
)
def test_other_messages_are_not_mistaken_for_preemptions(message: str) -> None:
    assert parse_preemption_message(message) is None


def test_reason_for_cause_reads_every_phrase_kueue_used() -> None:
    assert reason_for_cause("Fair Sharing within the cohort") == "InCohortFairSharing"
    assert reason_for_cause("fair sharing  within the cohort") == "InCohortFairSharing"
    assert reason_for_cause("reclamation within the cohort") == "InCohortReclamation"
    assert reason_for_cause("UNKNOWN") == "Unknown"
    assert reason_for_cause("") == "Unknown"
    assert reason_for_cause("gremlins") == "Unknown"


def test_the_victim_fixture_names_the_admitted_fixture_as_its_preemptor() -> None:
    victim = parse_workload(fixture("workload-v1beta2-preempted.yaml"))
    preemptor = parse_workload(fixture("workload-v1beta2-admitted-tas.yaml"))
    preempted = victim.condition("Preempted")
    assert preempted is not None and preempted.reason == "InCohortReclamation"
    note = parse_preemption_message(preempted.message)
    assert note is not None
    assert (note.preemptor_uid, note.preemptor_job_uid) == (preemptor.uid, preemptor.job_uid)
    assert note.preemptor_path[-1] == preemptor.cluster_queue
    assert note.preemptee_path[-1] == "hyperpod-ns-platform-clusterqueue"


# --- TAS topology assignments --------------------------------------------------------------


def _domains(*pairs: tuple[tuple[str, ...], int]) -> tuple[DomainAssignment, ...]:
    return tuple(DomainAssignment(values, count) for values, count in pairs)


def test_the_documented_slices_examples_decode_to_the_nodes_the_docs_name() -> None:
    # site/content/en/docs/tasks/manage/setup_topology_aware_scheduling.md: prefix "kind-worker"
    # with roots "" and "2" "represents the node names kind-worker and kind-worker2".
    with reference("kueue/examples/03_tas_topologyAssignment_v1beta2_slices.json").open() as f:
        first, second = json.load(f)["examples"]
    assert decode_topology_assignment(first) == (
        (HOSTNAME,),
        _domains((("kind-worker",), 7), (("kind-worker2",), 3)),
    )
    assert decode_topology_assignment(second) == (
        (HOSTNAME,),
        _domains((("kind-worker2",), 4), (("kind-worker8",), 2)),
    )


BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"

# The v1beta2 Workload CRD's description of topologyAssignment (reference/kueue/crds), Examples
# 1 and 2, each stated there to be the slices form of the v1beta1 Example 1 in 04_*.yaml.
CRD_SLICES_EXAMPLES = [
    {
        "levels": [BLOCK, RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"roots": ["block-1", "block-1"]}},
                    {"individual": {"roots": ["rack-1", "rack-2"]}},
                ],
                "podCounts": {"individual": [4, 2]},
            }
        ],
    },
    {
        "levels": [BLOCK, RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "block-1"},
                    {"individual": {"prefix": "rack-", "roots": ["1", "2"]}},
                ],
                "podCounts": {"individual": [4, 2]},
            }
        ],
    },
]


def test_both_forms_of_the_crd_examples_decode_to_the_same_domains() -> None:
    with reference("kueue/examples/04_tas_topologyAssignment_v1beta1_domains.yaml").open() as f:
        block_rack, hostnames = (doc["topologyAssignment"] for doc in yaml.safe_load_all(f))
    expected = ((BLOCK, RACK), _domains((("block-1", "rack-1"), 4), (("block-1", "rack-2"), 2)))
    assert decode_topology_assignment(block_rack) == expected
    for slices in CRD_SLICES_EXAMPLES:
        assert decode_topology_assignment(slices) == expected
    assert decode_topology_assignment(hostnames) == (
        (HOSTNAME,),
        _domains((("hostname-1",), 4), (("hostname-2",), 2)),
    )


def test_several_slices_with_suffixes_and_universal_counts_keep_their_order() -> None:
    # CRD Examples 3 and 4: one slice with a long prefix, or two slices with longer ones.
    one_slice = {
        "levels": [HOSTNAME],
        "slices": [
            {
                "domainCount": 3,
                "valuesPerLevel": [
                    {
                        "individual": {
                            "prefix": "block-1-rack-",
                            "roots": ["1-node-1", "1-node-2", "2-node-1"],
                        }
                    }
                ],
                "podCounts": {"universal": 1},
            }
        ],
    }
    two_slices = {
        "levels": [HOSTNAME],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"prefix": "block-1-rack-1-node-", "roots": ["1", "2"]}}
                ],
                "podCounts": {"universal": 1},
            },
            {
                "domainCount": 1,
                "valuesPerLevel": [
                    {"individual": {"prefix": "block-1-", "suffix": "-node-1", "roots": ["rack-2"]}}
                ],
                "podCounts": {"individual": [1]},
            },
        ],
    }
    expected = _domains(
        (("block-1-rack-1-node-1",), 1),
        (("block-1-rack-1-node-2",), 1),
        (("block-1-rack-2-node-1",), 1),
    )
    assert decode_topology_assignment(one_slice)[1] == expected
    assert decode_topology_assignment(two_slices)[1] == expected


def _slices_assignment(n: int) -> dict[str, Any]:
    return {
        "levels": [LAYER3, HOSTNAME],
        "slices": [
            {
                "domainCount": n,
                "valuesPerLevel": [
                    {"universal": "nn-0e5f2c8a1d7b3946c"},
                    {
                        "individual": {
                            "prefix": "hyperpod-i-",
                            "roots": [f"{i:017x}" for i in range(n)],
                        }
                    },
                ],
                "podCounts": {"universal": 1},
            }
        ],
    }


@pytest.mark.parametrize(
    ("assignment", "complaint"),
    [
        ([], "must be an object"),
        ({"domains": []}, "levels must be a non-empty list"),
        ({"levels": [HOSTNAME]}, "neither domains (v1beta1) nor slices (v1beta2)"),
        ({"levels": [HOSTNAME, 7], "domains": []}, "not a label key"),
        (
            {"levels": [BLOCK, RACK], "domains": [{"values": ["b1"], "count": 1}]},
            "2 string(s), one per level",
        ),
        (
            {"levels": [HOSTNAME], "domains": [{"values": ["n1"], "count": 0}]},
            "count must be a positive",
        ),
        ({"levels": [HOSTNAME], "domains": {"values": ["n1"]}}, "domains must be a list"),
        (
            {
                "levels": [HOSTNAME],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            "roots must be a list of domainCount (2) strings",
        ),
        (
            {
                "levels": [HOSTNAME],
                "slices": [
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "a", "individual": {"roots": ["a"]}}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            "exactly one of universal, individual",
        ),
        (
            {
                "levels": [HOSTNAME],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"universal": "a"}],
                        "podCounts": {"individual": [1]},
                    }
                ],
            },
            "podCounts.individual must be a list of domainCount (2) counts",
        ),
        (
            {
                "levels": [BLOCK, RACK],
                "slices": [
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "a"}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            "one entry per level (2)",
        ),
        (
            {
                "levels": [HOSTNAME],
                "slices": [
                    {
                        "domainCount": 2**31 - 1,
                        "valuesPerLevel": [{"universal": "a"}],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            f"more than {MAX_DOMAINS} domains",
        ),
    ],
)
def test_a_malformed_assignment_is_refused_with_a_reason(assignment: Any, complaint: str) -> None:
    with pytest.raises(ValueError) as raised:
        decode_topology_assignment(assignment)
    assert complaint in str(raised.value)


def test_a_malformed_assignment_costs_the_placement_not_the_workload() -> None:
    obj = fixture("workload-v1beta2-admitted-tas.yaml")
    assignment = obj["status"]["admission"]["podSetAssignments"][0]
    assignment["topologyAssignment"]["slices"][0]["podCounts"] = {"individual": [1, 1]}
    workload = parse_workload(obj)
    assert workload.cluster_queue == "hyperpod-ns-research-clusterqueue"
    (placement,) = workload.placements
    assert (placement.name, placement.count, placement.levels, placement.domains) == (
        "worker",
        4,
        (),
        (),
    )
    assert workload.problems == (
        "status.admission.podSetAssignments[0].topologyAssignment: slices[0].podCounts.individual"
        " must be a list of domainCount (4) counts",
    )


def test_a_huge_assignment_parses_whole_and_in_linear_time() -> None:
    obj = fixture("workload-v1beta2-admitted-tas.yaml")
    obj["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = _slices_assignment(
        10_000
    )
    workload = parse_workload(obj)
    (placement,) = workload.placements
    assert len(placement.domains) == 10_000
    assert placement.domains[9_999] == DomainAssignment(
        ("nn-0e5f2c8a1d7b3946c", f"hyperpod-i-{9_999:017x}"), 1
    )
    assert workload.problems == ()

    # Counted work needs no big inputs to show its growth (and a quadratic bug fails fast).
    domains = [{"values": ["nn-1", f"node-{i}"], "count": 2} for i in range(4_000)]
    v1beta1 = {"levels": [LAYER3, HOSTNAME], "domains": domains}
    small = {"levels": [LAYER3, HOSTNAME], "domains": domains[:400]}
    big_slices, small_slices = _slices_assignment(4_000), _slices_assignment(400)
    # Ten times the domains may cost ten times the work, never a hundred (quadratic). The work
    # is counted in Python lines run, not timed: a timing flakes on a busy CI machine.
    for big_input, small_input in ((v1beta1, small), (big_slices, small_slices)):
        big = executed_lines(lambda b=big_input: decode_topology_assignment(b))
        little = executed_lines(lambda s=small_input: decode_topology_assignment(s))
        assert big <= 10 * little + 1_000, (big, little)


# --- topology requests ---------------------------------------------------------------------


def test_topology_requests_from_the_spec_and_from_annotations() -> None:
    admitted = parse_workload(fixture("workload-v1beta2-admitted-tas.yaml"))
    assert admitted.pod_sets[0].topology == TopologyRequest("required", LAYER3)

    v1beta1 = parse_workload(fixture("workload-v1beta1-admitted-tas.yaml"))
    assert [p.topology.mode for p in v1beta1.pod_sets] == ["none", "preferred"]
    assert v1beta1.pod_sets[1].topology.level == LAYER3

    pending = parse_workload(fixture("workload-v1beta2-pending-annotations.yaml"))
    assert pending.pod_sets[0].topology == TopologyRequest("preferred", LAYER2, LAYER3, 4)
    assert pending.problems == ()


def _pod_set(request: dict[str, Any] | None = None, **annotations: str) -> dict[str, Any]:
    pod_set: dict[str, Any] = {
        "name": "worker",
        "count": 8,
        "template": {
            "metadata": {
                "annotations": {
                    f"kueue.x-k8s.io/{k.replace('_', '-')}": v for k, v in annotations.items()
                }
            },
            "spec": {"containers": [{"name": "c"}]},
        },
    }
    if request is not None:
        pod_set["topologyRequest"] = request
    return pod_set


@pytest.mark.parametrize(
    ("pod_set", "expected"),
    [
        (_pod_set(podset_unconstrained_topology="true"), TopologyRequest("unconstrained", None)),
        (_pod_set(podset_unconstrained_topology="false"), TopologyRequest("none", None)),
        (_pod_set(podset_required_topology=HOSTNAME), TopologyRequest("required", HOSTNAME)),
        (_pod_set(), TopologyRequest("none", None)),
        (
            _pod_set(
                {"unconstrained": True, "podSetSliceRequiredTopology": LAYER3, "podSetSliceSize": 2}
            ),
            TopologyRequest("unconstrained", None, LAYER3, 2),
        ),
        # the spec wins over annotations Kueue has already copied into it
        (
            _pod_set({"required": LAYER2}, podset_required_topology=LAYER1),
            TopologyRequest("required", LAYER2),
        ),
        # the alpha multi-layer slices: the outermost layer is kept
        (
            _pod_set(
                {
                    "required": LAYER1,
                    "podsetSliceRequiredTopologyConstraints": [
                        {"topology": LAYER2, "size": 16},
                        {"topology": LAYER3, "size": 4},
                    ],
                }
            ),
            TopologyRequest("required", LAYER1, LAYER2, 16),
        ),
    ],
)
def test_topology_request_modes(pod_set: dict[str, Any], expected: TopologyRequest) -> None:
    problems: list[str] = []
    assert topology_request(pod_set, problems) == expected
    assert problems == []


@pytest.mark.parametrize("size", ["four", "0", "-2", "4.5"])
def test_a_malformed_slice_size_annotation_is_noted_and_the_slice_ignored(size: str) -> None:
    pod_set = _pod_set(
        podset_required_topology=LAYER2,
        podset_slice_required_topology=LAYER3,
        podset_slice_size=size,
    )
    problems: list[str] = []
    assert topology_request(pod_set, problems) == TopologyRequest("required", LAYER2)
    assert any("kueue.x-k8s.io/podset-slice-size" in p and "ignored" in p for p in problems)


# --- workloads -----------------------------------------------------------------------------


def test_a_v1beta2_workload_admitted_by_tas() -> None:
    workload = parse_workload(fixture("workload-v1beta2-admitted-tas.yaml"))
    assert workload.key == ("hyperpod-ns-research", "pytorchjob-llama3-70b-pretrain-3f9a1")
    assert workload.uid == PREEMPTOR and workload.job_uid == JOB
    assert workload.api_version == "kueue.x-k8s.io/v1beta2"
    assert workload.created == 1772442845.0  # 2026-03-02T09:14:05Z
    assert workload.queue_name == "hyperpod-ns-research-localqueue"
    assert (workload.priority_class, workload.priority) == ("training-priority", 100)
    assert (workload.owner, workload.owner_uid) == ("PyTorchJob/llama3-70b-pretrain", JOB)
    assert workload.active
    assert [(p.name, p.count, p.gpus_per_pod) for p in workload.pod_sets] == [("worker", 4, 8)]
    assert workload.gpus_requested == 32
    assert workload.cluster_queue == "hyperpod-ns-research-clusterqueue"
    (placement,) = workload.placements
    assert placement.flavors == (
        ("cpu", "ml.p5.48xlarge"),
        ("memory", "ml.p5.48xlarge"),
        ("nvidia.com/gpu", "ml.p5.48xlarge"),
        ("vpc.amazonaws.com/efa", "ml.p5.48xlarge"),
    )
    assert placement.levels == (HOSTNAME,)
    assert [d.values[0] for d in placement.domains] == [
        f"hyperpod-i-02f6a1c3d5e7b9a0c{i}" for i in range(1, 5)
    ]
    assert sum(d.count for d in placement.domains) == placement.count == 4
    assert workload.is_true("Admitted") and workload.is_true("PodsReady")
    pods_ready = workload.condition("PodsReady")
    assert pods_ready is not None and pods_ready.last_transition == 1772443001.532
    assert workload.requeue_count == 0
    assert workload.problems == ()


def test_a_v1beta1_workload_with_two_pod_sets_and_a_domains_assignment() -> None:
    workload = parse_workload(fixture("workload-v1beta1-admitted-tas.yaml"))
    assert (workload.priority_class, workload.priority) == ("fine-tuning-priority", 50)
    # master asks by request, worker by limit only; the GPU-less init container adds nothing
    assert [(p.name, p.count, p.gpus_per_pod) for p in workload.pod_sets] == [
        ("master", 1, 8),
        ("worker", 5, 8),
    ]
    master, worker = workload.placements
    assert (master.levels, master.domains) == ((), ())
    assert worker.levels == (LAYER1, LAYER2, LAYER3)
    assert [(d.values[2], d.count) for d in worker.domains] == [
        ("nn-0e5f2c8a1d7b3946c", 3),
        ("nn-7d2a6b0e4f1c8539a", 2),
    ]
    assert workload.problems == ()


def test_a_preempted_workload_is_back_in_its_queue_with_a_requeue_counted() -> None:
    workload = parse_workload(fixture("workload-v1beta2-preempted.yaml"))
    assert (workload.cluster_queue, workload.placements) == ("", ())
    assert workload.requeue_count == 1
    assert workload.is_true("Evicted") and not workload.is_true("Admitted")
    assert workload.priority_class == "experimentation-priority"


def test_an_assignment_without_count_takes_the_pod_set_count() -> None:
    obj = fixture("workload-v1beta1-admitted-tas.yaml")
    for assignment in obj["status"]["admission"]["podSetAssignments"]:
        del assignment["count"]
    assert [p.count for p in parse_workload(obj).placements] == [1, 5]


def test_a_workload_without_metadata_still_parses_with_a_note() -> None:
    obj = fixture("workload-v1beta2-admitted-tas.yaml")
    del obj["metadata"]
    workload = parse_workload(obj)
    assert (workload.namespace, workload.name, workload.uid) == ("", "", "")
    assert workload.gpus_requested == 32
    assert "metadata missing" in workload.problems

    obj = fixture("workload-v1beta2-admitted-tas.yaml")
    del obj["metadata"]["namespace"]
    assert "metadata.name or metadata.namespace missing" in parse_workload(obj).problems


def test_wrongly_typed_fields_become_notes_and_defaults() -> None:
    obj = fixture("workload-v1beta2-admitted-tas.yaml")
    obj["spec"]["priority"] = "high"
    obj["spec"]["active"] = "yes"
    obj["status"]["conditions"] = "Admitted"
    obj["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "nvidia.com/gpu"
    ] = "lots"
    workload = parse_workload(obj)
    assert (workload.priority, workload.active, workload.conditions) == (0, True, ())
    assert workload.pod_sets[0].gpus_per_pod == 0
    assert workload.problems == (
        "spec.podSets[0].template.spec.containers[0].resources:"
        " 'lots' is not a Kubernetes quantity",
        "spec.priority: expected an integer, got string 'high'",
        "spec.active: expected a boolean, got string",
        "status.conditions: expected a list, got string",
    )


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))


JUNK: tuple[Any, ...] = (None, 7, "x", [], {}, [{}], True, -1.5)


def test_no_field_of_any_wrong_type_makes_the_parser_raise() -> None:
    original = fixture("workload-v1beta1-admitted-tas.yaml")
    for path in _leaves(original):
        for junk in JUNK:
            obj: Any = copy.deepcopy(original)
            if not path:
                obj = junk
            else:
                parent = obj
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = junk
            workload = parse_workload(obj)
            assert not any(p.startswith("unexpected") for p in workload.problems), (path, junk)


# --- queues, flavors, topologies, priority classes -----------------------------------------


def test_a_v1beta2_cluster_queue_quota_usage_and_policy() -> None:
    queue = parse_cluster_queue(fixture("clusterqueue-v1beta2.yaml"))
    assert (queue.name, queue.cohort) == ("hyperpod-ns-research-clusterqueue", "hyperpod-cohort")
    assert queue.gpu_quotas == (FlavorQuota("ml.p5.48xlarge", 64, 32, 16),)
    assert (queue.nominal, queue.lendable) == (64, 16)
    assert (queue.used, queue.reserved, queue.borrowed) == (80, 80, 16)
    assert (queue.pending_workloads, queue.admitted_workloads) == (1, 3)
    assert queue.preemption == (
        ("borrowWithinCohort.maxPriorityThreshold", "50"),
        ("borrowWithinCohort.policy", "LowerPriority"),
        ("reclaimWithinCohort", "LowerPriority"),
        ("withinClusterQueue", "LowerPriority"),
    )


def test_a_v1beta1_cluster_queue_over_two_flavors() -> None:
    queue = parse_cluster_queue(fixture("clusterqueue-v1beta1.yaml"))
    assert queue.cohort == "hyperpod-cohort"
    assert queue.gpu_quotas == (
        FlavorQuota("ml.p5.48xlarge", 16, 8, 0),
        FlavorQuota("ml.p5e.48xlarge", 16, None, None),
    )
    assert (queue.nominal, queue.lendable) == (32, 16)
    assert (queue.used, queue.reserved, queue.borrowed) == (16, 24, 0)
    assert (queue.pending_workloads, queue.admitted_workloads) == (2, 2)
    assert queue.preemption == (
        ("reclaimWithinCohort", "Any"),
        ("withinClusterQueue", "LowerOrNewerEqualPriority"),
    )


def test_a_malformed_cluster_queue_quota_is_noted_not_raised() -> None:
    obj = fixture("clusterqueue-v1beta2.yaml")
    gpu = obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    gpu["nominalQuota"] = "lots"
    obj["status"]["flavorsUsage"] = {"ml.p5.48xlarge": 80}
    problems: list[str] = []
    queue = parse_cluster_queue(obj, problems)
    assert queue.gpu_quotas == (FlavorQuota("ml.p5.48xlarge", 0, 32, 16),)
    assert queue.used == 0 and queue.reserved == 80
    assert problems == [
        "status.flavorsUsage: expected a list, got object",
        "spec.resourceGroups[0].flavors[0].nominalQuota: 'lots' is not a Kubernetes quantity",
    ]


def test_local_queue_flavor_topology_and_priority_class() -> None:
    assert parse_local_queue(fixture("localqueue-v1beta2.yaml")) == parse_local_queue(
        {
            "metadata": {
                "namespace": "hyperpod-ns-research",
                "name": "hyperpod-ns-research-localqueue",
            },
            "spec": {"clusterQueue": "hyperpod-ns-research-clusterqueue"},
        }
    )
    flavor = parse_resource_flavor(fixture("resourceflavor-v1beta2.yaml"))
    assert flavor.name == "ml.p5.48xlarge"
    assert flavor.node_labels == (("node.kubernetes.io/instance-type", "ml.p5.48xlarge"),)
    assert flavor.topology_name == "hyperpod-network-topology"
    topology = parse_topology(fixture("topology-v1beta2.yaml"))
    assert topology.levels == (LAYER1, LAYER2, LAYER3, HOSTNAME)
    priority = parse_priority_class(fixture("workloadpriorityclass-v1beta2.yaml"))
    assert (priority.name, priority.value) == ("training-priority", 100)
    scheduling = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "inference-priority"},
        "value": 1000,
    }
    assert parse_priority_class(scheduling).value == 1000


def test_small_parsers_note_what_they_cannot_read(caplog: pytest.LogCaptureFixture) -> None:
    problems: list[str] = []
    topology = parse_topology(
        {"metadata": {"name": "t"}, "spec": {"levels": [{"nodeLabel": LAYER1}, {}]}}, problems
    )
    assert topology.levels == (LAYER1,)
    assert problems == ["spec.levels[1].nodeLabel missing"]
    with caplog.at_level("WARNING"):
        queue = parse_local_queue(["not", "an", "object"])  # type: ignore[arg-type]
    assert queue.cluster_queue == ""
    assert "expected an API object, got list" in caplog.text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("8", 8.0),
        (8, 8.0),
        ("500m", 0.5),
        ("1Ki", 1024.0),
        ("1Gi", 2.0**30),
        ("2e3", 2000.0),
        ("1.5k", 1500.0),
        ("+3", 3.0),
        (".5", 0.5),
    ],
)
def test_quantities(value: str | int, expected: float) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value", ["", "eight", "1Zi", "1e400", "8 GPUs", True])
def test_not_quantities(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_quantity(value)
