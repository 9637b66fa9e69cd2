"""The history API: preemptions and the remediation audit over the whole history, paged.

    GET /api/v1/preemptions?since=30d&until=&namespace=&queue=&verdict=&limit=100&cursor=
    GET /api/v1/remediation/history?since=7d&node=&limit=100&cursor=
    GET /api/v1/admission/history?since=7d&workload=NAMESPACE/NAME&node=&limit=100&cursor=

The last is the topowatch.io/node-health admission check's decisions (issue 30), each the same
entry /api/v1/admission lists, from the store: they outlive a restart.

Both answer a JSON list, newest first, of the same documents the live views give. The next
page's cursor is in the `X-Next-Cursor` header and a `Link: <...>; rel="next"` header (absent on
the last page), so the body stays what clients of the unpaged API already read.

`X-Topowatch-Source` says where the page came from: `history` (the store, which lags the live
model by the history writer's flush, about a second) or `live` (this process's memory: no
store is configured, or it is unavailable; then `X-Topowatch-History` says why). A live page's
cursor pages the live model on; a store's cursor needs the store (503 while it is away).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlencode

from aiohttp import web

from exporter.cluster.history.args import parse_since
from exporter.store.records import (
    DEFAULT_LIMIT,
    AuditQuery,
    Page,
    PreemptionQuery,
)
from exporter.store.sqlstore import StoreUnavailable

OffLoop = Callable[..., Awaitable[Any]]
Answer = tuple[Page, str, str | None]  # the page, its source, why the store did not answer


class HistoryService(Protocol):
    """What the routes need of the cluster service (exporter.cluster.service)."""

    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def history(self) -> object | None: ...
    @property
    def controller(self) -> object | None: ...

    def preemption_page(self, q: PreemptionQuery) -> Answer: ...
    def audit_page(self, q: AuditQuery) -> Answer: ...
    def admission_page(self, q: AuditQuery) -> Answer: ...
    @property
    def admission(self) -> object | None: ...


def add_history_routes(app: web.Application, service: HistoryService, off_loop: OffLoop) -> None:
    def common(request: web.Request) -> dict[str, Any]:
        q = request.query
        now = service.clock()
        try:
            limit = int(q.get("limit", DEFAULT_LIMIT))
        except ValueError:
            raise ValueError(f"limit={q.get('limit')!r}: expected a whole number") from None
        return {
            "since": parse_since(q.get("since"), now),
            "limit": limit,
            "cursor": q.get("cursor") or None,
        }

    def answer(request: web.Request, result: Answer) -> web.Response:
        page, source, note = result
        headers = {"X-Topowatch-Source": source}
        if note:
            headers["X-Topowatch-History"] = f"unavailable: {note}"[:300]
        if page.next_cursor is not None:
            query = {**request.query, "cursor": page.next_cursor}
            headers["X-Next-Cursor"] = page.next_cursor
            headers["Link"] = f'<{request.path}?{urlencode(query)}>; rel="next"'
        return web.json_response(list(page.items), headers=headers)

    async def paged(
        request: web.Request,
        query_of: Callable[[web.Request], Any],
        fetch: Callable[[Any], Answer],
    ) -> web.Response:
        """One page: the query read from the request (400 when it cannot be), fetched off the
        loop (503 while the store a cursor needs is away)."""
        try:
            return answer(request, await off_loop(fetch, query_of(request)))
        except ValueError as exc:
            return _error(400, str(exc))
        except StoreUnavailable as exc:
            return _error(503, f"history store unavailable: {exc}")

    def preemption_query(request: web.Request) -> PreemptionQuery:
        q = request.query
        return PreemptionQuery(
            **common(request),
            until=parse_since(q.get("until"), service.clock()) if q.get("until") else None,
            namespace=q.get("namespace") or None,
            queue=q.get("queue") or None,
            verdict=q.get("verdict") or None,
        )

    def audit_query(request: web.Request) -> AuditQuery:
        return AuditQuery(**common(request), node=request.query.get("node") or None)

    def admission_query(request: web.Request) -> AuditQuery:
        q = request.query
        return AuditQuery(
            **common(request),
            node=q.get("node") or None,
            admission=True,
            workload=q.get("workload") or None,
        )

    async def preemptions(request: web.Request) -> web.Response:
        return await paged(request, preemption_query, service.preemption_page)

    async def remediation_history(request: web.Request) -> web.Response:
        if service.history is None and service.controller is None:
            return _error(404, "no remediation (--remediation-config) and no history store")
        return await paged(request, audit_query, service.audit_page)

    async def admission_history(request: web.Request) -> web.Response:
        if service.history is None and service.admission is None:
            return _error(404, "no admission check (admission.enabled) and no history store")
        return await paged(request, admission_query, service.admission_page)

    app.router.add_get("/api/v1/preemptions", preemptions)
    app.router.add_get("/api/v1/admission/history", admission_history)
    app.router.add_get("/api/v1/remediation/history", remediation_history)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
