"""Issue 14, item 5: the optional `deep-check` rung of the remediation ladder.

A rule that lists it, `[reboot, deep-check, replace]`, asks HyperPod for a deep health check
(SageMaker StartClusterHealthCheck) before it replaces a node, and replaces only when the check's
result, read back from the node's `sagemaker.amazonaws.com/deep-health-check-status` label, is
`Failed`. The request goes through botocore's Stubber on a real SageMaker client, so a parameter
the model does not know, or a wrong shape, fails validation; the controller runs on the fake
clock and recording writer of tests/remediation/test_remediation_controller.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from exporter.cluster.run import RemediationConfigError, controller_from_mapping, kube_api_client
from healthcheck.remediation.audit import node_event
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.policy import PolicyConfig, parse_ladder
from healthcheck.remediation.providers.base import ActionRequest
from healthcheck.remediation.providers.sagemaker import SageMakerNodes
from healthcheck.remediation.state import ANNOTATION as STATE
from healthcheck.remediation.state import (
    LadderMark,
    RemediationState,
    dump_state,
    parse_state,
)
from tests.remediation.test_remediation_controller import (
    T0,
    Clock,
    DictWriter,
    Recorder,
    feed,
    node,
    trail,
)
from tests.remediation.test_remediation_lifecycle import H, alert, alerts, records, xid79

CLUSTER = "ml-cluster"
ARN = "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef012345"
ID, OTHER = "i-0123456789abcdef0", "i-0fedcba9876543210"
NAME, OTHER_NAME = f"hyperpod-{ID}", f"hyperpod-{OTHER}"
GROUP = "worker-group-1"
GROUP_LABEL = "sagemaker.amazonaws.com/instance-group-name"
DHC = "sagemaker.amazonaws.com/deep-health-check-status"

# What an admin writes in remediation.yaml to put the rung on XID 79's ladder.
ADMIN_YAML = f"""
mode: act
providers:
  - {{name: sagemaker-api, cluster: {CLUSTER}, region: us-east-1, deep_checks: [InstanceStress]}}
budget: {{nodes: 2, percent: 0}}
cooldown_seconds: 600
ladder:
  rules:
    - {{name: xid-79, check: xid, xid: [79], steps: [reboot, deep-check, replace]}}
deep_check: {{timeout_seconds: 7200, on_timeout: alert, retry_seconds: 300}}
"""
CONFIG, _problems = PolicyConfig.from_mapping(yaml.safe_load(ADMIN_YAML))
assert _problems == []


def request_for(*members: tuple[str, list[str]], checks: list[str] | None = None) -> dict[str, Any]:
    """The StartClusterHealthCheck parameters for (instance group, instance ids) pairs."""
    return {
        "ClusterName": CLUSTER,
        "DeepHealthCheckConfigurations": [
            {
                "InstanceGroupName": group,
                "InstanceIds": ids,
                "DeepHealthChecks": checks or ["InstanceStress"],
            }
            for group, ids in members
        ],
    }


def reboot_of(instance: str) -> dict[str, Any]:
    return {"ClusterName": CLUSTER, "NodeIds": [instance]}


def sagemaker_client() -> Any:
    return boto3.client(
        "sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def hp_node(
    name: str = NAME,
    findings: list[dict[str, Any]] | None = None,
    dhc: str | None = "Passed",
    **notes: str,
) -> dict[str, Any]:
    """A HyperPod Node: instance group label, and the deep-health label as HyperPod left it."""
    labels = {GROUP_LABEL: GROUP}
    if dhc is not None:
        labels[DHC] = dhc
    return node(name, findings if findings is not None else [], labels, notes or None)


class Rig:
    """The controller with the SageMaker provider on a stubbed real client."""

    def __init__(self, config: PolicyConfig = CONFIG, extra: tuple[Any, ...] = ()) -> None:
        self.stub = Stubber(sagemaker_client())
        self.stub.activate()
        self.provider = SageMakerNodes(self.stub.client, CLUSTER, sleep=lambda _: None)
        self.writer = DictWriter()
        self.clock = Clock()
        self.controller = RemediationController(
            config, [self.provider, *extra], self.writer, clock=self.clock
        )

    def see(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        return feed(self.controller, obj)

    def state(self, name: str = NAME) -> RemediationState:
        return self.writer.states[name]

    def at_deep_check(self, before: str | None = "Passed") -> float:
        """XID 79, a reboot, healthy, XID 79 again an hour later: the deep check is asked for.
        Returns when the second failure was first seen."""
        self.stub.add_response("batch_reboot_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
        assert self.see(hp_node(findings=[xid79()], dhc=before)) == [(NAME, "act")]
        self.clock.now += 1800
        assert self.see(hp_node(dhc=before)) == []  # rebooted, reports healthy
        self.clock.now += H
        seen = self.clock.now - 30
        self.stub.add_response(
            "start_cluster_health_check", {"ClusterArn": ARN}, request_for((GROUP, [ID]))
        )
        assert self.see(hp_node(findings=[xid79(seen)], dhc=before)) == [(NAME, "act")]
        self.stub.assert_no_pending_responses()
        state = self.state()
        assert (state.action, state.outcome) == ("deep-check", "done")
        assert state.deep_check is not None and state.deep_check.waiting
        return seen

    def label(self, value: str | None, seen: float, advance: float = 0.0) -> list[tuple[str, str]]:
        """The node as HyperPod relabels it while the same failure is still reported."""
        self.clock.now += advance
        return self.see(hp_node(findings=[xid79(seen)], dhc=value))


@pytest.fixture
def rig() -> Iterator[Rig]:
    rig = Rig()
    yield rig
    rig.stub.assert_no_pending_responses()


def lifecycle(controller: RemediationController) -> list[tuple[str, str]]:
    return [(r["reason"], r["detail"]) for r in records(controller) if r["audit"] == "lifecycle"]


# --- the ladder -------------------------------------------------------------------------------


def test_the_parser_accepts_the_rung_between_reboot_and_replace_and_refuses_it_elsewhere() -> None:
    ladder, problems = parse_ladder(
        {"rules": [{"name": "x", "check": "xid", "steps": ["reboot", "deep-check", "replace"]}]}
    )
    assert problems == []
    rule = ladder.rule_named("x")
    assert rule is not None and [s.action for s in rule.steps] == [
        "reboot",
        "deep-check",
        "replace",
    ]
    # replace < deep-check goes down the ladder: a loop
    _, problems = parse_ladder(
        {"rules": [{"name": "x", "check": "xid", "steps": ["replace", "deep-check"]}]}
    )
    assert any("does not climb" in p for p in problems), problems
    # a check with nothing above it gates nothing
    _, problems = parse_ladder(
        {"rules": [{"name": "x", "check": "xid", "steps": ["reboot", "deep-check"]}]}
    )
    assert any("replace must follow it" in p for p in problems), problems
    # the built-in ladder does not include it
    assert all(step.action != "deep-check" for r in PolicyConfig().ladder.rules for step in r.steps)


def test_the_admin_yaml_builds_a_controller_that_can_run_the_rung() -> None:
    controller = controller_from_mapping(
        yaml.safe_load(ADMIN_YAML), kube_api_client("http://127.0.0.1:1")
    )
    [provider] = controller.providers
    assert isinstance(provider, SageMakerNodes) and provider.deep_checks == ("InstanceStress",)
    config = controller.config
    assert (config.deep_check_timeout_s, config.deep_check_on_timeout) == (7200.0, "alert")
    assert controller.status()["deep_check"]["checks"] == ["InstanceStress"]
    _, problems = PolicyConfig.from_mapping({"deep_check": {"on_timeout": "reboot", "wait": 1}})
    assert any("on_timeout" in p for p in problems) and any("'wait'" in p for p in problems)


def test_hyperpod_beside_the_api_may_run_a_ladder_with_the_rung_but_not_alone() -> None:
    """Only SageMaker's API can start a deep check; the controller leaves other providers out
    of it, so one capable provider is enough, and none is a start-up error naming the fix."""
    raw = yaml.safe_load(ADMIN_YAML)
    api = raw["providers"][0]
    raw["providers"] = [{"name": "hyperpod"}, api]
    controller = controller_from_mapping(raw, kube_api_client("http://127.0.0.1:1"))
    assert len(controller.providers) == 2
    raw["providers"] = [{"name": "hyperpod"}]
    with pytest.raises(RemediationConfigError, match="no provider can deep-check"):
        controller_from_mapping(raw, kube_api_client("http://127.0.0.1:1"))


# --- the request --------------------------------------------------------------------------------


def test_one_request_per_round_names_each_group_and_instance_never_a_whole_group() -> None:
    stub = Stubber(sagemaker_client())
    provider = SageMakerNodes(
        stub.client, CLUSTER, deep_checks=["InstanceStress", "InstanceConnectivity"]
    )
    third = "i-0aaaaaaaaaaaaaaaa"
    asked = [
        ActionRequest(NAME, "deep-check", hp_node(NAME)),
        ActionRequest(OTHER_NAME, "deep-check", hp_node(OTHER_NAME)),
        ActionRequest(
            f"hyperpod-{third}",
            "deep-check",
            {"metadata": {"labels": {GROUP_LABEL: "login-group"}}},
        ),
        ActionRequest("no-group", "deep-check", {"spec": {"providerID": f"aws:///z/{third}"}}),
    ]
    both = ["InstanceStress", "InstanceConnectivity"]
    stub.add_response(
        "start_cluster_health_check",
        {"ClusterArn": ARN},
        request_for(("login-group", [third]), (GROUP, sorted([ID, OTHER])), checks=both),
    )
    with stub:
        results = {r.node: r for r in provider.execute(asked)}
    stub.assert_no_pending_responses()
    assert all(results[n].ok for n in (NAME, OTHER_NAME, f"hyperpod-{third}"))
    # without its instance group label the node is refused, not sent as a whole group's check
    assert not results["no-group"].ok and GROUP_LABEL in results["no-group"].detail
    with pytest.raises(ValueError, match="InstanceStress"):
        SageMakerNodes(stub.client, CLUSTER, deep_checks=["DCGM"])


def test_a_request_the_model_does_not_allow_fails_validation() -> None:
    """The Stubber validates against the real model: the shape the provider sends is the API's."""
    from botocore.exceptions import ParamValidationError

    client = sagemaker_client()
    with Stubber(client) as stub:
        stub.add_response("start_cluster_health_check", {"ClusterArn": ARN})
        with pytest.raises(ParamValidationError, match="InstanceGroupName"):
            client.start_cluster_health_check(
                ClusterName=CLUSTER,
                DeepHealthCheckConfigurations=[
                    {"InstanceIds": [ID], "DeepHealthChecks": ["InstanceStress"]}
                ],
            )


# --- the scenarios ------------------------------------------------------------------------------


# label before the request, then (label, minutes after the request) → final action, last record
SCENARIOS: dict[str, tuple[str | None, list[tuple[str | None, int]], str, str]] = {
    "InProgress, then Failed: replaced": (
        "Passed",
        [("InProgress", 5), ("Failed", 50)],
        "replace",
        "deep_check_failed",
    ),
    "InProgress, then Passed: not replaced": (
        "Passed",
        [("InProgress", 5), ("Passed", 50)],
        "deep-check",
        "deep_check_passed",
    ),
    "InProgress at 1 h 59: still waiting": (
        "Passed",
        [("InProgress", 5), ("InProgress", 119)],
        "deep-check",
        "deep_check_running",
    ),
    "no label before, Failed (InProgress missed): replaced": (
        None,
        [("Failed", 40)],
        "replace",
        "deep_check_failed",
    ),
    "the old Passed never moves: timeout at 2 h, not replaced": (
        "Passed",
        [("Passed", 60), ("Passed", 121)],
        "deep-check",
        "deep_check_timeout",
    ),
    "an old Failed never moves: not this check's result; timeout": (
        "Failed",
        [("Failed", 60), ("Failed", 121)],
        "deep-check",
        "deep_check_timeout",
    ),
    "the label disappears: timeout": (
        "Passed",
        [("InProgress", 5), (None, 121)],
        "deep-check",
        "deep_check_timeout",
    ),
}


@pytest.mark.parametrize("row", sorted(SCENARIOS))
def test_scenarios(row: str) -> None:
    before, labels, action, last = SCENARIOS[row]
    rig = Rig()
    seen = rig.at_deep_check(before)
    start = rig.clock.now
    if action == "replace":
        rig.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    for value, minutes in labels:
        rig.clock.now = start + minutes * 60
        rig.label(value, seen)
    rig.stub.assert_no_pending_responses()
    assert rig.state().action == action
    assert lifecycle(rig.controller)[-1][0] == last


def test_failed_replaces_the_node(rig: Rig) -> None:
    seen = rig.at_deep_check()
    assert rig.state().attempts == 1  # the reboot; a deep check mends nothing, so it is no attempt
    # HyperPod starts the check: the node waits, no other action
    assert rig.label("InProgress", seen, advance=60) == [(NAME, "deep_check_running")]
    rig.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    assert rig.label("Failed", seen, advance=50 * 60) == [(NAME, "act")]
    state = rig.state()
    assert (state.action, state.outcome, state.attempts) == ("replace", "done", 2)
    [(_, failed)] = [r for r in lifecycle(rig.controller) if r[0] == "deep_check_failed"]
    assert failed.startswith("deep health check failed; the ladder's replace follows")
    act = [r for r in records(rig.controller) if r["verdict"] == "act"][-1]
    assert any("step 3/3 replace (deep health check failed)" in s for s in act["ladder"])


def test_passed_is_recorded_and_the_node_is_not_replaced(rig: Rig) -> None:
    seen = rig.at_deep_check()
    rig.label("InProgress", seen, advance=60)
    assert rig.label("Passed", seen, advance=40 * 60) == []  # nothing asked
    [(_, passed)] = [r for r in lifecycle(rig.controller) if r[0] == "deep_check_passed"]
    assert passed.startswith("deep health check passed; not replaced (")
    state = rig.state()
    assert (state.action, state.outcome) == ("deep-check", "checked")
    # the finding the check examined asks for nothing, past every cooldown
    assert rig.label("Passed", seen, advance=3 * H) == []
    [entry] = rig.controller.status()["nodes"]
    assert entry["requested"] is None
    assert entry["ladder"][0]["hold"] == "deep health check passed; not replaced"
    # a new occurrence after the check starts the rule over: a reboot, not a replacement
    rig.stub.add_response("batch_reboot_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    assert rig.label("Passed", rig.clock.now - 10) == [(NAME, "act")]
    assert rig.state().action == "reboot"


def test_in_progress_waits_and_takes_no_other_action_on_the_node(rig: Rig) -> None:
    seen = rig.at_deep_check()
    assert rig.label("InProgress", seen, advance=60) == [(NAME, "deep_check_running")]
    # 90 min later (past the cooldown), an alert asks for a reboot: still waiting, no call
    rig.clock.now += 90 * 60
    rig.controller.handle_alerts(alerts(alert(NAME)), rig.clock.now)
    assert [(d.action, d.reason) for d in rig.controller.run_once()] == [
        ("reboot", "deep_check_running")
    ]
    assert rig.label("InProgress", seen) == []  # the same skip is not audited again
    assert rig.state().outcome == "done"  # and the stub saw no call (nothing was stubbed)


def test_a_label_left_from_an_earlier_check_is_not_this_checks_result(rig: Rig) -> None:
    seen = rig.at_deep_check(before="Failed")  # an old check's Failed, still on the node
    assert rig.label("Failed", seen, advance=30 * 60) == [(NAME, "deep_check_running")]
    deep = rig.state().deep_check
    assert deep is not None and deep.waiting and not deep.seen_in_progress  # still waiting
    rig.label("InProgress", seen, advance=60)
    rig.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    assert rig.label("Failed", seen, advance=60) == [(NAME, "act")]


@pytest.mark.parametrize(
    ("on_timeout", "replaced"), [("alert", False), ("replace", True)], ids=["default", "escalate"]
)
def test_no_result_within_the_timeout_escalates_as_configured(
    on_timeout: str, replaced: bool
) -> None:
    rig = Rig(replace(CONFIG, deep_check_on_timeout=on_timeout))  # type: ignore[arg-type]
    seen = rig.at_deep_check()
    # the label never moves (HyperPod skipped the node, say)
    assert rig.label("Passed", seen, advance=119 * 60) == [(NAME, "deep_check_running")]
    if replaced:
        rig.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    got = rig.label("Passed", seen, advance=2 * 60)
    rig.stub.assert_no_pending_responses()
    assert got == ([(NAME, "act")] if replaced else [])
    assert rig.state().action == ("replace" if replaced else "deep-check")
    [timeout] = [r for r in records(rig.controller) if r["reason"] == "deep_check_timeout"]
    assert "no result within 2 h" in timeout["detail"]
    event = rig.writer.events[[e.reason for e in rig.writer.events].index("deep_check_timeout")]
    assert node_event(event)["type"] == "Warning"  # the alert
    assert node_event(event)["reason"] == "DeepHealthCheckTimedOut"


def test_a_conflict_is_retried_later_counted_logged_once_and_never_a_replace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="topowatch.audit")
    other = Rig()
    other.stub.add_response("batch_reboot_cluster_nodes", {"Successful": [OTHER]}, reboot_of(OTHER))
    assert other.see(hp_node(OTHER_NAME, [xid79()])) == [(OTHER_NAME, "act")]
    other.clock.now += 1800
    other.see(hp_node(OTHER_NAME))
    other.clock.now += H
    again = other.clock.now - 30
    conflict = request_for((GROUP, [OTHER]))
    for _ in range(2):
        other.stub.add_client_error(
            "start_cluster_health_check",
            "ConflictException",
            "A deep health check is already in progress on this cluster",
            400,
            expected_params=conflict,
        )
    sick = hp_node(OTHER_NAME, [xid79(again)])
    assert other.see(sick) == [(OTHER_NAME, "act")]
    state = other.state(OTHER_NAME)
    assert (state.action, state.outcome, state.attempts) == ("deep-check", "deferred", 1)
    assert [(m.step, m.performed) for m in state.ladder] == [(0, "reboot")]  # not climbed
    other.clock.now += 60
    assert other.see(sick) == [(OTHER_NAME, "deep_check_deferred")]
    other.clock.now += 300
    assert other.see(sick) == [(OTHER_NAME, "act")]  # asked again: still busy
    counts = other.controller.auditor.counts
    assert counts[("deferred", "provider", "deep-check")] == 2
    logged = [r for r in caplog.records if '"verdict": "deferred"' in r.getMessage()]
    assert len(logged) == 1
    # the cluster's other check ends; the next try starts this one; nothing was ever replaced
    other.stub.add_response("start_cluster_health_check", {"ClusterArn": ARN}, conflict)
    other.clock.now += 300
    assert other.see(sick) == [(OTHER_NAME, "act")]
    other.stub.assert_no_pending_responses()
    assert other.state(OTHER_NAME).outcome == "done"
    assert ("act", "replace") not in {(r[1], r[2]) for r in trail(other.controller)}


@pytest.mark.parametrize("outcome", ["done", "requested"], ids=["accepted", "crashed-before-call"])
def test_a_restarted_controller_resumes_waiting_and_starts_no_second_check(
    rig: Rig, outcome: str
) -> None:
    seen = rig.at_deep_check()
    written = replace(rig.state(), outcome=outcome)  # type: ignore[arg-type]
    note = dump_state(written)
    assert parse_state(note) == (written, None)  # the annotation holds the whole check
    # a new controller, empty memory, no response stubbed: any StartClusterHealthCheck would fail
    second = Rig()
    sick = hp_node(findings=[xid79(seen)], dhc="InProgress", **{STATE: note})
    second.clock.now = rig.clock.now + 20 * 60
    assert second.see(sick) == [(NAME, "deep_check_running")]
    assert written.deep_check is not None
    assert second.writer.states[NAME].deep_check == replace(
        written.deep_check, seen_in_progress=True
    )
    second.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    failed = hp_node(findings=[xid79(seen)], dhc="Failed", **{STATE: note})
    second.clock.now += 30 * 60
    assert second.see(failed) == [(NAME, "act")]
    second.stub.assert_no_pending_responses()
    assert second.writer.states[NAME].action == "replace"


# --- the safety rules apply as to any action ------------------------------------------------------


def at_step(name: str = NAME) -> dict[str, Any]:
    """A node whose XID 79 came back an hour after a reboot: its next step is the deep check."""
    reboot = RemediationState(
        "reboot",
        T0 - H,
        "sagemaker-api",
        1,
        "recovered",
        T0 - H + 1800,
        ladder=(LadderMark("xid-79", "gpu3", 0, "reboot", "reboot", T0 - H),),
    )
    return hp_node(name, [xid79(T0 - 30)], **{STATE: dump_state(reboot)})


def test_observe_mode_and_the_opt_out_label_start_no_check() -> None:
    watching = Rig(replace(CONFIG, mode="observe"))
    assert watching.see(at_step()) == [(NAME, "observe")]
    assert "would deep-check" in records(watching.controller)[-1]["detail"]
    acting = Rig()
    opted = at_step()
    opted["metadata"]["labels"]["topowatch.io/remediation"] = "disabled"
    assert acting.see(opted) == [(NAME, "opted_out")]
    # no response was stubbed: a call would have failed and shown as an outcome
    assert all(r["audit"] != "outcome" for r in records(acting.controller))


def test_a_check_holds_a_budget_slot_and_the_replace_it_leads_to_is_not_blocked() -> None:
    rig = Rig(replace(CONFIG, budget_nodes=1))
    seen = rig.at_deep_check()
    # another node needs a reboot: the node in its deep check is out of service, using the slot
    assert rig.see(hp_node(OTHER_NAME, [xid79()])) == [(OTHER_NAME, "budget_concurrent")]
    rig.label("InProgress", seen, advance=60)
    # the check fails 50 min after it started: the replace goes ahead, though the check started
    # within the hourly budget's window (the budget counts nodes: this node counts once)
    rig.stub.add_response("batch_replace_cluster_nodes", {"Successful": [ID]}, reboot_of(ID))
    assert rig.label("Failed", seen, advance=49 * 60) == [(NAME, "act")]
    rig.stub.assert_no_pending_responses()


def test_providers_that_cannot_run_a_check_stay_out_of_it() -> None:
    labeler = Recorder()  # declares nothing: reboot and replace, like the HyperPod labeler
    rig = Rig(extra=(labeler,))
    rig.stub.add_response(
        "start_cluster_health_check", {"ClusterArn": ARN}, request_for((GROUP, [ID]))
    )
    assert rig.see(at_step()) == [(NAME, "act")]
    # the labeler is left out, not failed: the check started and the node waits for it
    assert labeler.calls == [] and rig.state().outcome == "done"
    assert "cannot" not in rig.state().message
    assert json.loads(dump_state(rig.state()))["deep_check"]["checks"] == ["InstanceStress"]
