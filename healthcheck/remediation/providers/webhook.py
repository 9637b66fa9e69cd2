"""Webhook provider: POST each decision as JSON to a configured URL, for other automation.

A timeout bounds each call; anything but a 2xx answer is a failure for that node.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from healthcheck.remediation.providers.base import ActionRequest, ActionResult


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

    def _post(self, request: ActionRequest) -> ActionResult:
        payload = {"node": request.node, "action": request.action, "decision": request.decision}
        body = json.dumps(payload, sort_keys=True).encode()
        http_request = urllib.request.Request(
            self.url, data=body, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            return ActionResult(request.node, False, f"webhook answered {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return ActionResult(request.node, False, f"webhook unreachable: {exc}")
        if not 200 <= status < 300:
            return ActionResult(request.node, False, f"webhook answered {status}")
        return ActionResult(request.node, True, f"webhook answered {status}")
