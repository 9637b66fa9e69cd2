"""The one interface every provider implements, and the per-node request/result it trades in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from healthcheck.state import Action


@dataclass(frozen=True, slots=True)
class ActionRequest:
    node: str
    action: Action
    node_object: dict[str, Any] = field(default_factory=dict)  # the Node as last observed
    decision: dict[str, Any] = field(default_factory=dict)  # Decision.as_dict(), for webhooks


@dataclass(frozen=True, slots=True)
class ActionResult:
    node: str
    ok: bool
    detail: str


class Provider(Protocol):
    name: str

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        """One result per request, in any order; per-node failures are results, not raises."""
        ...


def failed_all(requests: Sequence[ActionRequest], detail: str) -> list[ActionResult]:
    return [ActionResult(r.node, False, detail) for r in requests]
