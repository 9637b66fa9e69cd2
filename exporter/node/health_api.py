"""`GET /api/v1/health`: the node's health findings for a reader with no Kubernetes (Slurm).

On Kubernetes the agent publishes its findings in the Node annotation `topowatch.io/findings`
(healthcheck/detection/reporter.py). A Slurm cluster has no Node object, so the controller on the
head node asks each agent instead, and gets the same list:

    {"node": "ip-10-1-2-3", "generated_at": "2026-11-22T10:00:05Z", "ready": true,
     "version": "9c1f0e4b7a2d3e58",
     "findings": [<exactly the annotation's entries, exporter/core/findings.py>]}

so `decode_findings(json.dumps(body["findings"]))` reads it as it reads the annotation.
`generated_at` is when the checks produced these findings (the poll's time, RFC 3339 UTC), so
the reader can tell a wedged agent's old verdict from a fresh one; before the first evaluation
the answer is 503 with `ready: false`, no findings, version "" and the time of the answer.

`version` names what a reader acts on, the findings list alone: the first 16 hex digits of the
SHA-256 of its encoding (`findings_to_json`), so a poll that finds the same again keeps it
(`generated_at` moves, the version does not). A reader that already holds a version can wait for
the next one instead of polling: `?wait=SECONDS&version=V` holds the answer while V is still the
current version, at most `MAX_WAIT_S` seconds (the wait itself is the server's, `HealthApi`;
this module only reads the query, `parse_wait`).

Findings name hardware faults and drive node replacement, so the endpoint wants a bearer token
(RFC 6750) shared with the controller, compared in constant time; without a configured token it
is off (404) rather than open. Pure: the server hands in the token, the header and the latest
evaluation, and writes the `Response` back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs

from exporter.core.exposition import COUNTER, Family
from exporter.core.findings import Finding, findings_to_json, format_time

HEALTH_PATH = "/api/v1/health"
JSON_CONTENT_TYPE = "application/json"
REALM = 'Bearer realm="topowatch"'

# Outcomes, the `outcome` label of topowatch_node_health_api_requests_total (bounded).
OK = "ok"
NOT_READY = "not_ready"
NO_CREDENTIALS = "no_credentials"
BAD_CREDENTIALS = "bad_credentials"
DISABLED = "disabled"
BAD_REQUEST = "bad_request"
OUTCOMES = (OK, NOT_READY, NO_CREDENTIALS, BAD_CREDENTIALS, DISABLED, BAD_REQUEST)

# Long-poll bounds: the longest a request is held, whatever `wait` asks (under the server's
# 30 s socket timeout and a reader's usual 30 s), and how many may be held at once; a request
# beyond that many is answered at once, as if it had not asked to wait.
MAX_WAIT_S = 25.0
MAX_WAITERS = 16
VERSION_DIGITS = 16


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One poll's verdict as published: the findings the annotation would carry
    (`healthcheck.detection.reporter.published`) and when the checks produced them (unix
    seconds)."""

    findings: tuple[Finding, ...]
    at: float


@dataclass(frozen=True, slots=True)
class Wait:
    """What a request's query asks: hold the answer up to `seconds` (already capped at
    `MAX_WAIT_S`) while the current version is `version`. No `version` (None) never waits."""

    seconds: float = 0.0
    version: str | None = None

    def holds(self, current: str) -> bool:
        """Whether the answer waits while `current` is the published version."""
        return self.seconds > 0 and self.version is not None and self.version == current


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


def version_of(evaluation: Evaluation | None) -> str:
    """The version a reader compares: "" before the first evaluation, else a digest of the
    findings' encoding only (not `at`: the same findings found again keep their version)."""
    if evaluation is None:
        return ""
    return _digest(findings_to_json(evaluation.findings))


def parse_wait(query: str) -> Wait | str:
    """The long-poll the query string (after `?`, undecoded) asks for, or why it is bad.
    `wait` must be a finite number >= 0 of seconds (capped at `MAX_WAIT_S`), given at most once;
    `version` at most once, any text (an unknown one differs from the current: no wait). Other
    parameters are ignored."""
    params = parse_qs(query, keep_blank_values=True)
    waits, versions = params.get("wait", []), params.get("version", [])
    if len(waits) > 1 or len(versions) > 1:
        return "wait and version may each be given once"
    seconds = 0.0
    if waits:
        try:
            seconds = float(waits[0])
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            return "wait must be a finite number of seconds >= 0"
    return Wait(min(seconds, MAX_WAIT_S), versions[0] if versions else None)


def body(node: str, evaluation: Evaluation | None, now: float) -> dict[str, object]:
    """The JSON document: the annotation's findings list, decoded from its very encoding, and
    that encoding's version."""
    if evaluation is None:
        return {
            "node": node,
            "generated_at": format_time(now),
            "ready": False,
            "version": "",
            "findings": [],
        }
    encoded = findings_to_json(evaluation.findings)
    return {
        "node": node,
        "generated_at": format_time(evaluation.at),
        "ready": True,
        "version": _digest(encoded),
        "findings": json.loads(encoded),
    }


def admit(token: str | None, authorization: str | None, query: str) -> Wait | tuple[str, Response]:
    """The first half of an answer, before any wait: the outcome and refusal for a request that
    gets no findings (endpoint off, no or a bad token, then a bad query: credentials are checked
    first, so an unauthenticated request learns nothing and never waits), else its `Wait`."""
    if token is None:
        return DISABLED, _json(404, {"error": "health API disabled: no --health-token-file"})
    outcome = authorize(authorization, token)
    if outcome == NO_CREDENTIALS:
        return outcome, _json(401, {"error": "bearer token required"}, REALM)
    if outcome == BAD_CREDENTIALS:
        challenge = f'{REALM}, error="invalid_token"'
        return outcome, _json(401, {"error": "invalid bearer token"}, challenge)
    wait = parse_wait(query)
    if isinstance(wait, str):
        return BAD_REQUEST, _json(400, {"error": wait})
    return wait


def answer(node: str, evaluation: Evaluation | None, now: float) -> tuple[str, Response]:
    """The second half, for an admitted request: the findings (200), or 503 before the first
    evaluation."""
    document = body(node, evaluation, now)
    if evaluation is None:
        return NOT_READY, _json(503, document)
    return OK, _json(200, document)


def respond(
    node: str,
    token: str | None,
    authorization: str | None,
    evaluation: Evaluation | None,
    now: float,
    query: str = "",
) -> tuple[str, Response]:
    """The outcome and the answer to one request that does not wait (`admit`, then `answer`).
    `token` None means no token was configured: the endpoint is off, whatever the request
    carries."""
    admitted = admit(token, authorization, query)
    if not isinstance(admitted, Wait):
        return admitted
    return answer(node, evaluation, now)


def requests_family(node: str, counts: Mapping[str, int]) -> Family:
    """`topowatch_node_health_api_requests_total{node,outcome}`, every outcome present from 0 so
    `rate()` and alerts see a series before the first request of its kind."""
    family = Family(
        "topowatch_node_health_api_requests",
        COUNTER,
        "Requests to the node agent's /api/v1/health, by outcome (ok, not_ready,"
        " no_credentials, bad_credentials, disabled, bad_request).",
    )
    for outcome in OUTCOMES:
        family.add([("node", node), ("outcome", outcome)], counts.get(outcome, 0))
    return family


def _digest(encoded: str) -> str:
    return hashlib.sha256(encoded.encode()).hexdigest()[:VERSION_DIGITS]


def _json(status: int, document: Mapping[str, object], challenge: str | None = None) -> Response:
    headers: Sequence[tuple[str, str]] = [
        ("Content-Type", JSON_CONTENT_TYPE),
        ("Cache-Control", "no-store"),
    ]
    if challenge is not None:
        headers = [*headers, ("WWW-Authenticate", challenge)]
    return Response(status, tuple(headers), json.dumps(document, sort_keys=True).encode())
