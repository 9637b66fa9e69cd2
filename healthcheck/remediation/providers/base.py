"""The one interface every provider implements, and the per-node request/result it trades in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from healthcheck.remediation.state import Action

# What a provider that does not say otherwise can carry out. No node API here resets one GPU;
# a reboot resets every GPU on the node, so it stands in for a reset (`executable`). A deep
# health check has no stand-in: only a provider that declares `deep-check` runs one.
DEFAULT_ACTIONS: frozenset[str] = frozenset({"reboot", "replace"})


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
    # Not done, but not refused either: the API will take it later (a deep check while another
    # runs on the cluster). The controller asks again after deep_check.retry_seconds; it is not an
    # attempt and never a reason to climb the ladder.
    deferred: bool = False


class Provider(Protocol):
    name: str

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        """One result per request, in any order; per-node failures are results, not raises."""
        ...


def provider_actions(provider: Provider) -> frozenset[str]:
    """The actions a provider carries out as asked (its `actions`, else reboot and replace)."""
    declared = getattr(provider, "actions", None)
    return frozenset(declared) if isinstance(declared, frozenset | set) else DEFAULT_ACTIONS


def executable(action: Action, provider: Provider) -> Action | None:
    """What `provider` does for `action`: itself, a reboot for a GPU reset, or None (cannot)."""
    can = provider_actions(provider)
    if action in can:
        return action
    if action == "reset" and "reboot" in can:
        return "reboot"
    return None


def failed_all(requests: Sequence[ActionRequest], detail: str) -> list[ActionResult]:
    return [ActionResult(r.node, False, detail) for r in requests]
