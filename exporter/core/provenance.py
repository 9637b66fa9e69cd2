"""Whose findings are these? The controller acts on a Node's `topowatch.io/findings` annotation
only when the node's own agent wrote it.

**How the writer is known: server-side field ownership.** Every write to a Kubernetes object
records, in `metadata.managedFields`, which field manager changed which fields. The node agent
writes the annotation with the field manager `topowatch-node-agent` (`?fieldManager=` on its
PATCH), so the API server lists `f:metadata.f:annotations.f:topowatch.io/findings` under that
manager. `screen_node` trusts the annotation only when that manager, and no other, owns the key;
anything else (another manager, no entry at all, managedFields stripped) is refused: the
controller sees the Node without the findings and without our condition, audits the refusal
(a log line, `topowatch_remediation_problems{reason="findings_not_from_agent"}`, the audit
trail and an Event) and nothing acts on that node until its agent writes again.

**What that does and does not protect against.** managedFields record the manager *name* the
client chose, not the authenticated user, and a client may even rewrite managedFields in its
own update. So on its own this check stops mistakes, not attackers: `kubectl annotate`, a
GitOps or Terraform apply, another controller, a copy of a Node's annotations onto another
Node, a findings annotation left over from an agent that was never ours. Anyone who may patch
Nodes can write `?fieldManager=topowatch-node-agent` too. What stops an attacker is the
chart's ValidatingAdmissionPolicy (`nodeAgent.admissionPolicy.enabled`, Kubernetes 1.30+):

- the node agent's service account may change only the Node named in its bound token's
  `authentication.kubernetes.io/node-name` claim, and only this annotation and the
  `TopowatchHealthy` condition (no label, no other annotation, no spec, no other status);
- nobody else may set or change this annotation at all (removing it stays allowed).

With the policy in place, the only identity that can give a Node new findings is the agent
running on that node, so a compromised agent can at worst report on its own node, and the
ownership check adds a second, independent refusal for writers that slipped past (a cluster
without the policy, or an admin who disabled it). Neither protects against a cluster admin
who removes the policy, nor against a compromised node agent lying about its own node: that
node's health is the agent's word by design.

**Why not a signed payload.** An HMAC over the annotation needs a key on the writing side. One
key shared by all agents lets any agent sign for any node, which is the attack to stop. Per-node
keys (derived from a controller secret and the node name) must reach each agent, and only its
own: RBAC cannot scope a DaemonSet's Secret reads by node any better than its Node writes, so
distributing them needs the same node-bound identity the admission policy already uses, plus a
key service and rotation. The API server already authenticates every write and can enforce
who writes what; the policy uses that directly.

Pure: a Node object in, a verdict out. The agent's side (the field manager name) and the
controller's side (the check) import the name from here so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core.findings import FINDINGS_ANNOTATION, HEALTH_CONDITION

AGENT_FIELD_MANAGER = "topowatch-node-agent"  # the node agent's fieldManager on every write
REFUSED = "findings_not_from_agent"  # the audit reason (a metric label value)
FINDINGS_FIELD = ("f:metadata", "f:annotations", f"f:{FINDINGS_ANNOTATION}")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a Node's findings were not trusted."""

    node: str
    reason: str  # REFUSED
    detail: str
    owners: tuple[str, ...]  # the managers that own the annotation key, if any


def owners(obj: Mapping[str, Any], field: tuple[str, ...] = FINDINGS_FIELD) -> tuple[str, ...]:
    """The field managers whose managedFields entry owns `field` (a fieldsV1 path), sorted.

    Malformed entries own nothing.
    """
    meta = obj.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    found: set[str] = set()
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("manager"), str):
            continue
        node: Any = entry.get("fieldsV1")
        for step in field:
            node = node.get(step) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            found.add(entry["manager"])
    return tuple(sorted(found))


def check(obj: Mapping[str, Any]) -> Refusal | None:
    """None when the findings annotation is absent or written by the node's agent alone."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping) or FINDINGS_ANNOTATION not in annotations:
        return None
    name = str(meta.get("name") or "")
    by = owners(obj)
    if by == (AGENT_FIELD_MANAGER,):
        return None
    if not by:
        detail = (
            f"{FINDINGS_ANNOTATION} has no owner in metadata.managedFields; only the node "
            f"agent's writes (field manager {AGENT_FIELD_MANAGER}) are trusted"
        )
    else:
        detail = (
            f"{FINDINGS_ANNOTATION} was written by field manager(s) {', '.join(by)}, "
            f"not by the node agent ({AGENT_FIELD_MANAGER}) alone"
        )
    return Refusal(name, REFUSED, detail, by)


def screen_node(obj: Any) -> tuple[Any, Refusal | None]:
    """The Node as the controller may read it, and the refusal if its findings are untrusted.

    Trusted (or no findings): `obj` itself. Untrusted: a shallow copy without the findings
    annotation and without the `TopowatchHealthy` condition, so that nothing the agent did
    not write can ask for an action. Anything but a mapping passes through unchanged.
    """
    if not isinstance(obj, Mapping):
        return obj, None
    refusal = check(obj)
    if refusal is None:
        return obj, None
    meta = dict(obj["metadata"])
    meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != FINDINGS_ANNOTATION}
    screened = {**obj, "metadata": meta}
    status = obj.get("status")
    if isinstance(status, Mapping) and isinstance(status.get("conditions"), list):
        kept = [
            c
            for c in status["conditions"]
            if not (isinstance(c, Mapping) and c.get("type") == HEALTH_CONDITION)
        ]
        screened["status"] = {**status, "conditions": kept}
    return screened, refusal


def agent_entry(time: str = "2025-06-15T15:00:00Z") -> dict[str, Any]:
    """The managedFields entry an agent's annotation write leaves on its Node (an Update by
    AGENT_FIELD_MANAGER owning the findings key): for fixtures and benchmarks."""
    return {
        "manager": AGENT_FIELD_MANAGER,
        "operation": "Update",
        "apiVersion": "v1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": {FINDINGS_FIELD[0]: {FINDINGS_FIELD[1]: {FINDINGS_FIELD[2]: {}}}},
    }
