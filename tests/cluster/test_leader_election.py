"""Leader election on a Lease: client-go's rules as a table, then two real replicas.

The pure core (`decide`, `observed_since`, `leading`) is checked row by row against the rule
of client-go's tools/leaderelection/leaderelection.go each row cites; the elector's round
(`tick`) with a fake lock and a fake clock; and finally two electors in threads against the
simulated kube-apiserver, where the properties that matter are checked with deadlines, not
tight timings: exactly one leads, a standby takes over after a lease, at once after a release,
and the two never lead at the same moment.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.cluster.leader.election import Leadership, add_arguments, default_identity
from exporter.core.exposition import encode_text
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sources.lease import (
    Decision,
    ElectionConfig,
    LeaderElector,
    LeaseError,
    LeaseLock,
    LeaseRecord,
    LostRaceError,
    decide,
    leading,
    observed_since,
)

ME, THEM = "replica-a", "replica-b"
CONFIG = ElectionConfig()  # 15 s / 10 s / 2 s, client-go's defaults
WALL = datetime(2026, 11, 25, 1, 0, 0, 500000, tzinfo=UTC)
EARLIER = datetime(2026, 11, 25, 0, 0, 0, 250000, tzinfo=UTC)


def held(holder: str, duration: int = 15, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, duration, EARLIER, EARLIER, transitions)


@dataclass(frozen=True)
class Row:
    rule: str  # client-go's rule, as its code or comment says it
    observed: LeaseRecord | None
    observed_at: float
    now: float
    renewed_at: float | None
    action: str
    holder: str | None = None  # of the record written
    transitions: int | None = None
    acquire_time: datetime | None = None


ROWS = [
    Row(
        "1. obtain or create the ElectionRecord: NotFound -> Create",
        None,
        0.0,
        0.0,
        None,
        "create",
        ME,
        0,
        WALL,
    ),
    Row(
        "2. lock is held by %v and has not yet expired (isLeaseValid: observedTime + "
        "LeaseDuration > now)",
        held(THEM),
        100.0,
        114.9,
        None,
        "wait",
    ),
    Row(
        "2. a fresh candidate times the lease from its own first observation, not renewTime",
        held(THEM),
        100.0,
        100.0,
        None,
        "wait",
    ),
    Row(
        "2. expired by our observation: no change for LeaseDuration -> acquire, "
        "3. LeaderTransitions + 1 on a new holder",
        held(THEM),
        100.0,
        115.0,
        None,
        "update",
        ME,
        4,
        WALL,
    ),
    Row(
        "2. the holder's LeaseDurationSeconds (observedRecord), not ours, is waited out",
        held(THEM, duration=30),
        100.0,
        125.0,
        None,
        "wait",
    ),
    Row(
        "2. an empty HolderIdentity (released) is acquired at once, LeaderTransitions + 1",
        held("", duration=1),
        100.0,
        100.0,
        None,
        "update",
        ME,
        4,
        WALL,
    ),
    Row(
        "2. held by us (IsLeader) -> ours to update: AcquireTime and LeaderTransitions kept",
        held(ME),
        100.0,
        100.0,
        None,
        "update",
        ME,
        3,
        EARLIER,
    ),
    Row(
        "renew: a leader renews every RetryPeriod, AcquireTime and LeaderTransitions kept",
        held(ME),
        100.0,
        102.0,
        100.0,
        "update",
        ME,
        3,
        EARLIER,
    ),
    Row(
        "renew: failed to renew lease within RenewDeadline -> stop leading",
        held(ME),
        100.0,
        110.0,
        100.0,
        "step_down",
    ),
    Row(
        "IsLeader: observedRecord.HolderIdentity is someone else -> not leader",
        held(THEM),
        105.0,
        105.0,
        100.0,
        "step_down",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}:{r.action}" for i, r in enumerate(ROWS)])
def test_decisions_follow_client_go(row: Row) -> None:
    decision = decide(
        row.observed, row.observed_at, row.now, ME, CONFIG, renewed_at=row.renewed_at, wall=WALL
    )
    assert decision.action == row.action, (row.rule, decision.reason)
    if row.action in ("create", "update"):
        written = decision.record
        assert written is not None
        assert written.holder_identity == row.holder
        assert written.lease_transitions == row.transitions, row.rule
        assert written.acquire_time == row.acquire_time, row.rule
        assert written.renew_time == WALL
        assert written.lease_duration_seconds == 15
    else:
        assert decision.record is None


def test_our_clock_is_never_compared_with_the_holders_renew_time() -> None:
    """A holder whose renewTime is years old (its wall clock is wrong) still holds the lease
    for a whole LeaseDuration after we saw it change; one dated in the future does not hold
    it longer."""
    ancient = LeaseRecord(
        THEM, 15, datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 1, tzinfo=UTC)
    )
    assert decide(ancient, 50.0, 50.0, ME, CONFIG).action == "wait"
    future = replace(ancient, renew_time=datetime(2099, 1, 1, tzinfo=UTC))
    assert decide(future, 50.0, 65.0, ME, CONFIG).action == "update"


def test_the_observation_clock_restarts_only_when_the_record_changes() -> None:
    record = held(THEM)
    assert observed_since(None, None, record, 7.0) == 7.0  # first sight
    assert observed_since(record, 7.0, record, 20.0) == 7.0  # unchanged: keeps its age
    renewed = replace(record, renew_time=WALL)
    assert observed_since(record, 7.0, renewed, 20.0) == 20.0  # renewed: starts over
    assert observed_since(record, 7.0, None, 20.0) == 20.0  # deleted


def test_leading_ends_at_the_renew_deadline() -> None:
    assert leading(100.0, 109.999, CONFIG)
    assert not leading(100.0, 110.0, CONFIG)
    assert not leading(None, 100.0, CONFIG)


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [(10, 10, 2), (10, 12, 2), (15, 2.4, 2), (15, 10, 0)],
)
def test_timings_client_go_would_refuse_are_refused(
    lease: float, renew: float, retry: float
) -> None:
    with pytest.raises(ValueError):
        ElectionConfig(lease, renew, retry)


def test_the_record_never_promises_less_than_we_wait() -> None:
    assert ElectionConfig(2.5, 2.2, 0.3).lease_duration_seconds == 3


# --- the round, with a fake lock and a fake clock ------------------------------------------


class FakeLock:
    """A Lease in memory: a version counter for conflicts, scripted failures."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.fail: type[LeaseError] | None = None
        self.writes = 0

    def describe(self) -> str:
        return "test/lease"

    def get(self, timeout: float) -> LeaseRecord | None:
        return self.record

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        return self._write(record)

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        return self._write(record)

    def _write(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail is not None:
            raise self.fail("scripted")
        self.writes += 1
        self.record = record
        return record


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig() -> tuple[LeaderElector, FakeLock, Clock, list[str]]:
    lock, clock, calls = FakeLock(), Clock(), list[str]()
    elector = LeaderElector(
        lock,
        ME,
        CONFIG,
        on_started_leading=lambda: calls.append("started"),
        on_stopped_leading=lambda: calls.append("stopped"),
        on_new_leader=lambda who: calls.append(f"leader {who}"),
        clock=clock,
        wall=lambda: WALL,
    )
    return elector, lock, clock, calls


Rig = tuple[LeaderElector, FakeLock, Clock, list[str]]


def test_a_conflicting_write_means_not_leader(rig: Rig) -> None:
    elector, lock, clock, calls = rig
    elector.tick()
    assert elector.is_leader and calls == ["leader replica-a", "started"]
    lock.fail = LostRaceError
    clock.now += 2
    elector.tick()
    assert not elector.is_leader and calls[-1] == "stopped"


def test_leadership_ends_at_the_renew_deadline_even_before_the_loop_notices(rig: Rig) -> None:
    elector, lock, clock, calls = rig
    elector.tick()
    lock.fail = LeaseError  # the API server is unreachable
    for _ in range(4):
        clock.now += 2
        elector.tick()
        assert elector.is_leader  # 8 s < renew_deadline
    clock.now += 2  # 10 s after the last renewal was sent
    assert not elector.is_leader  # on the clock alone, before any round runs
    assert "stopped" not in calls
    elector.tick()
    assert calls[-1] == "stopped"
    lock.fail = None  # the API server is back: the lease is still ours, so we take it again
    clock.now += 2
    elector.tick()
    assert elector.is_leader and calls[-1] == "started"


def test_a_standby_takes_over_after_a_lease_of_no_change_and_counts_a_transition(
    rig: Rig,
) -> None:
    elector, lock, clock, calls = rig
    lock.record = held(THEM)
    elector.tick()
    assert not elector.is_leader and calls == ["leader replica-b"]
    clock.now += 14.9
    elector.tick()
    assert not elector.is_leader and lock.writes == 0
    clock.now += 0.1
    elector.tick()
    assert elector.is_leader
    assert lock.record is not None and lock.record.lease_transitions == 4
    assert calls == ["leader replica-b", "leader replica-a", "started"]
    assert elector.transitions == 1
    text = encode_text(elector.families()).decode()
    assert 'topowatch_cluster_leader{identity="replica-a"} 1' in text
    assert 'topowatch_cluster_leader_transitions_total{identity="replica-a"} 1' in text


def test_a_renewing_holder_keeps_the_lease(rig: Rig) -> None:
    elector, lock, clock, _ = rig
    lock.record = held(THEM)
    for step in range(20):  # the holder renews every 2 s: we never see 15 s without a change
        elector.tick()
        assert not elector.is_leader
        clock.now += 2
        lock.record = replace(lock.record, renew_time=datetime.fromtimestamp(step, UTC))


def test_release_on_stop_hands_the_lease_over(rig: Rig) -> None:
    elector, lock, _, calls = rig
    elector.tick()
    elector.stop(release=True)
    assert not elector.is_leader and calls[-1] == "stopped"
    assert lock.record == LeaseRecord("", 1, WALL, WALL, 0)


# --- two replicas against the simulated API server ------------------------------------------


FAST = ElectionConfig(lease_duration=2.0, renew_deadline=1.5, retry_period=0.3)


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(ObjectStore()) as srv:
        yield srv


def client_for(server: FakeApiServer) -> Any:
    config = kc.Configuration()
    config.host = server.url
    config.retries = False
    return kc.ApiClient(config)


@pytest.fixture
def replicas(server: FakeApiServer) -> Iterator[Callable[..., LeaderElector]]:
    made: list[LeaderElector] = []

    def make(identity: str, config: ElectionConfig = FAST) -> LeaderElector:
        elector = LeaderElector(
            LeaseLock(client_for(server), "topowatch", "cluster"), identity, config
        )
        made.append(elector)
        return elector

    yield make
    for elector in made:
        elector.stop(release=False)


def wait_for(condition: Callable[[], bool], timeout: float) -> float:
    """Seconds until `condition` held, sampled every 10 ms; fails past `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.01)
    return time.monotonic() - start


def handover(
    old: LeaderElector, new: LeaderElector, release: bool, timeout: float
) -> tuple[float, int]:
    """Stop `old` and sample both until `new` leads: (seconds taken, samples with both
    leading, which must be none)."""
    both = 0
    start = time.monotonic()
    old.stop(release=release)
    while not new.is_leader:
        both += old.is_leader and new.is_leader
        assert time.monotonic() - start < timeout, "the standby did not take over in time"
        time.sleep(0.005)
    return time.monotonic() - start, both


def one_leader(a: LeaderElector, b: LeaderElector) -> tuple[LeaderElector, LeaderElector]:
    wait_for(lambda: a.is_leader or b.is_leader, FAST.lease_duration + 2)
    assert not (a.is_leader and b.is_leader)
    return (a, b) if a.is_leader else (b, a)


def test_two_replicas_exactly_one_leads(
    replicas: Callable[..., LeaderElector], server: FakeApiServer
) -> None:
    a, b = replicas(ME), replicas(THEM)
    a.start()
    b.start()
    leader, standby = one_leader(a, b)
    # for several renewals, still exactly one, and always the same one
    deadline = time.monotonic() + 3 * FAST.retry_period + 1
    while time.monotonic() < deadline:
        assert leader.is_leader and not standby.is_leader
        time.sleep(0.02)
    lease = server.store.get("leases", "topowatch", "cluster")
    assert lease is not None and lease["spec"]["holderIdentity"] == leader.identity
    assert standby.leader == leader.identity


def test_a_stopped_leader_is_replaced_within_a_lease_and_never_overlaps(
    replicas: Callable[..., LeaderElector], server: FakeApiServer
) -> None:
    a, b = replicas(ME), replicas(THEM)
    a.start()
    b.start()
    leader, standby = one_leader(a, b)
    # A liveness deadline, not the figure: the figure (lease + 2 s) is printed, and measured
    # 2.1 to 3.0 s here; a loaded CI machine must not turn scheduling delay into a failure.
    took, both = handover(leader, standby, release=False, timeout=FAST.lease_duration * 3 + 2)
    assert both == 0
    # a lease is waited out: the last renewal was sent less than renew_deadline before the
    # stop, and the standby waits lease_duration from when it saw that renewal
    assert took > FAST.lease_duration - FAST.renew_deadline
    lease = server.store.get("leases", "topowatch", "cluster")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == standby.identity
    assert lease["spec"]["leaseTransitions"] == 1
    print(f"takeover without release: {took:.2f}s")


def test_a_released_lease_is_taken_over_at_the_next_retry(
    replicas: Callable[..., LeaderElector], server: FakeApiServer
) -> None:
    # A lease of 30 s: waiting it out would miss the 10 s deadline below, so taking over in
    # time shows the release was seen (at the next retry, 0.3 s jittered), not an expiry; no
    # tight timing is asserted on these loaded cores.
    slow = ElectionConfig(lease_duration=30.0, renew_deadline=1.5, retry_period=0.3)
    a, b = replicas(ME, slow), replicas(THEM, slow)
    a.start()
    b.start()
    leader, standby = one_leader(a, b)
    took, both = handover(leader, standby, release=True, timeout=10.0)
    assert both == 0
    print(f"takeover after release: {took:.2f}s")


def test_a_new_replica_with_the_old_identity_takes_its_lease_at_once(
    replicas: Callable[..., LeaderElector],
) -> None:
    """client-go's "held by us": a restart that keeps its identity (a StatefulSet pod) does
    not wait out its own lease."""
    first = replicas(ME)
    first.start()
    wait_for(lambda: first.is_leader, 3)
    first.stop(release=False)
    again = replicas(ME)
    again.start()
    assert wait_for(lambda: again.is_leader, 3) < FAST.lease_duration


# --- the service's wrapper --------------------------------------------------------------------


def test_leadership_without_election_always_leads() -> None:
    leadership = Leadership(None, enabled=False, namespace="x", identity="solo")
    leadership.start()
    assert leadership.is_leader
    text = encode_text(leadership.families()).decode()
    assert 'topowatch_cluster_leader{identity="solo"} 1' in text
    leadership.stop()


def test_leadership_from_flags_campaigns_on_the_named_lease(
    server: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "topowatch-cluster-7d9f-abcde")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--leader-elect",
            "--leader-elect-namespace",
            "monitoring",
            "--leader-elect-lease-duration",
            "2",
            "--leader-elect-renew-deadline",
            "1.5",
            "--leader-elect-retry-period",
            "0.3",
        ]
    )
    assert default_identity() == "topowatch-cluster-7d9f-abcde"
    leadership = Leadership.from_args(args, client_for(server))
    leadership.start()
    try:
        wait_for(lambda: leadership.is_leader, 3)
        lease = server.store.get("leases", "monitoring", "topowatch-cluster")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "topowatch-cluster-7d9f-abcde"
    finally:
        leadership.stop()
    assert not leadership.is_leader
    released = server.store.get("leases", "monitoring", "topowatch-cluster")
    assert released is not None and released["spec"]["holderIdentity"] == ""
    with pytest.raises(ValueError):
        Leadership.from_args(
            parser.parse_args(["--leader-elect", "--leader-elect-renew-deadline", "20"]), None
        )


def test_decision_reasons_name_the_rule() -> None:
    assert isinstance(decide(None, 0, 0, ME, CONFIG), Decision)
    assert "expired" in decide(held(THEM), 0, 15, ME, CONFIG).reason


def test_the_command_line_defaults_are_the_electors() -> None:
    """The flags live apart from the elector (the node agent builds the same parser); their
    defaults must be client-go's, as ElectionConfig's are."""
    from exporter.cluster.leader import args as leader_args
    from exporter.sources.lease import ElectionConfig

    config = ElectionConfig()
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (
        leader_args.LEASE_DURATION_S,
        leader_args.RENEW_DEADLINE_S,
        leader_args.RETRY_PERIOD_S,
    )
