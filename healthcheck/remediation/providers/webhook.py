"""Webhook provider: POST each decision as JSON to a configured URL, for other automation.

A timeout bounds each call; anything but a 2xx answer is a failure for that node.

A rack-level request (healthcheck/remediation/rack.py: half an UltraServer bad) is one POST for
the whole rack (`post_rack`, body `rack_payload`): `{"scope": "ultraserver", "ultraserver": id,
"action", "nodes": [every node of it], "bad_nodes": [...], "decision": {...}}`, never one per
node.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from healthcheck.remediation.providers.base import ActionRequest, ActionResult
from healthcheck.remediation.rack import RackDecision


def rack_payload(decision: RackDecision) -> dict[str, Any]:
    """The JSON body of one rack-level request."""
    return {
        "scope": "ultraserver",
        "ultraserver": decision.rack,
        "action": decision.action,
        "nodes": list(decision.members),
        "bad_nodes": list(decision.bad),
        "decision": decision.as_dict(),
    }


class WebhookNotifier:
    name = "webhook"
    # Passes the action on as asked.
    actions: frozenset[str] = frozenset({"reset", "reboot", "replace"})

    def __init__(
        self, url: str, timeout_s: float = 5.0, headers: Mapping[str, str] | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url {url!r} is not http(s)")
        self.url = url
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        return [self._post(r) for r in requests]

    def post_rack(self, decision: RackDecision) -> ActionResult:
        """One POST for a whole UltraServer; the result is named after the rack."""
        return self._send(decision.rack, rack_payload(decision))

    def _post(self, request: ActionRequest) -> ActionResult:
        payload = {"node": request.node, "action": request.action, "decision": request.decision}
        return self._send(request.node, payload)

    def _send(self, node: str, payload: Mapping[str, Any]) -> ActionResult:
        body = json.dumps(payload, sort_keys=True).encode()
        http_request = urllib.request.Request(
            self.url, data=body, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            return ActionResult(node, False, f"webhook answered {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return ActionResult(node, False, f"webhook unreachable: {exc}")
        if not 200 <= status < 300:
            return ActionResult(node, False, f"webhook answered {status}")
        return ActionResult(node, True, f"webhook answered {status}")
