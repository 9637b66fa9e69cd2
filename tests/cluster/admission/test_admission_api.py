"""The admission check against the simulated Kubernetes API server through the official client:
the status patch keeps other controllers' entries, moves lastTransitionTime only on a change,
is refused on a stale resourceVersion (409) so a restart cannot write twice, survives 403 and
409, marks our AdmissionCheck Active (Kueue admits nothing through a check that is not), and
writes nothing in observe mode. Also the fail-open deadline and bad input."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.cluster.admission.audit import held_line
from exporter.cluster.admission.settings import AdmissionSettings
from exporter.cluster.admission.writer import KubeStatusWriter
from exporter.cluster.explain import explain_text
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.cluster.admission.world import (
    CHECK,
    NS,
    OTHER,
    T0,
    FakeWriter,
    World,
    admission_check,
    cluster_queue,
    entry,
    node,
    workload,
    xid,
)
from tests.crds import assert_valid_kueue

ENFORCE = AdmissionSettings(enabled=True, mode="enforce", fail_open_seconds=60)


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(ObjectStore(), bookmark_interval=0.1) as srv:
        yield srv


@pytest.fixture
def client(server: FakeApiServer) -> Iterator[kc.ApiClient]:
    config = kc.Configuration()
    config.host = server.url
    config.retries = False
    with kc.ApiClient(config) as api:
        yield api


def read(client: kc.ApiClient, version: str = "v1beta2", name: str = "train") -> Any:
    return kc.CustomObjectsApi(client).get_namespaced_custom_object(
        "kueue.x-k8s.io", version, NS, "workloads", name
    )


def api_world(
    server: FakeApiServer, client: kc.ApiClient, settings: AdmissionSettings = ENFORCE
) -> World:
    server.store.upsert("admissionchecks", admission_check())
    w = World(settings, KubeStatusWriter(client))
    w.add("ClusterQueue", cluster_queue([(CHECK, ()), (OTHER, ())]))
    w.add("Node", node("n1", findings=[xid()])).add("Node", node("n2"))
    return w


def entries(obj: Any) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in obj["status"]["admissionChecks"]}


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_retry_written_other_entries_kept(
    server: FakeApiServer, client: kc.ApiClient, version: str
) -> None:
    """SetAdmissionCheckState (pkg/workload/patching): our entry's state, message and
    lastTransitionTime change; the other controller's entry is left exactly as it was. The
    Workload is read and patched at `version`; the server converts."""
    w = api_world(server, client)
    other = entry(OTHER, "Ready", T0 + 7, "provisioned")
    server.store.upsert("workloads", workload(entries=[entry(CHECK, "Pending"), other]))
    live = read(client, version)
    assert_valid_kueue(live)
    w.add("Workload", live)
    [decision] = w.cycle()
    assert (decision["state"], decision["written"]) == ("Retry", "written")
    after = read(client, version)
    assert_valid_kueue(after)
    ours = entries(after)[CHECK]
    assert ours["state"] == "Retry"
    assert ours["message"] == "node n1: XID 79 on GPU 3 since 10:56:40Z"
    assert ours["lastTransitionTime"] == "2026-11-18T11:07:00Z"  # now: the state changed
    assert entries(after)[OTHER] == other
    patches = [x for x in server.exchanges("workloads/status") if x.verb == "PATCH"]
    assert [x.status for x in patches] == [200]


def test_transition_time_moves_only_with_the_state() -> None:
    """SetAdmissionCheckState (pkg/workload/patching): a new state sets lastTransitionTime to
    now; the same state with a new message keeps it; the same state and message is no write."""
    from exporter.cluster.admission.decide import Decision
    from exporter.cluster.admission.parse import parse_workload_checks
    from exporter.cluster.admission.writer import status_patch

    def patched(state: str, message: str, old_state: str, old_message: str) -> Any:
        raw = workload(
            entries=[entry(CHECK, old_state, T0 + 10, old_message), entry(OTHER, "Pending")]
        )
        checks = parse_workload_checks(raw)
        assert checks is not None
        decision = Decision(NS, "train", "u", CHECK, state, "healthy", message, T0 + 99, old_state)
        patch = status_patch(checks, decision, T0 + 99)
        return None if patch is None else entries(patch)[CHECK]["lastTransitionTime"]

    assert patched("Ready", "fit", "Pending", "") == "2026-11-18T11:08:19Z"
    assert patched("Ready", "fit again", "Ready", "fit") == "2026-11-18T11:06:50Z"
    assert patched("Ready", "fit", "Ready", "fit") is None


def test_retry_asks_kueue_to_wait_longer_each_time() -> None:
    """AdmissionCheckState.requeueAfterSeconds (apis/kueue/v1beta2 workload_types.go): "If nil
    when State=Retry, Kueue will retry immediately", back onto the same bad domains. Ours
    doubles with the entry's retryCount (Kueue increments it on each Retry), capped; a Ready
    answer carries none."""
    from exporter.cluster.admission.decide import Decision
    from exporter.cluster.admission.parse import parse_workload_checks
    from exporter.cluster.admission.writer import RETRY_MAX_S, status_patch

    def delay(state: str, retry_count: int | None) -> Any:
        ours = entry(CHECK, "Pending", T0 + 10, "")
        if retry_count is not None:
            ours["retryCount"] = retry_count
            ours["requeueAfterSeconds"] = 5
        raw = workload(entries=[ours, entry(OTHER, "Pending")])
        assert_valid_kueue(raw)
        checks = parse_workload_checks(raw)
        assert checks is not None
        decision = Decision(NS, "train", "u", CHECK, state, "unfit", "node n1", T0 + 99, "Pending")
        patch = status_patch(checks, decision, T0 + 99)
        assert patch is not None
        written = {**raw, "status": {**raw["status"], **patch["status"]}}
        assert_valid_kueue(written)
        return entries(patch)[CHECK].get("requeueAfterSeconds")

    delays = [delay("Retry", n) for n in (None, 0, 1, 2, 3, 10, 10**6)]
    assert delays[0] == delays[1] > 0
    assert delays[2] == 2 * delays[1] and delays[3] == 2 * delays[2]
    assert delays[-2] == delays[-1] == RETRY_MAX_S
    assert delay("Ready", 2) is None


def test_stale_copy_after_restart_cannot_write_twice(
    server: FakeApiServer, client: kc.ApiClient
) -> None:
    """A controller restarted mid-decision that still holds the copy read before its own write:
    its patch carries the old resourceVersion and is refused (409); from the fresh copy there is
    nothing to answer. One write in all."""
    w = api_world(server, client)
    server.store.upsert("workloads", workload(entries=[entry(CHECK, "Pending")]))
    stale = read(client)
    w.add("Workload", stale)
    assert w.cycle()[0]["written"] == "written"
    restarted = api_world(server, client)
    restarted.add("Workload", stale)
    [again] = restarted.cycle()
    assert again["written"] == "conflict"
    assert restarted.controller.audit.write_errors["conflict"] == 1
    restarted.add("Workload", read(client), "MODIFIED")
    assert restarted.cycle() == []
    oks = [x for x in server.exchanges("workloads/status") if x.verb == "PATCH" and x.status == 200]
    assert len(oks) == 1


@pytest.mark.parametrize(("status", "reason"), [(409, "conflict"), (403, "forbidden")])
def test_refused_patch_counted_and_retried(
    server: FakeApiServer, client: kc.ApiClient, status: int, reason: str
) -> None:
    w = api_world(server, client)
    server.store.upsert("workloads", workload(entries=[entry(CHECK, "Pending")]))
    w.add("Workload", read(client))
    w.controller.sync_checks(w.now)  # list the checks, mark ours Active,
    w.controller.sync_checks(w.now)  # and read it back: the failure below hits the patch
    server.fail_next(1, status)
    [refused] = w.cycle()
    assert refused["written"] == reason
    body = w.service.metrics_body(openmetrics=False).decode()
    assert f'topowatch_admission_write_errors_total{{reason="{reason}"}} 1' in body
    assert entries(read(client))[CHECK]["state"] == "Pending"
    [retried] = w.cycle()  # next cycle: the same verdict, written this time
    assert retried["written"] == "written"
    assert entries(read(client))[CHECK]["state"] == "Retry"


def test_admission_check_marked_active_in_enforce_mode(
    server: FakeApiServer, client: kc.ApiClient
) -> None:
    """Kueue's core never sets an AdmissionCheck's Active condition; the check's controller
    does (provisioning admissioncheck_reconciler.go), and a ClusterQueue listing an inactive
    check admits nothing. Bad parameters are reported, not turned into a stopped queue."""
    params = {"apiGroup": "example.com", "kind": "Thresholds", "name": "strict"}
    server.store.upsert("admissionchecks", admission_check(parameters=params))
    server.store.upsert(
        "admissionchecks", admission_check("prov", controller="kueue.x-k8s.io/provisioning-request")
    )
    w = World(ENFORCE, KubeStatusWriter(client))
    w.cycle()
    api = kc.CustomObjectsApi(client)
    ours = api.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", CHECK)
    assert_valid_kueue(ours)
    [active] = ours["status"]["conditions"]
    assert (active["type"], active["status"], active["reason"]) == ("Active", "True", "Active")
    assert "Thresholds strict" in active["message"] and "ignored" in active["message"]
    theirs = api.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", "prov")
    assert "status" not in theirs or not theirs["status"].get("conditions")
    assert any("Thresholds strict" in p for p in w.controller.problems)


def test_observe_mode_writes_nothing_and_records_once(
    server: FakeApiServer, client: kc.ApiClient
) -> None:
    w = api_world(server, client, AdmissionSettings(enabled=True))
    server.store.upsert("workloads", workload(entries=[entry(CHECK, "Pending")]))
    w.add("Workload", read(client))
    [decision] = w.cycle()
    assert (decision["state"], decision["written"], decision["mode"]) == (
        "Retry",
        "observe",
        "observe",
    )
    assert w.cycle() == []  # the same verdict again is not news
    assert [x for x in server.exchanges() if x.verb == "PATCH"] == []
    assert entries(read(client))[CHECK]["state"] == "Pending"
    ours = kc.CustomObjectsApi(client).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "admissionchecks", CHECK
    )
    assert "status" not in ours or not ours["status"].get("conditions")


def test_observe_mode_judges_workloads_before_any_queue_lists_the_check() -> None:
    """Observe mode, no entry anywhere yet: what enforcing would have answered, per workload
    with quota reserved, so an admin can look before the ClusterQueue patch."""
    w = World(AdmissionSettings(enabled=True), FakeWriter(checks=[]))
    w.add("ClusterQueue", cluster_queue([]))
    w.add("Node", node("n1", findings=[xid()])).add("Node", node("n2"))
    w.add("Workload", workload())
    [decision] = w.cycle()
    assert (decision["check"], decision["state"], decision["written"]) == (
        CHECK,
        "Retry",
        "observe",
    )
    assert w.writer.patches == []


def test_fail_open_deadline_for_unknown_nodes() -> None:
    """A topology assignment naming a node the model does not know cannot be judged: no answer
    until the deadline, counted from the entry's lastTransitionTime (so a restart does not
    reset it), then Ready with the reason recorded and counted."""
    w = World(ENFORCE)
    w.add("ClusterQueue", cluster_queue()).add("Node", node("n1"))
    w.add("Workload", workload(entries=[entry(CHECK, "Pending", T0 + 10)], nodes=["n1", "ghost-7"]))
    [waiting] = w.cycle()  # now = T0 + 20: 10 s of 60
    assert (waiting["state"], waiting["reason"]) == ("", "undecided")
    assert "unknown node(s) ghost-7" in waiting["message"]
    assert w.writer.patches == []
    w.now = T0 + 69
    assert w.cycle() == []  # still waiting, same reason: recorded once
    w.now = T0 + 70
    [opened] = w.cycle()
    assert (opened["state"], opened["reason"], opened["written"]) == (
        "Ready",
        "fail_open",
        "written",
    )
    assert "could not judge within 60s" in opened["message"]
    assert "ghost-7" in opened["message"]
    body = w.service.metrics_body(openmetrics=False).decode()
    assert "topowatch_admission_fail_open_total 1" in body
    assert (
        'topowatch_admission_decisions_total{check="topowatch-node-health",state="Ready",'
        'reason="fail_open"} 1' in body
    )


def test_fail_open_while_the_model_is_not_synced() -> None:
    """Unsynced, the deadline runs from when this process first saw the entry: a restart does
    not admit every long-waiting workload unjudged before its first lists are in."""
    w = World(ENFORCE)
    w.add("ClusterQueue", cluster_queue()).add("Node", node("n1", findings=[xid()]))
    w.add("Node", node("n2"))
    w.add("Workload", workload(entries=[entry(CHECK, "Pending", T0 + 10)]))
    w.service.informers = types.SimpleNamespace(synced=lambda: False)  # type: ignore[assignment]
    w.now = T0 + 500  # long Pending, but first seen by this process (restarted) now
    [waiting] = w.cycle()
    assert (waiting["state"], waiting["reason"]) == ("", "undecided")
    w.now = T0 + 560
    [opened] = w.cycle()
    assert (opened["state"], opened["reason"]) == ("Ready", "fail_open")
    assert "has not synced" in opened["message"]


def test_bad_input_noted_never_raised() -> None:
    """An AdmissionCheck of ours with unusable parameters, one without a name, an entry without
    a name, an entry list that is not a list, a findings annotation that is not JSON: problems
    are noted, the cycle goes on."""
    odd = admission_check("odd", active=True)
    odd["spec"]["parameters"] = "strict"  # what the CRD refuses, read all the same
    writer = FakeWriter(
        [admission_check(active=True), odd, {"metadata": {"name": "broken"}}, {"spec": {}}]
    )
    w = World(ENFORCE, writer)
    w.add("ClusterQueue", cluster_queue())
    bad_node = node("n1")
    bad_node["metadata"]["annotations"] = {"topowatch.io/findings": "{not json"}
    w.add("Node", bad_node).add("Node", node("n2"))
    broken = workload(name="broken", entries=[entry(CHECK, "Pending")])
    broken["status"]["admissionChecks"].append({"state": "Pending"})  # no name
    w.add("Workload", broken)
    w.add(
        "Workload",
        {"metadata": {"name": "x", "namespace": NS}, "status": {"admissionChecks": "nope"}},
    )
    [decision] = w.cycle()
    assert decision["state"] == "Ready"
    problems = " | ".join(w.controller.problems)
    assert "AdmissionCheck odd: spec.parameters is not an object (str); ignored" in problems
    assert "an AdmissionCheck without a name" in problems
    assert "status.admissionChecks is not a list" in problems
    assert "has no name" in problems
    assert "findings are not JSON" in problems
    [(_, patch)] = w.writer.patches
    assert {"state": "Pending"} in patch["status"]["admissionChecks"]  # kept as it was


def test_api_route_and_explain_line() -> None:
    """/api/v1/admission lists the decisions (filter by workload); explain of a held
    workload says which node, which finding, since when."""
    w = World(ENFORCE)
    w.add("ClusterQueue", cluster_queue())
    w.add("Node", node("n1", findings=[xid()])).add("Node", node("n2"))
    raw = workload(entries=[entry(CHECK, "Pending")])
    w.add("Workload", raw)
    w.cycle()
    view = w.service.admission_view("hyperpod-ns-alpha/train", 10)
    assert view is not None
    assert [d["state"] for d in view["decisions"]] == ["Retry"]
    assert w.service.admission_view("hyperpod-ns-alpha/other", 10)["decisions"] == []  # type: ignore[index]
    raw["status"]["admissionChecks"][0].update(state="Retry")  # as the write left it
    raw["metadata"]["resourceVersion"] = "6"
    w.add("Workload", raw, "MODIFIED")
    text = explain_text(w.service.workload(NS, "train") or {})
    assert "admission held: node n1, XID 79 on GPU 3, since 10:56:40Z" in text
    assert held_line({"state": "Ready", "node": "n1"}) == ""
    body = w.service.metrics_body(openmetrics=False).decode()
    assert "topowatch_admission_decision_seconds_count 1" in body
