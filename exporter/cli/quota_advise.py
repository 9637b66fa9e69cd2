"""`topowatch quota advise`: quota advice from a running service or a kubectl dump, printed
as a table or JSON, or emitted as UpdateComputeQuota requests / ClusterQueue merge patches.

Nothing changes in the cluster unless --apply is given; --apply asks first (unless --yes),
then calls SageMaker UpdateComputeQuota through boto3, one request per team.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.cluster.explain import DumpError, load_dump_objects, model_from_objects
from exporter.cluster.objects import ClusterQueue
from exporter.cluster.quota.advisor import AdvisorConfig, Recommendation, advise, fair_share_weights
from exporter.cluster.quota.emit import (
    QuotaRef,
    QuotaRefError,
    hyperpod_requests,
    kueue_patches,
    load_quota_refs,
    refs_from_summaries,
)
from exporter.cluster.quota.history import QuotaHistory
from exporter.cluster.quota.views import recommendation_from_view, recommendations_view

PROG = "topowatch quota advise"
RECOMMENDATIONS_PATH = "/api/v1/quota/recommendations"


class QuotaCliError(Exception):
    """A problem to report in one line, exit status 1."""


@dataclass(slots=True)
class Advice:
    """Recommendations plus what the emitters need of the cluster (known only from a dump)."""

    recs: list[Recommendation]
    queues: Mapping[str, ClusterQueue] = field(default_factory=dict)
    raw_queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def run_quota_advise(args: argparse.Namespace) -> int:
    emit = args.emit
    if args.apply and emit is None:
        emit = "hyperpod"
    if args.apply and emit != "hyperpod":
        print(f"{PROG}: --apply calls SageMaker; apply Kueue patches with kubectl", file=sys.stderr)
        return 2
    try:
        advice = advice_from_dump(args.dump) if args.dump else advice_from_server(args.server)
        if emit is None:
            if args.json:
                sys.stdout.write(_json(recommendations_view(advice.recs)))
            else:
                sys.stdout.write(recommendations_table(advice.recs))
            return 0
        if emit == "kueue":
            return _emit_kueue(advice, bool(args.dump))
        return _emit_hyperpod(advice, args)
    except QuotaCliError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1


# --- sources ----------------------------------------------------------------------------------


def advice_from_dump(dump: Path) -> Advice:
    try:
        objects = load_dump_objects(dump.read_text())
    except OSError as exc:
        raise QuotaCliError(f"cannot read {dump}: {exc.strerror}") from exc
    except DumpError as exc:
        raise QuotaCliError(f"{dump}: {exc}") from exc
    model, now = model_from_objects(objects)
    history = QuotaHistory.from_model_only(model, now)
    config = AdvisorConfig(weights=fair_share_weights(model))
    raw = {
        str(obj["metadata"]["name"]): obj
        for obj in objects
        if obj.get("kind") == "ClusterQueue"
        and isinstance(obj.get("metadata"), Mapping)
        and isinstance(obj["metadata"].get("name"), str)
    }
    return Advice(advise(model, history, now, config), dict(model.cluster_queues), raw)


def advice_from_server(server: str) -> Advice:
    url = server.rstrip("/") + RECOMMENDATIONS_PATH
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        raise QuotaCliError(f"{url}: {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise QuotaCliError(f"cannot reach {url}: {exc}") from exc
    except ValueError as exc:
        raise QuotaCliError(f"{url}: not JSON: {exc}") from exc
    if not isinstance(body, list):
        raise QuotaCliError(f"{url}: expected a JSON list of recommendations")
    recs = [r for r in map(_from_item, body) if r is not None]
    if len(recs) < len(body):
        print(f"{PROG}: ignored {len(body) - len(recs)} unreadable entries", file=sys.stderr)
    return Advice(recs)


def _from_item(item: Any) -> Recommendation | None:
    return recommendation_from_view(item) if isinstance(item, Mapping) else None


# --- output -----------------------------------------------------------------------------------


def recommendations_table(recs: Sequence[Recommendation]) -> str:
    if not recs:
        return "no quota changes recommended\n"
    header = ("CLUSTER QUEUE", "TEAM", "KIND", "FLAVOR/LEVEL", "CURRENT", "ADVISED", "REASON")
    rows = [
        (
            r.cluster_queue,
            r.team,
            r.kind,
            r.flavor or r.level or "-",
            "none" if r.current is None else str(r.current),
            str(r.recommended),
            r.reason,
        )
        for r in recs
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = []
    for row, rec in zip((header, *rows), (None, *recs), strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if rec is not None:
            lines.append(f"    {rec.detail}")
    return "\n".join(lines) + "\n"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def _notes(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)


def _emit_kueue(advice: Advice, from_dump: bool) -> int:
    if not from_dump:
        raise QuotaCliError(
            "--emit kueue needs --from DUMP.yaml: a merge patch carries the ClusterQueue's whole "
            "resourceGroups, which only the ClusterQueue objects hold"
        )
    emitted = kueue_patches(advice.recs, advice.raw_queues)
    sys.stdout.write(_json(emitted.items))
    _notes(emitted.notes)
    return 0


# --- HyperPod ---------------------------------------------------------------------------------


def make_sagemaker_client(region: str | None) -> Any:
    """A boto3 SageMaker client (a seam: tests hand back a Stubber-wrapped client)."""
    import boto3

    return boto3.client("sagemaker", region_name=region)


def confirm(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _emit_hyperpod(advice: Advice, args: argparse.Namespace) -> int:
    client: Any = None
    notes: list[str] = []
    if args.quota_ids is not None:
        try:
            refs, notes = load_quota_refs(args.quota_ids.read_text())
        except OSError as exc:
            raise QuotaCliError(f"cannot read {args.quota_ids}: {exc.strerror}") from exc
        except QuotaRefError as exc:
            raise QuotaCliError(f"{args.quota_ids}: {exc}") from exc
    elif args.apply:
        client = make_sagemaker_client(args.region)
        refs, notes = _lookup_refs(client, args.cluster_arn)
    else:
        refs = {}
    emitted = hyperpod_requests(advice.recs, refs, advice.queues)
    sys.stdout.write(_json(emitted.items))
    _notes([*notes, *emitted.notes])
    if not args.apply:
        return 0
    if not emitted.items:
        print(f"{PROG}: nothing to apply", file=sys.stderr)
        return 0
    if not args.yes and not confirm(
        f"Apply {len(emitted.items)} UpdateComputeQuota request(s) shown above? [y/N] "
    ):
        print(f"{PROG}: not applied", file=sys.stderr)
        return 1
    client = client or make_sagemaker_client(args.region)
    return _apply(client, emitted.items)


def _lookup_refs(client: Any, cluster_arn: str | None) -> tuple[dict[str, QuotaRef], list[str]]:
    from botocore.exceptions import BotoCoreError, ClientError

    summaries: list[Mapping[str, Any]] = []
    kwargs: dict[str, Any] = {"ClusterArn": cluster_arn} if cluster_arn else {}
    try:
        while True:
            page = client.list_compute_quotas(**kwargs)
            summaries.extend(page.get("ComputeQuotaSummaries", []))
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
    except (BotoCoreError, ClientError) as exc:
        raise QuotaCliError(f"ListComputeQuotas failed: {exc}") from exc
    return refs_from_summaries(summaries)


def _apply(client: Any, requests: Sequence[Mapping[str, Any]]) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    failed = 0
    for request in requests:
        quota_id = request["ComputeQuotaId"]
        try:
            reply = client.update_compute_quota(**request)
        except (BotoCoreError, ClientError) as exc:
            failed += 1
            print(f"{PROG}: {quota_id}: UpdateComputeQuota failed: {exc}", file=sys.stderr)
            continue
        print(
            f"{PROG}: {quota_id}: updated to version {reply.get('ComputeQuotaVersion')}",
            file=sys.stderr,
        )
    return 1 if failed else 0
