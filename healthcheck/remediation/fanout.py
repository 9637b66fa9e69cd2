"""Fan-out: one round's decided actions sent to every configured provider, and what came back.

Why a piece of its own: a node's action is carried out by several providers at once (a label, a
cordon, an API call, a webhook), and whoever asks, every provider's outcome must be collected and
combined the same way: each provider asked in its configured order with the whole batch it can
carry out; a request it cannot carry out fails for it (`cannot <action>`), except a deep check
that some other provider runs (a label or a cordon has nothing to add to a check); a provider
that raises fails every node of its batch (`raised: …`), never the caller; a node it gives no
result for fails (`gave no result`). The action is done when every answer is ok, deferred when
the answers that are not ok are all deferred (the API takes it later), failed otherwise; what was
done is the strongest action some provider carried out.

No I/O of its own and no state: providers do the I/O, the caller persists and audits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from healthcheck.remediation.policy import strongest
from healthcheck.remediation.providers.base import (
    ActionRequest,
    ActionResult,
    Provider,
    executable,
)
from healthcheck.remediation.state import Action


@dataclass(frozen=True, slots=True)
class Outcome:
    """Every provider's answer for one node, combined."""

    # In the providers' order; each detail reads `<provider>[ (<asked> done as <did>)]: <detail>`.
    results: tuple[ActionResult, ...] = ()
    # What the providers that answered ok carried out (a reset may be done as a reboot).
    carried_out: tuple[Action, ...] = ()

    @property
    def ok(self) -> bool:
        """Done: at least one provider answered, and every answer is ok."""
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def detail(self) -> str:
        return "; ".join(r.detail for r in self.results) or "no provider configured"

    @property
    def deferred(self) -> bool:
        """Not done, but every answer that is not ok is deferred: to be asked again later."""
        return bool(self.results) and not self.ok and all(r.ok or r.deferred for r in self.results)

    @property
    def performed(self) -> Action | None:
        """The strongest action some provider carried out; None: none did (the step was not
        taken)."""
        return strongest(self.carried_out)


def deep_checks(providers: Sequence[Provider]) -> tuple[str, ...]:
    """The deep health checks the providers that can run one ask for (empty: none can)."""
    checks: list[str] = []
    for provider in providers:
        if executable("deep-check", provider) is not None:
            asked = getattr(provider, "deep_checks", None) or ("requested",)
            checks += [c for c in asked if c not in checks]
    return tuple(checks)


def fan_out(providers: Sequence[Provider], requests: Sequence[ActionRequest]) -> dict[str, Outcome]:
    """Ask each provider, in order, for the requests it can carry out; each request's node →
    its combined outcome (in the order of `requests`). Never raises for a provider's fault."""
    results: dict[str, list[ActionResult]] = {r.node: [] for r in requests}
    performed: dict[str, list[Action]] = {r.node: [] for r in requests}
    asked = {r.node: r.action for r in requests}
    for provider in providers:
        batch: list[ActionRequest] = []
        answered: list[ActionResult] = []
        for request in requests:
            doing = executable(request.action, provider)
            if doing is None and request.action == "deep-check" and deep_checks(providers):
                continue  # others run it; a label or a cordon has nothing to add to a check
            if doing is None:
                answered.append(ActionResult(request.node, False, f"cannot {request.action}"))
            else:
                batch.append(replace(request, action=doing))
        try:
            got_back = provider.execute(batch) if batch else []
        except Exception as exc:  # a provider bug fails its nodes, never the caller
            got_back = [ActionResult(r.node, False, f"raised: {exc}") for r in batch]
        seen = {a.node for a in got_back}
        answered += got_back
        answered += [
            ActionResult(r.node, False, "gave no result") for r in batch if r.node not in seen
        ]
        doing_for = {r.node: r.action for r in batch}
        for result in answered:
            if result.node not in results:
                continue
            did = doing_for.get(result.node)
            done_as = ""
            if did is not None and did != asked[result.node]:
                done_as = f" ({asked[result.node]} done as {did})"
            results[result.node].append(
                replace(result, detail=f"{provider.name}{done_as}: {result.detail}")
            )
            if result.ok and did is not None:
                performed[result.node].append(did)
    return {node: Outcome(tuple(got), tuple(performed[node])) for node, got in results.items()}
