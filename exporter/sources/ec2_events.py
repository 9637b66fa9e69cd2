"""EC2 scheduled events: reboots, maintenance and retirements AWS has announced for instances.

`DescribeInstanceStatus` with IncludeAllInstances (stopped instances too) and an `event.code`
filter, followed through its NextToken pages. Each instance's open events come back as
`ScheduledEvent`s keyed by instance id; the cluster model matches them to Nodes through
spec.providerID. Events AWS marks "[Completed]" or "[Canceled]" in their description are over
and left out.

Throttling is retried here, with capped exponential backoff and full jitter, rather than by
botocore (whose client is built with one attempt), so that the retries can be counted and
tested; a poll still throttled after every attempt raises `Ec2EventsError` and the caller keeps
what it knew. boto3 is imported only when a client is built: the node agent never imports this
module, and the cluster service only with --ec2-events.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

__all__ = [
    "EVENT_CODES",
    "THROTTLING_CODES",
    "Ec2EventsError",
    "Ec2EventsSource",
    "ScheduledEvent",
    "ec2_events_client",
    "events_from_statuses",
]

log = logging.getLogger(__name__)

# EC2's scheduled event codes (DescribeInstanceStatus `Events[].Code`), all of them.
EVENT_CODES: tuple[str, ...] = (
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
)
# Error codes EC2 and botocore use for throttling (botocore/retries/standard.py lists these).
THROTTLING_CODES: frozenset[str] = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "SlowDown",
        "EC2ThrottledException",
    }
)
PAGE_SIZE = 1000  # DescribeInstanceStatus MaxResults: 5 to 1000
_OVER = ("[Completed]", "[Canceled]")


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One EC2 scheduled event of an instance (DescribeInstanceStatus `Events`)."""

    code: str  # instance-reboot | system-reboot | system-maintenance | instance-retirement | ...
    description: str
    not_before: float | None  # Unix seconds
    not_after: float | None = None


class Ec2EventsError(RuntimeError):
    """A poll that did not complete: throttled past every retry, or another API error."""


def ec2_events_client(region: str | None = None, profile: str | None = None) -> EC2Client:
    """An EC2 client with botocore's retries off: `Ec2EventsSource` retries throttling."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(profile_name=profile, region_name=region)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1})
    return session.client("ec2", config=config)


def _seconds(value: object) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return None


def events_from_statuses(
    statuses: object, codes: frozenset[str] = frozenset(EVENT_CODES)
) -> tuple[dict[str, list[ScheduledEvent]], int]:
    """Open events by instance id from one page's `InstanceStatuses`, and how many entries
    were malformed (skipped)."""
    out: dict[str, list[ScheduledEvent]] = {}
    bad = 0
    if not isinstance(statuses, list):
        return out, 1
    for status in statuses:
        if not isinstance(status, Mapping):
            bad += 1
            continue
        instance = status.get("InstanceId")
        events = status.get("Events") or []
        if not isinstance(instance, str) or not instance or not isinstance(events, list):
            bad += 1
            continue
        for event in events:
            if not isinstance(event, Mapping) or not isinstance(event.get("Code"), str):
                bad += 1
                continue
            code = event["Code"]
            description = event.get("Description")
            description = description if isinstance(description, str) else ""
            if code not in codes or description.startswith(_OVER):
                continue
            out.setdefault(instance, []).append(
                ScheduledEvent(
                    code=code,
                    description=description,
                    not_before=_seconds(event.get("NotBefore")),
                    not_after=_seconds(event.get("NotAfter")),
                )
            )
    return out, bad


@dataclass
class Ec2EventsSource:
    """Polls DescribeInstanceStatus for scheduled events. Not thread-safe: one poller."""

    client: Any  # an EC2 client (typed loosely so tests can hand a stubbed one)
    attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    counts: dict[str, int] = field(default_factory=dict)  # ok, throttled, error, throttles, ...

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def poll(self) -> dict[str, tuple[ScheduledEvent, ...]]:
        """Every instance's open scheduled events. Raises Ec2EventsError when a page cannot be
        read (counted under "throttled" or "error")."""
        request: dict[str, Any] = {
            "IncludeAllInstances": True,
            "Filters": [{"Name": "event.code", "Values": list(EVENT_CODES)}],
            "MaxResults": PAGE_SIZE,
        }
        found: dict[str, list[ScheduledEvent]] = {}
        seen_tokens: set[str] = set()
        while True:
            page = self._page(request)
            events, bad = events_from_statuses(page.get("InstanceStatuses"))
            if bad:
                self._count("malformed", bad)
            for instance, items in events.items():
                found.setdefault(instance, []).extend(items)
            token = page.get("NextToken")
            if not isinstance(token, str) or not token:
                break
            if token in seen_tokens:  # a service bug must not loop us forever
                self._count("error")
                raise Ec2EventsError(f"DescribeInstanceStatus repeated NextToken {token[:16]}")
            seen_tokens.add(token)
            request["NextToken"] = token
        self._count("ok")
        return {k: tuple(v) for k, v in found.items()}

    def _page(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(max(1, self.attempts)):
            try:
                response = self.client.describe_instance_status(**request)
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in THROTTLING_CODES:
                    self._count("error")
                    raise Ec2EventsError(f"DescribeInstanceStatus: {code or exc}") from exc
                self._count("throttles")
                if attempt + 1 >= max(1, self.attempts):
                    break
                cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
                self.sleep(cap * self.jitter())  # full jitter
                continue
            except BotoCoreError as exc:
                self._count("error")
                raise Ec2EventsError(f"DescribeInstanceStatus: {exc}") from exc
            return response if isinstance(response, Mapping) else {}
        self._count("throttled")
        raise Ec2EventsError(f"DescribeInstanceStatus throttled {self.attempts} times in a row")
