"""Failover of the cluster service, with two real `topowatch cluster` processes.

Both replicas run `python -m exporter.cli cluster --leader-elect` against one simulated API
server (in this process; the replicas find it through a generated kubeconfig, as a replica
outside a cluster would), with remediation in act mode and the hyperpod provider. One node
turns bad (its agent's report, written as the node agent writes it: NodeReporter with the
agent's field manager); the leader labels it for a HyperPod reboot and is then killed with
SIGKILL while HyperPod has the node pending, so it neither releases the Lease nor says goodbye.

The standby must take the Lease over once the old one has run out (never before), must not
label the node again, and must follow the reboot the dead leader started to its outcome: when
HyperPod's agent marks the node Schedulable and the node reports healthy, the new leader writes
`recovered` to the node's state and shows it on /api/v1/remediation (a standby adopts every
state the Node's annotation shows, not only a newer action's: healthcheck/remediation/controller.py
`_take_report`; without that it took over holding `requested` and never recorded the outcome).

Deadlines here are liveness bounds, not timing figures (the CI box has two loaded cores);
benchmarks/failover.py measures the handover.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exporter.core.findings import Finding
from exporter.sim.cluster import ClusterShape
from exporter.sim.environment import SimulatedEnvironment
from exporter.sources.kubeapi import KubeApi
from healthcheck.detection.monitor import HealthReport
from healthcheck.detection.reporter import NodeReporter
from healthcheck.remediation.state import ANNOTATION as STATE_ANNOTATION
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
PENDING_REBOOT = "UnschedulablePendingReboot"
LEASE_NAMESPACE = "default"
LEASE_NAME = "topowatch-failover"
TOKEN = "failover-test-token"
# Short timings (client-go's rules hold: lease > renew deadline > 1.2 x retry period).
LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5
# Liveness bounds: generous, for a loaded two-core CI box.
START_S = 60.0
TAKEOVER_SLACK_S = 15.0


class Timeout(AssertionError):
    pass


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """`check()`'s first truthy value within `timeout` s; Timeout (an AssertionError) else."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (OSError, ValueError) as exc:  # not serving yet (URLError is an OSError)
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}: last {last!r}")
        time.sleep(0.05)


def kubeconfig(url: str, path: Path) -> Path:
    """A kubeconfig naming the simulated API server, no credentials (it asks for none)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": url}}],
                "users": [{"name": "sim", "user": {}}],
                "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                "current-context": "sim",
            }
        )
    )
    return path


@dataclass
class Replica:
    """One `topowatch cluster` process, its port and its log."""

    identity: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(path), timeout=5) as response:
            return json.load(response)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as response:
            text: str = response.read().decode()
            return text

    def says_leader(self) -> bool:
        """Its own topowatch_cluster_leader series is 1."""
        series = f'topowatch_cluster_leader{{identity="{self.identity}"}} '
        for line in self.metrics().splitlines():
            if line.startswith(series):
                return float(line[len(series) :]) == 1.0
        raise ValueError(f"{self.identity}: no {series.strip()} series on /metrics")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/readyz"), timeout=5) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    def post_alert(self, node: str, token: str = TOKEN) -> tuple[int, dict[str, Any]]:
        body = json.dumps(
            {
                "version": "4",
                "status": "firing",
                "alerts": [
                    {"status": "firing", "labels": {"alertname": "FailoverProbe", "node": node}}
                ],
            }
        ).encode()
        request = urllib.request.Request(
            self.url("/api/v1/alerts"),
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    def node_status(self, node: str) -> dict[str, Any] | None:
        status = self.get_json("/api/v1/remediation")
        return next((n for n in status["nodes"] if n["node"] == node), None)

    def recent(self, node: str) -> list[dict[str, Any]]:
        status = self.get_json("/api/v1/remediation")
        return [r for r in status["recent"] if r["node"] == node]

    def kill(self) -> None:
        """SIGKILL: no Lease release, no cleanup, like an OOM kill or a lost node."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LeaseRecord:
    holder: str
    duration_s: int
    acquired: datetime | None
    renewed: datetime | None
    transitions: int


def _micro_time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


@dataclass
class FailoverRig:
    """The simulated cluster, the replicas' shared files, and the replicas started so far."""

    env: SimulatedEnvironment
    workdir: Path
    lease_s: float = LEASE_S
    renew_s: float = RENEW_S
    retry_s: float = RETRY_S
    replicas: list[Replica] = field(default_factory=list)
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen

    def __post_init__(self) -> None:
        self.config = self.workdir / "kubeconfig.json"
        kubeconfig(self.env.url, self.config)
        self.remediation = self.workdir / "remediation.yaml"
        # Budget and breaker opened wide: the test is about leadership, not about the limits.
        self.remediation.write_text(
            "mode: act\nproviders: [hyperpod]\nbudget: {nodes: 100}\nbreaker: {threshold: 100}\n"
        )
        self.token = self.workdir / "alerts.token"
        self.token.write_text(TOKEN + "\n")
        self.api = KubeApi(self.env.url)

    # --- replicas ---

    def start(self, identity: str) -> Replica:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(KUBECONFIG=str(self.config), POD_NAME=identity, PYTHONUNBUFFERED="1")
        log = self.workdir / f"{identity}.log"
        command = [
            sys.executable,
            "-m",
            "exporter.cli",
            "--log-level",
            "INFO",
            "cluster",
            "--listen",
            f"127.0.0.1:{port}",
            "--leader-elect",
            "--leader-elect-namespace",
            LEASE_NAMESPACE,
            "--leader-elect-lease-name",
            LEASE_NAME,
            "--leader-elect-lease-duration",
            f"{self.lease_s:g}",
            "--leader-elect-renew-deadline",
            f"{self.renew_s:g}",
            "--leader-elect-retry-period",
            f"{self.retry_s:g}",
            "--remediation-config",
            str(self.remediation),
            "--alerts-token-file",
            str(self.token),
        ]
        with log.open("wb") as out:
            proc = self.popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        replica = Replica(identity, port, proc, log)
        self.replicas.append(replica)
        return replica

    def wait_ready(self, replica: Replica, timeout: float = START_S) -> None:
        def up() -> bool:
            if replica.proc.poll() is not None:
                raise AssertionError(
                    f"{replica.identity} exited {replica.proc.returncode}:\n{replica.log_tail()}"
                )
            return replica.ready()

        wait_for(up, timeout, f"{replica.identity} ready")

    def stop_all(self) -> None:
        for replica in self.replicas:
            if replica.proc.poll() is None:
                replica.proc.send_signal(signal.SIGKILL)
        for replica in self.replicas:
            replica.proc.wait(10)  # SIGKILL cannot be refused

    # --- the Lease, as the API server holds it ---

    def lease(self) -> LeaseRecord | None:
        obj = self.env.store.get("leases", LEASE_NAMESPACE, LEASE_NAME)
        if obj is None:
            return None
        spec = obj.get("spec") or {}
        return LeaseRecord(
            spec.get("holderIdentity") or "",
            int(spec.get("leaseDurationSeconds") or 0),
            _micro_time(spec.get("acquireTime")),
            _micro_time(spec.get("renewTime")),
            int(spec.get("leaseTransitions") or 0),
        )

    def holder(self) -> str:
        record = self.lease()
        return record.holder if record is not None else ""

    def leader_and_standby(self, a: Replica, b: Replica) -> tuple[Replica, Replica]:
        """Once one of them holds the Lease and says so on /metrics, and the other does not."""
        by_name = {a.identity: a, b.identity: b}
        holder = wait_for(lambda: self.holder() in by_name and self.holder(), START_S, "a leader")
        leader = by_name[holder]
        standby = b if leader is a else a
        wait_for(leader.says_leader, START_S, f"{leader.identity}'s leader metric at 1")
        assert not standby.says_leader()
        return leader, standby

    # --- the nodes ---

    def node(self, name: str) -> dict[str, Any]:
        obj = self.env.store.get("nodes", "", name)
        assert obj is not None, name
        return obj

    def label(self, name: str) -> str | None:
        labels = self.node(name)["metadata"].get("labels") or {}
        value = labels.get(HEALTH_LABEL)
        return str(value) if value is not None else None

    def state(self, name: str) -> dict[str, Any] | None:
        raw = (self.node(name)["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
        return json.loads(raw) if raw else None

    def report(self, name: str, sick: bool) -> None:
        """What the node's agent writes (NodeReporter, the agent's field manager): XID 79 on
        gpu3, actionable, or no findings at all."""
        now = time.time()
        findings = (
            (
                Finding(
                    "xid",
                    "gpu3",
                    "fatal",
                    "reboot",
                    "XID 79 GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
                    now,
                    now,
                    actionable=True,
                ),
            )
            if sick
            else ()
        )
        reporter = NodeReporter(self.api, name)
        # The agent's next poll retries a report that lost a race with another writer twice.
        for _ in range(5):
            if reporter.report(HealthReport(name, now, findings)):
                return
            time.sleep(0.2)
        raise AssertionError(f"report on {name} failed")

    def hyperpod_rebooted(self, name: str) -> None:
        """HyperPod's agent has rebooted the node and marks it Schedulable again."""
        self.api.patch(
            f"/api/v1/nodes/{name}?fieldManager=hyperpod-health-monitoring-agent",
            {"metadata": {"labels": {HEALTH_LABEL: "Schedulable"}}},
        )

    def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        """Remediation Events about node `name` (the agent's own Events left out)."""
        return [
            e
            for e in self.env.store.items("events")
            if e.get("involvedObject", {}).get("name") == name
            and e.get("source", {}).get("component") == "topowatch-remediation"
            and (reason is None or e.get("reason") == reason)
        ]


class NodeHistory:
    """Every stored version of one Node from now on, read from the store's watch history."""

    def __init__(self, env: SimulatedEnvironment, name: str) -> None:
        self.env, self.name = env, name
        self.cursor, _, _ = env.store.open_watch("nodes", None, 0)

    def versions(self) -> list[dict[str, Any]]:
        got = self.env.store.next_events("nodes", self.cursor, 0)
        assert got is not None, "the node history was trimmed"
        events, _, _ = got
        return [
            e.entry.copy()
            for e in events
            if e.type != "DELETED" and e.entry.obj["metadata"]["name"] == self.name
        ]

    def label_writes(self, value: str) -> int:
        """How many times the label turned to `value` (a write of the same value again would
        come with a new `requested` state: see `action_starts`)."""
        count, last = 0, None
        for obj in self.versions():
            now = (obj["metadata"].get("labels") or {}).get(HEALTH_LABEL)
            if now == value and last != value:
                count += 1
            last = now
        return count

    def action_starts(self) -> set[float]:
        """The distinct `started_at` of every remediation state written: one per action."""
        starts = set()
        for obj in self.versions():
            raw = (obj["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
            if raw:
                starts.add(json.loads(raw)["started_at"])
        return starts


class LeaseWatch:
    """Polls the Lease in the store every 10 ms from a thread: the records it went through."""

    def __init__(self, rig: FailoverRig) -> None:
        self.rig = rig
        self.records: list[LeaseRecord] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        record = self.rig.lease()
        if record is not None and (not self.records or self.records[-1] != record):
            self.records.append(record)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.01)

    def stop(self) -> None:
        """Stop polling, with one last sample: the record the caller just saw is in."""
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def last_held_by(self, identity: str) -> LeaseRecord:
        return [r for r in self.records if r.holder == identity][-1]

    def first_held_by(self, identity: str) -> LeaseRecord:
        return next(r for r in self.records if r.holder == identity)


def small_shape() -> ClusterShape:
    return ClusterShape(
        p5_nodes=4, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0, initial_workloads=0
    )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[FailoverRig]:
    env = SimulatedEnvironment(seed=0, shape=small_shape()).start()
    made = FailoverRig(env, tmp_path)
    try:
        yield made
    finally:
        made.stop_all()
        made.api.close()
        env.stop()


@pytest.fixture
def pair(rig: FailoverRig) -> tuple[Replica, Replica]:
    """Two replicas, both ready; (leader, standby)."""
    a, b = rig.start("replica-a"), rig.start("replica-b")
    rig.wait_ready(a)
    rig.wait_ready(b)
    return rig.leader_and_standby(a, b)


def test_the_standby_refuses_alerts_so_alertmanager_retries_on_the_leader(
    rig: FailoverRig, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    node = rig.env.cluster.nodes()[0].name
    status, answer = standby.post_alert(node)
    assert status == 503 and "not the leader" in answer["error"]
    status, answer = leader.post_alert(node)
    assert status == 202 and answer["accepted"] == 1
    # A wrong token is refused on either before leadership is looked at.
    assert standby.post_alert(node, token="wrong")[0] == 403


@dataclass
class Failover:
    """What `kill_the_leader_mid_remediation` saw: the nodes, the state the dead leader wrote,
    the Lease's last record under the old leader and first under the new, and the time from
    the kill to the new holder in the store."""

    sick: str
    healthy: str
    before: dict[str, Any]
    history: NodeHistory
    last: LeaseRecord
    first: LeaseRecord
    took_s: float


def kill_the_leader_mid_remediation(
    rig: FailoverRig, leader: Replica, standby: Replica
) -> Failover:
    """One node turns bad; the leader decides, writes `requested`, labels the node for
    HyperPod's reboot and writes `done`; then, while HyperPod has the node pending, SIGKILL.
    Returns once the standby holds the Lease and says so on /metrics."""
    sick, healthy = (n.name for n in rig.env.cluster.nodes()[:2])
    history = NodeHistory(rig.env, sick)
    rig.report(sick, sick=True)
    wait_for(
        lambda: (
            rig.label(sick) == PENDING_REBOOT
            and (rig.state(sick) or {}).get("outcome") == "done"
            and rig.events(sick, "RemediationAccepted")
        ),
        30,
        "the leader's reboot label, state and Events",
    )
    before = rig.state(sick)
    assert before is not None
    assert (before["action"], before["attempts"], before["provider"]) == ("reboot", 1, "hyperpod")
    # The standby decided nothing and acted on nothing.
    wait_for(lambda: standby.node_status(sick), 10, "the standby's view of the node")
    assert not [r for r in standby.recent(sick) if r["audit"] == "decision"]

    watch = LeaseWatch(rig)
    try:
        killed = time.monotonic()
        leader.kill()
        wait_for(lambda: rig.holder() == standby.identity, LEASE_S + TAKEOVER_SLACK_S, "takeover")
        took = time.monotonic() - killed
        wait_for(standby.says_leader, 10, f"{standby.identity}'s leader metric at 1")
    finally:
        watch.stop()
    return Failover(
        sick,
        healthy,
        before,
        history,
        watch.last_held_by(leader.identity),
        watch.first_held_by(standby.identity),
        took,
    )


def test_a_killed_leader_is_replaced_after_its_lease_and_the_action_is_not_repeated(
    rig: FailoverRig, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    failover = kill_the_leader_mid_remediation(rig, leader, standby)
    last, first, sick = failover.last, failover.first, failover.sick
    # Within a lease and a little (liveness on a loaded box, not a figure) ...
    assert failover.took_s < LEASE_S + TAKEOVER_SLACK_S
    # ... and never while the old lease was valid: the standby's acquireTime is a whole lease
    # after the dead leader's last renewal (both stamped by this machine's wall clock, and the
    # standby can only have seen that renewal after it was stamped).
    assert last.renewed is not None and first.acquired is not None
    assert first.acquired >= last.renewed + timedelta(seconds=last.duration_s), (last, first)
    assert first.transitions == last.transitions + 1

    # The new leader decides on the node at once, and skips it: HyperPod has it pending.
    skipped = wait_for(
        lambda: [r for r in standby.recent(sick) if r["audit"] == "decision"],
        15,
        "the new leader's decision on the node",
    )
    assert [(r["verdict"], r["reason"]) for r in skipped] == [("skip", "already_pending")]
    wait_for(lambda: rig.events(sick, "RemediationSkipped"), 10, "the new leader's Event")
    # One action in all: one state start, one label write, one RemediationStarted Event.
    assert failover.history.action_starts() == {failover.before["started_at"]}
    assert failover.history.label_writes(PENDING_REBOOT) == 1
    assert len(rig.events(sick, "RemediationStarted")) == 1
    assert len(rig.events(sick, "RemediationAccepted")) == 1
    state = rig.state(sick)
    assert state is not None and state["attempts"] == 1
    # Nobody touched the healthy neighbour.
    assert rig.label(failover.healthy) == "Schedulable" and rig.state(failover.healthy) is None
    assert standby.proc.poll() is None, standby.log_tail()


def test_the_new_leader_follows_the_dead_leaders_reboot_to_its_outcome(
    rig: FailoverRig, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    failover = kill_the_leader_mid_remediation(rig, leader, standby)
    sick, before = failover.sick, failover.before
    # The standby's view was the Node's: the outcome the leader wrote last.
    seen = standby.node_status(sick)
    assert seen is not None and seen["state"]["started_at"] == before["started_at"]
    assert seen["state"]["outcome"] == "done", seen["state"]
    # HyperPod reboots the node and marks it Schedulable; its agent reports healthy.
    rig.report(sick, sick=False)
    rig.hyperpod_rebooted(sick)
    after = wait_for(
        lambda: (s := rig.state(sick)) and s["outcome"] == "recovered" and s,
        15,
        "the state `recovered`",
    )
    assert after["started_at"] == before["started_at"] and after["attempts"] == 1
    shown = wait_for(
        lambda: (s := standby.node_status(sick)) and s["state"]["outcome"] == "recovered" and s,
        10,
        "the new leader's status of the node",
    )
    assert shown["state"]["action"] == "reboot" and shown["state"]["attempts"] == 1
    assert [r["reason"] for r in standby.recent(sick) if r["audit"] == "lifecycle"] == ["recovered"]
    wait_for(lambda: rig.events(sick, "RemediationRecovered"), 10, "the RemediationRecovered Event")
    assert failover.history.action_starts() == {before["started_at"]}
    assert failover.history.label_writes(PENDING_REBOOT) == 1
    assert len(rig.events(sick, "RemediationStarted")) == 1
    assert len(rig.events(sick, "RemediationRecovered")) == 1
