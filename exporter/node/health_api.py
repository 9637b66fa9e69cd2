"""`GET /api/v1/health`: the node's health findings for a reader with no Kubernetes (Slurm).

On Kubernetes the agent publishes its findings in the Node annotation `topowatch.io/findings`
(healthcheck/reporter.py). A Slurm cluster has no Node object, so the controller on the head
node asks each agent instead, and gets the same list:

    {"node": "ip-10-1-2-3", "generated_at": "2026-11-22T10:00:05Z", "ready": true,
     "findings": [<exactly the annotation's entries, healthcheck/findings.py>]}

so `decode_findings(json.dumps(body["findings"]))` reads it as it reads the annotation.
`generated_at` is when the checks produced these findings (the poll's time, RFC 3339 UTC), so
the reader can tell a wedged agent's old verdict from a fresh one; before the first evaluation
the answer is 503 with `ready: false`, no findings, and the time of the answer.

Findings name hardware faults and drive node replacement, so the endpoint wants a bearer token
(RFC 6750) shared with the controller, compared in constant time; without a configured token it
is off (404) rather than open. Pure: the server hands in the token, the header and the latest
evaluation, and writes the `Response` back.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.exposition import COUNTER, Family
from healthcheck.findings import Finding, findings_to_json, format_time

HEALTH_PATH = "/api/v1/health"
JSON_CONTENT_TYPE = "application/json"
REALM = 'Bearer realm="topowatch"'

# Outcomes, the `outcome` label of topowatch_node_health_api_requests_total (bounded).
OK = "ok"
NOT_READY = "not_ready"
NO_CREDENTIALS = "no_credentials"
BAD_CREDENTIALS = "bad_credentials"
DISABLED = "disabled"
OUTCOMES = (OK, NOT_READY, NO_CREDENTIALS, BAD_CREDENTIALS, DISABLED)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One poll's verdict as published: the findings the annotation would carry
    (`healthcheck.reporter.published`) and when the checks produced them (unix seconds)."""

    findings: tuple[Finding, ...]
    at: float


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def authorize(authorization: str | None, token: str) -> str:
    """OK when `authorization` is `Bearer <token>` (scheme case-insensitive, RFC 7235), else
    why not. Constant-time on the credentials, so response timing leaks nothing of the token;
    an empty token never matches (an empty token file must not open the endpoint)."""
    if not authorization or not authorization.strip():
        return NO_CREDENTIALS
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return BAD_CREDENTIALS
    matches = hmac.compare_digest(credentials.strip().encode(), token.encode())
    return OK if matches and token else BAD_CREDENTIALS


def body(node: str, evaluation: Evaluation | None, now: float) -> dict[str, object]:
    """The JSON document: the annotation's findings list, decoded from its very encoding."""
    if evaluation is None:
        return {"node": node, "generated_at": format_time(now), "ready": False, "findings": []}
    findings = json.loads(findings_to_json(evaluation.findings))
    return {
        "node": node,
        "generated_at": format_time(evaluation.at),
        "ready": True,
        "findings": findings,
    }


def respond(
    node: str,
    token: str | None,
    authorization: str | None,
    evaluation: Evaluation | None,
    now: float,
) -> tuple[str, Response]:
    """The outcome and the answer to one request. `token` None means no token was configured:
    the endpoint is off, whatever the request carries."""
    if token is None:
        return DISABLED, _json(404, {"error": "health API disabled: no --health-token-file"})
    outcome = authorize(authorization, token)
    if outcome == NO_CREDENTIALS:
        return outcome, _json(401, {"error": "bearer token required"}, REALM)
    if outcome == BAD_CREDENTIALS:
        challenge = f'{REALM}, error="invalid_token"'
        return outcome, _json(401, {"error": "invalid bearer token"}, challenge)
    document = body(node, evaluation, now)
    if evaluation is None:
        return NOT_READY, _json(503, document)
    return OK, _json(200, document)


def requests_family(node: str, counts: Mapping[str, int]) -> Family:
    """`topowatch_node_health_api_requests_total{node,outcome}`, every outcome present from 0 so
    `rate()` and alerts see a series before the first request of its kind."""
    family = Family(
        "topowatch_node_health_api_requests",
        COUNTER,
        "Requests to the node agent's /api/v1/health, by outcome (ok, not_ready,"
        " no_credentials, bad_credentials, disabled).",
    )
    for outcome in OUTCOMES:
        family.add([("node", node), ("outcome", outcome)], counts.get(outcome, 0))
    return family


def _json(status: int, document: Mapping[str, object], challenge: str | None = None) -> Response:
    headers: Sequence[tuple[str, str]] = [
        ("Content-Type", JSON_CONTENT_TYPE),
        ("Cache-Control", "no-store"),
    ]
    if challenge is not None:
        headers = [*headers, ("WWW-Authenticate", challenge)]
    return Response(status, tuple(headers), json.dumps(document, sort_keys=True).encode())
