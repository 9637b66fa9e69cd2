"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

Two replicas of the cluster service may run for availability, but only one may write (Events,
Node patches, anything remediation does). Kubernetes offers no lock but optimistic concurrency:
every write carries the resourceVersion it read, and a write from a stale read answers 409.
client-go's leaderelection package (tools/leaderelection/leaderelection.go) builds a lease on
that, and this module follows it rule by rule, so that our replicas behave like every other
controller an operator knows, and interoperate with `kubectl get lease`:

- **acquire** when the Lease is absent (create it), released (holderIdentity ""), held by us,
  or expired: its record has not changed for leaseDurationSeconds *as we observed it*. We keep
  the moment we last saw the record change, on our own monotonic clock, and never compare our
  clock with the holder's renewTime: the two machines' clocks need not agree, only tick at
  about the same rate (client-go's `observedTime`, `isLeaseValid`);
- the leaseDurationSeconds we wait out is the one in the record, the holder's own promise, not
  ours: a replica with another configuration still waits as long as the holder needs;
- **renew** every retry_period while leading; a renewal is counted from the moment its request
  was *sent*, because the write may land at the server any time after that;
- **lose** leadership once no renewal has succeeded for renew_deadline (< lease_duration): by
  then no other candidate can have seen the record unchanged for lease_duration, so two leaders
  never act at once. `is_leader` is computed from the clock, not set by the loop, so it turns
  False on time even while the loop is stuck in a request. This is a little stricter than
  client-go, whose deadline starts at the renewal round (up to one retry_period later);
- a write that answers 409 (Conflict, or AlreadyExists on create) lost a race: we are not
  leader, and the next round reads the Lease again;
- **leaseTransitions** goes up by one whenever the holder changes (not on a renewal);
- on a clean stop with `release_on_cancel`, the leader writes holderIdentity "" and
  leaseDurationSeconds 1, so a standby takes over at its next retry instead of after a whole
  lease_duration (client-go's ReleaseOnCancel).

The decisions are pure functions (`decide`, `observed_since`, `leading`) of the observed
record, our clock and the configuration, unit-tested without threads or an API server;
`LeaseLock` does the I/O through the official client's CoordinationV1Api, and
`LeaderElector` runs the loop in a thread.

Deliberate differences from client-go: after losing leadership the elector goes back to
being a candidate (client-go's Run returns, and most binaries exit), because the cluster
service keeps serving its model as a standby; `on_stopped_leading` fires only after leading
(client-go calls it whenever Run returns); `on_new_leader` is not called for a released
Lease (holderIdentity ""), which has no leader to report.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import kubernetes.client
import urllib3.exceptions

from exporter.core.exposition import COUNTER, GAUGE, Family

__all__ = [
    "JITTER_FACTOR",
    "Decision",
    "ElectionConfig",
    "LeaderElector",
    "LeaseError",
    "LeaseLock",
    "LeaseRecord",
    "Lock",
    "LostRaceError",
    "decide",
    "leader_families",
    "leading",
    "observed_since",
    "release_record",
]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2  # client-go's JitterFactor: candidates retry after retry_period * [1, 2.2)


@dataclass(frozen=True)
class ElectionConfig:
    """Timing of an election, in seconds, validated as client-go's NewLeaderElector does.

    lease_duration: how long a candidate waits without seeing the record change before it
    takes over. renew_deadline: how long the leader keeps acting without a successful renewal.
    retry_period: the pause between two attempts. lease_duration > renew_deadline leaves the
    margin that keeps two leaders from acting at once; renew_deadline > retry_period * 1.2
    leaves a leader time for more than one renewal attempt before it gives up.
    """

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 0.4  # client-go's is 2 s; see exporter/cluster/leader/args.py
    release_on_cancel: bool = False

    def __post_init__(self) -> None:
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError("renew_deadline must be greater than retry_period*1.2")
        if self.retry_period <= 0:
            raise ValueError("retry_period must be greater than zero")

    @property
    def lease_duration_seconds(self) -> int:
        """The whole seconds written to the record: rounded up, never down, so the record
        never promises less than we wait out (renew_deadline stays below it)."""
        return math.ceil(self.lease_duration)


@dataclass(frozen=True)
class LeaseRecord:
    """The election-relevant part of a Lease's spec (client-go's LeaderElectionRecord).

    Equality is what "the record changed" means: a renewal always moves renew_time."""

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0


Action = Literal["create", "update", "wait", "step_down"]


@dataclass(frozen=True)
class Decision:
    """What the elector does next: write `record` (create or update), wait, or step down.

    `reason` names the client-go rule that applied, for the log and for tests."""

    action: Action
    reason: str
    record: LeaseRecord | None = None


# ---------------------------------------------------------------------------------------
# The pure core


def observed_since(
    previous: LeaseRecord | None,
    previous_at: float | None,
    current: LeaseRecord | None,
    now: float,
) -> float:
    """When we first saw `current`, on our clock: `previous_at` while it is the record we had,
    `now` once it differs (client-go's setObservedRecord on a changed raw record)."""
    if previous_at is not None and current == previous:
        return previous_at
    return now


def leading(renewed_at: float | None, now: float, config: ElectionConfig) -> bool:
    """Whether we may act as leader: our last successful write (counted from when it was
    sent) is younger than renew_deadline."""
    return renewed_at is not None and now - renewed_at < config.renew_deadline


def decide(
    observed: LeaseRecord | None,
    observed_at: float,
    now: float,
    identity: str,
    config: ElectionConfig,
    *,
    renewed_at: float | None = None,
    wall: datetime | None = None,
) -> Decision:
    """The next step, from the record just read (None: no Lease), when we first saw it
    (`observed_at`, our monotonic clock), `now` (the same clock), and `renewed_at`, when our
    last successful write as leader was sent (None: we are not leading).

    `wall` stamps acquireTime/renewTime in a record we write; those fields are for people
    and other tools, never for our decisions. client-go's tryAcquireOrRenew, in order.
    """
    stamp = wall or datetime.now(UTC)
    if renewed_at is not None and not leading(renewed_at, now, config):
        return Decision("step_down", "no successful renewal within renew_deadline")
    if observed is None:
        record = LeaseRecord(identity, config.lease_duration_seconds, stamp, stamp, 0)
        return Decision("create", "the lease does not exist", record)
    holder = observed.holder_identity
    if holder and holder != identity:
        if renewed_at is not None:
            return Decision("step_down", f"the lease is held by {holder}")
        duration = observed.lease_duration_seconds or config.lease_duration_seconds
        if now < observed_at + duration:
            return Decision("wait", f"the lease is held by {holder} and has not yet expired")
    ours = holder == identity
    record = LeaseRecord(
        identity,
        config.lease_duration_seconds,
        observed.acquire_time if ours and observed.acquire_time else stamp,
        stamp,
        observed.lease_transitions + (0 if ours else 1),
    )
    if ours:
        reason = "renew: the lease is ours" if renewed_at is not None else "the lease is ours"
    elif holder:
        reason = f"the lease held by {holder} expired by our observation"
    else:
        reason = "the lease was released"
    return Decision("update", reason, record)


def release_record(observed: LeaseRecord, wall: datetime | None = None) -> LeaseRecord:
    """What a leader writes on a clean stop: no holder, a one-second lease, the transition
    count kept (client-go's release)."""
    stamp = wall or datetime.now(UTC)
    return LeaseRecord("", 1, stamp, stamp, observed.lease_transitions)


# ---------------------------------------------------------------------------------------
# The lock: a Lease through the official client


class LeaseError(Exception):
    """The Lease could not be read or written (network, 5xx, 403): try again later."""


class LostRaceError(LeaseError):
    """A write answered 409: another writer changed or created the Lease since we read it."""


def _micro(stamp: datetime | None) -> datetime | None:
    """A time the API server's MicroTime accepts: aware, and with a non-zero microsecond,
    because the client writes isoformat(), which drops a zero fraction, and kube-apiserver
    parses exactly six fraction digits (RFC3339Micro)."""
    if stamp is None:
        return None
    stamp = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    return stamp if stamp.microsecond else stamp.replace(microsecond=1)


def _record_of(lease: Any) -> LeaseRecord:
    spec = lease.spec
    if spec is None:
        return LeaseRecord()
    return LeaseRecord(
        spec.holder_identity or "",
        spec.lease_duration_seconds or 0,
        spec.acquire_time,
        spec.renew_time,
        spec.lease_transitions or 0,
    )


def _spec_of(record: LeaseRecord) -> Any:
    return kubernetes.client.V1LeaseSpec(
        holder_identity=record.holder_identity,
        lease_duration_seconds=record.lease_duration_seconds,
        acquire_time=_micro(record.acquire_time),
        renew_time=_micro(record.renew_time),
        lease_transitions=record.lease_transitions,
    )


class Lock(Protocol):
    """What the elector needs of a lock: `LeaseLock`, or a fake in tests."""

    def describe(self) -> str: ...

    def get(self, timeout: float) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord: ...

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord: ...


class LeaseLock:
    """One Lease, read and written through CoordinationV1Api (client-go's LeaseLock).

    The Lease last read or written is kept, so an update carries its resourceVersion (the
    optimistic lock) and whatever else it holds (labels, annotations) unchanged."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self._api = kubernetes.client.CoordinationV1Api(api_client)
        self._lease: Any = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def get(self, timeout: float) -> LeaseRecord | None:
        """The Lease's record, None when there is no Lease."""
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=_timeout(timeout)
            )
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                self._lease = None
                return None
            raise LeaseError(f"get lease {self.describe()}: {_reason(error)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise LeaseError(f"get lease {self.describe()}: {error!r}") from None
        self._lease = lease
        return _record_of(lease)

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        """Create the Lease; the record as stored. LostRaceError when it exists already."""
        body = kubernetes.client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=kubernetes.client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=_spec_of(record),
        )
        self._lease = self._write("create", body, timeout)
        return _record_of(self._lease)

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        """Replace the spec of the Lease last read or written; the record as stored.
        LostRaceError when the Lease changed since."""
        if self._lease is None:
            raise LeaseError(f"update lease {self.describe()}: not read yet")
        self._lease.spec = _spec_of(record)
        self._lease = self._write("update", self._lease, timeout)
        return _record_of(self._lease)

    def _write(self, verb: str, body: Any, timeout: float) -> Any:
        try:
            if verb == "create":
                return self._api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=_timeout(timeout)
                )
            return self._api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=_timeout(timeout)
            )
        except kubernetes.client.ApiException as error:
            if error.status == 409:
                self._lease = None  # stale: the next round reads it again
                raise LostRaceError(f"{verb} lease {self.describe()}: {_reason(error)}") from None
            raise LeaseError(f"{verb} lease {self.describe()}: {_reason(error)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise LeaseError(f"{verb} lease {self.describe()}: {error!r}") from None


def _timeout(seconds: float) -> tuple[float, float]:
    """(connect, read) for urllib3: a request never outlives the time it was given."""
    seconds = max(0.05, seconds)
    return (seconds, seconds)


def _reason(error: Any) -> str:
    return f"{error.status} {error.reason}"


# ---------------------------------------------------------------------------------------
# The elector


def leader_families(identity: str, is_leader: bool, transitions: int) -> list[Family]:
    """`topowatch_cluster_leader{identity}` (1 while this replica leads) and
    `topowatch_cluster_leader_transitions_total{identity}`: one series per replica, so that
    `sum(topowatch_cluster_leader)` is the number of leaders (1, or 0 during a handover)."""
    labels = [("identity", identity)]
    leader = Family(
        "topowatch_cluster_leader",
        GAUGE,
        "1 while this replica holds the leader lease and may act, 0 on a standby.",
    )
    leader.add(labels, 1.0 if is_leader else 0.0)
    changes = Family(
        "topowatch_cluster_leader_transitions",
        COUNTER,
        "Changes of the lease holder this replica has seen since it started.",
    )
    changes.add(labels, float(transitions))
    return [leader, changes]


Callback = Callable[[], None]


class LeaderElector:
    """Runs an election for `identity` on `lock` in a thread: `start()`, `stop()`.

    `is_leader` is True only while our last successful write is younger than renew_deadline
    (and we were not stopped), whatever the loop is doing. Callbacks run in order on their
    own thread, so a slow one never delays a renewal: `on_started_leading()`,
    `on_stopped_leading()` and `on_new_leader(identity)` (the holder changed, us included).
    `clock` is monotonic seconds and `wall` the time written into the record: both
    injectable for tests.
    """

    def __init__(
        self,
        lock: Lock,
        identity: str,
        config: ElectionConfig | None = None,
        *,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not identity:
            raise ValueError("a leader election needs a non-empty identity")
        self.lock = lock
        self.identity = identity
        self.config = config or ElectionConfig()
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock = clock
        self._wall = wall
        self._mutex = threading.Lock()
        self._observed: LeaseRecord | None = None
        self._observed_at: float | None = None
        self._renewed_at: float | None = None
        self._leading = False  # what the callbacks were last told
        self._reported_leader = ""
        self._transitions = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._dispatcher: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="topowatch-leader-callbacks", daemon=True
        )
        self._dispatcher.start()
        self._thread = threading.Thread(
            target=self._run, name=f"topowatch-leader-election:{self.identity}", daemon=True
        )
        self._thread.start()
        log.info(
            "leader election for %s on lease %s (lease %.1fs, renew deadline %.1fs, retry %.1fs)",
            self.identity,
            self.lock.describe(),
            self.config.lease_duration,
            self.config.renew_deadline,
            self.config.retry_period,
        )

    def stop(self, release: bool | None = None) -> None:
        """Stop campaigning. `is_leader` is False from the moment this is called; the Lease is
        released (when `release`, default config.release_on_cancel) after the loop ended, so
        that nobody can take it over while we still think we lead."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self.config.renew_deadline + self.config.retry_period)
        self._thread = None
        with self._mutex:
            holds = self._renewed_at is not None  # a write of ours may have won meanwhile
            self._renewed_at = None
            observed = self._observed
        if self._leading:
            self._set_leading(False, "stopped")
        release = self.config.release_on_cancel if release is None else release
        if release and holds and observed is not None:
            self._release(observed)
        if self._dispatcher is not None:
            self._callbacks.put(None)
            self._dispatcher.join(timeout=5)
            self._dispatcher = None

    @property
    def is_leader(self) -> bool:
        if self._stopping.is_set():
            return False
        with self._mutex:
            renewed_at = self._renewed_at
        return leading(renewed_at, self._clock(), self.config)

    @property
    def leader(self) -> str:
        """The holder we last saw ("" before the first read, or after a release)."""
        return self._reported_leader

    @property
    def transitions(self) -> int:
        """Changes of leader this replica has seen (the first holder it saw is not one)."""
        return self._transitions

    def families(self) -> list[Family]:
        """`topowatch_cluster_leader{identity}` (1 while we lead) and
        `topowatch_cluster_leader_transitions_total{identity}`."""
        return leader_families(self.identity, self.is_leader, self._transitions)

    # ---- the loop ----

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # a bug must not end the election silently in a live replica
                log.exception("leader election round failed")
            self._stopping.wait(self._pause())

    def _pause(self) -> float:
        """Renew every retry_period; a candidate retries with client-go's jitter, so that
        candidates started together do not keep colliding."""
        retry = self.config.retry_period
        if self.is_leader:
            return retry
        return retry * (1.0 + random.random() * JITTER_FACTOR)

    def tick(self) -> None:
        """One round: read the Lease, decide, write. Public for tests that drive the loop."""
        config = self.config
        now = self._clock()
        with self._mutex:
            renewed_at = self._renewed_at
        if renewed_at is not None and not leading(renewed_at, now, config):
            self._step_down("no successful renewal within renew_deadline")
            renewed_at = None
        budget = config.renew_deadline
        if renewed_at is not None:
            budget = max(0.05, renewed_at + config.renew_deadline - now)
        try:
            record = self.lock.get(budget)
        except LeaseError as error:
            log.warning("leader election: %s", error)
            return
        now = self._clock()
        with self._mutex:
            self._observed_at = observed_since(self._observed, self._observed_at, record, now)
            self._observed = record
            observed_at = self._observed_at
        if record is not None:
            self._report_leader(record.holder_identity)
        if self._stopping.is_set():
            return
        decision = decide(
            record,
            observed_at,
            now,
            self.identity,
            config,
            renewed_at=renewed_at,
            wall=self._wall(),
        )
        if decision.action == "wait":
            log.debug("leader election: %s", decision.reason)
            return
        if decision.action == "step_down":
            self._step_down(decision.reason)
            return
        assert decision.record is not None
        sent = self._clock()
        if renewed_at is not None:  # the read took some of the time left before the deadline
            budget = max(0.05, renewed_at + config.renew_deadline - sent)
        try:
            if decision.action == "create":
                written = self.lock.create(decision.record, budget)
            else:
                written = self.lock.update(decision.record, budget)
        except LostRaceError as error:
            log.info("leader election: lost a race (%s)", error)
            self._step_down("a conflicting write: someone else changed the lease")
            return
        except LeaseError as error:
            log.warning("leader election: %s", error)
            return
        with self._mutex:
            self._observed = written
            self._observed_at = sent
            self._renewed_at = sent  # stop() releases what we hold, even won just now
        if self._stopping.is_set():
            return  # stop() has taken over: no callbacks for a leadership it ends
        self._report_leader(self.identity)
        if not self._leading:
            self._set_leading(True, decision.reason)

    def _step_down(self, reason: str) -> None:
        with self._mutex:
            self._renewed_at = None
        if self._leading:
            self._set_leading(False, reason)

    def _set_leading(self, now_leading: bool, reason: str) -> None:
        self._leading = now_leading
        if now_leading:
            log.info("%s is now the leader (%s)", self.identity, reason)
            if self._on_started is not None:
                self._emit(self._on_started)
        else:
            log.warning("%s stopped leading: %s", self.identity, reason)
            if self._on_stopped is not None:
                self._emit(self._on_stopped)

    def _report_leader(self, holder: str) -> None:
        if not holder or holder == self._reported_leader:
            return
        if self._reported_leader:
            self._transitions += 1
        self._reported_leader = holder
        if holder != self.identity:
            log.info("the leader is %s", holder)
        callback = self._on_new_leader
        if callback is not None:
            self._emit(lambda: callback(holder))

    def _emit(self, callback: Callable[[], None]) -> None:
        """To the callback thread while running; at once when a test drives `tick()`."""
        if self._dispatcher is None:
            callback()
        else:
            self._callbacks.put(callback)

    def _release(self, observed: LeaseRecord) -> None:
        if observed.holder_identity != self.identity:
            return
        try:
            released = self.lock.update(
                release_record(observed, self._wall()), self.config.renew_deadline
            )
        except LeaseError as error:
            log.warning("leader election: could not release the lease: %s", error)
            return
        with self._mutex:
            self._observed = released
        log.info("%s released the lease %s", self.identity, self.lock.describe())

    def _dispatch(self) -> None:
        while True:
            callback = self._callbacks.get()
            if callback is None:
                return
            try:
                callback()
            except Exception:
                log.exception("leader election callback failed")
