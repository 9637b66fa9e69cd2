"""`topowatch explain`: a plain answer about one workload, from a live service or a dump.

Offline, a `kubectl get nodes,pods,workloads,clusterqueues,localqueues,events -A -o yaml` List
is fed through the same ClusterModel the service runs, so both paths answer from the same
workload view (exporter.cluster.views.workloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from exporter.cluster.model import KINDS, ClusterModel
from exporter.cluster.parse.core import parse_time

# The order a re-list would deliver them in: what others refer to comes first.
_LOAD_ORDER = (
    "Topology",
    "ResourceFlavor",
    "WorkloadPriorityClass",
    "Cohort",
    "ClusterQueue",
    "LocalQueue",
    "Node",
    "HyperPodPyTorchJob",
    "Workload",
    "Pod",
    "Event",
)


class DumpError(Exception):
    """The dump file is not a Kubernetes List (or object) we can read."""


def load_dump_objects(text: str) -> list[Mapping[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise DumpError(f"not valid YAML: {exc}") from exc
    objects: list[Mapping[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, Mapping):
            raise DumpError("expected a Kubernetes List or objects at the top level")
        items = doc.get("items")
        if doc.get("kind", "").endswith("List") or isinstance(items, list):
            objects.extend(i for i in (items or []) if isinstance(i, Mapping))
        else:
            objects.append(doc)
    return objects


def model_from_objects(objects: Iterable[Mapping[str, Any]]) -> tuple[ClusterModel, float]:
    """Build a model as the service would; `now` is the newest timestamp in the dump."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {k: [] for k in KINDS}
    newest = 0.0
    for obj in objects:
        kind = obj.get("kind")
        if isinstance(kind, str) and kind in by_kind:
            by_kind[kind].append(obj)
            newest = max(newest, _newest_time(obj))
    model = ClusterModel(judge_preemptions=False)
    model.missing_kinds = frozenset(k for k in KINDS if not by_kind[k])
    model.elastic.dump_lacks(model.missing_kinds)  # "not in the dump", never "does not exist"
    for kind in _LOAD_ORDER:
        model.replace(kind, by_kind[kind], newest)
    return model, newest


# What an answer cannot know when a dump holds no object of a kind `kubectl get nodes,pods,
# workloads,clusterqueues,localqueues,events` would list (not asked for, or none existed).
_UNSEEN = {
    "Node": "nodes, so the topology, placement and free capacity are unknown",
    "Pod": "pods, so where workloads run and how many replicas run are unknown",
    "Workload": "Workloads, so no workload can be explained",
    "ClusterQueue": "ClusterQueues, so quota is unknown",
    "LocalQueue": "LocalQueues, so which ClusterQueue a pending workload waits in is unknown",
    "Event": "Events, so preemptors are known only from Workload conditions",
}


def dump_notes(missing: Iterable[str]) -> list[str]:
    """One note per listed kind the dump holds none of, in the order kubectl lists them."""
    lacking = set(missing)
    return [
        f"the dump holds no {what} (the kind was not dumped, or had no objects)"
        for kind, what in _UNSEEN.items()
        if kind in lacking
    ]


def _newest_time(obj: Mapping[str, Any]) -> float:
    times: list[float] = []
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        times.append(parse_time(meta.get("creationTimestamp")) or 0.0)
    for key in ("lastTimestamp", "firstTimestamp", "eventTime"):
        times.append(parse_time(obj.get(key)) or 0.0)
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    if isinstance(conds, list):
        for cond in conds:
            if isinstance(cond, Mapping):
                times.append(parse_time(cond.get("lastTransitionTime")) or 0.0)
    return max(times, default=0.0)


# --- text -----------------------------------------------------------------------------------


def explain_text(view: Mapping[str, Any]) -> str:
    lines = [_headline(view)]
    lines.extend(f"Note: {note}" for note in view.get("dump_notes") or [])  # what it cannot know
    ended = view.get("history")
    if isinstance(ended, Mapping):  # a stored view: the workload is no longer live
        gone = f"deleted at {ended['deleted_at']}" if ended.get("deleted_at") else "deleted"
        state = gone if ended.get("deleted") else "finished"
        lines.append(f"From history: {state}; as it was at {ended.get('ended_at')}.")
    pending = view.get("pending")
    if pending:
        label = pending.get("label") or pending["cause"]
        lines.append(f"Pending ({label}): {pending['summary']}")
        shown = pending["topology_message"] or pending.get("short")
        if shown and pending["quota_message"]:
            lines.append(f"  Kueue says: {pending['quota_reason']}: {pending['quota_message']}")
        for unknown in pending.get("quota_unknown") or []:
            lines.append(f"  Quota unknown for {unknown}")
        if pending.get("nodes"):
            lines.append(f"  Nodes: {pending['nodes']}")
        for problem in pending.get("node_problems") or []:
            lines.append(f"  Unreadable: {problem}")
        for resource in pending.get("undeclared_resources") or []:
            lines.append(
                f"  Its pods request {resource}, which no resource group of its queue covers:"
                " Kueue refuses that unless its configuration ignores or excludes the resource"
            )
    for fix in view.get("would_run_if", []):
        lines.append(f"  It would run if {fix}.")
    for us in view.get("ultraserver_waits") or []:  # its NVLink domain is not healthy
        lines.append(f"  Waits: {us['words']} ({us['reason']})")
    if view.get("admission_held"):  # the topowatch.io/node-health check holds it (issue 30)
        lines.append(str(view["admission_held"]))
    lines.extend(node_health_lines(view.get("node_health") or []))
    suffered = view.get("preemptions_suffered", [])
    if suffered:
        lines.append(f"Preempted {len(suffered)} time(s):")
        lines.extend(f"  {_preemption_line(r, victim_side=True)}" for r in suffered)
    caused = view.get("preemptions_caused", [])
    if caused:
        lines.append(f"Preempted {len(caused)} other workload(s):")
        lines.extend(f"  {_preemption_line(r, victim_side=False)}" for r in caused)
    elastic = view.get("elastic")
    if elastic:
        lines.append(f"Part of {elastic['kind']} {elastic['name']}: {elastic['summary']}")
        lines.extend(f"  {line}" for line in _elastic_lines(elastic, preemptions=False))
    goodput = view.get("goodput")
    if goodput:
        lines.extend(goodput_lines(goodput, job_named=True))
    lines.extend(_placement_lines(view))
    efa = view.get("efa_remote_errors")
    if efa:
        lines.append(f"EFA: {efa['summary']}")
    timeline = view.get("timeline", [])
    if timeline:
        lines.append("Timeline:")
        for entry in timeline:
            reason = f" ({entry['reason']})" if entry["reason"] else ""
            detail = f": {entry['detail']}" if entry["detail"] else ""
            folded = _folded_note(entry)
            lines.append(f"  {entry['time'] or '?':20} {entry['step']}{reason}{detail}{folded}")
    for problem in view.get("problems", []):
        lines.append(f"Note: {problem}")
    return "\n".join(lines) + "\n"


def node_health_lines(nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per node of the workload with findings or a remediation: "Its node X (pod P):
    the node agent reports gpu3 xid (reboot): XID 79 ...; remediation: reboot requested
    (HyperPod UnschedulablePendingReboot)"."""
    lines = []
    for node in nodes:
        said = []
        if node.get("reported"):
            said.append(f"the node agent reports {node['reported']}")
        elif node.get("condition"):
            said.append(str(node["condition"]))
        for f in node.get("efa_findings") or []:
            since = f" since {f['since']}" if f.get("since") else ""
            said.append(f"{f['component']} {f['check']} ({f['action']}): {f['evidence']}{since}")
        if node.get("remediation"):
            label = node.get("health_label") or ""
            shown = f" (HyperPod {label})" if label and label not in node["remediation"] else ""
            said.append(f"remediation: {node['remediation']}{shown}")
        if node.get("unavailable"):
            said.append(f"unavailable: {node['unavailable']}")
        pods = list(node.get("pods") or [])
        if not pods:
            held = " (its assignment; no pod of it runs there now)"
        elif len(pods) == 1:
            held = f" (pod {pods[0]})"
        else:
            held = f" ({len(pods)} of its pods)"
        lines.append(f"Its node {node['node']}{held}: {'; '.join(said)}")
    return lines


def _headline(view: Mapping[str, Any]) -> str:
    prio = view.get("priority_class") or "no priority class"
    return (
        f"{view['namespace']}/{view['name']}: {view['status']}, {view['gpus_requested']} GPUs, "
        f"queue {view['local_queue'] or '?'} -> {view['cluster_queue'] or '?'}, "
        f"{prio} ({view['priority']})"
    )


def _preemption_line(record: Mapping[str, Any], victim_side: bool) -> str:
    who = record["preemptor"] if victim_side else record["victim"]
    queue = (
        record["preemptor_cluster_queue"] if victim_side else record["victim_cluster_queue"]
    ) or "?"
    prios = f"priority {record['preemptor_priority']} over {record['victim_priority']}"
    verdict = record["verdict"]
    judged = (
        f"{verdict}-driven: {record['verdict_detail']}"
        if verdict != "unknown"
        else (f"cause unknown: {record['verdict_detail']}")
    )
    direction = "by" if victim_side else "victim"
    return (
        f"{record['time']} {direction} {who} ({queue}), {record['reason']}, {prios}, "
        f"{record['gpus_freed']} GPUs freed; {judged}"
    )


def _folded_note(entry: Mapping[str, Any]) -> str:
    """What a preemption step stands for: " [evicted, requeued at T, ...]"; times only where
    they differ from the step's own."""
    parts = []
    for part in entry.get("folded") or []:
        if part["step"] == entry["step"] and part["time"] == entry["time"]:
            continue
        at = f" at {part['time']}" if part["time"] != entry["time"] else ""
        parts.append(f"{part['step']}{at}")
    return f" [{', '.join(parts)}]" if parts else ""


_LEVEL_NAMES = {"ultraserver": "UltraServer"}


def _where_lines(loc: Mapping[str, Any]) -> list[str]:
    """One line per level: its domain ids, with pods per domain where the pods are spread."""
    lines = []
    for level in loc.get("where") or []:
        domains = level["domains"]
        if len(domains) == 1:
            named = domains[0]["domain"] or "no label"
        else:
            named = ", ".join(
                f"{d['domain'] or 'no label'} ({d['pods']} pod{'s' if d['pods'] != 1 else ''})"
                for d in domains
            )
        lines.append(f"  {_LEVEL_NAMES.get(level['level'], level['level'])}: {named}")
    return lines


def _placement_lines(view: Mapping[str, Any]) -> list[str]:
    loc = view.get("locality") or {}
    pods = view.get("pods", [])
    if not loc.get("nodes"):
        return ["Placement: no pods hold GPUs"] if view.get("status") != "pending" else []
    spread = ", ".join(
        f"{count} {level}" for level, count in loc["domains"].items() if level != "node"
    )
    topo = loc.get("topology") or {}
    asked = ""
    if topo.get("level"):
        met = {True: "met", False: "NOT met", None: "unknown"}[topo.get("met")]
        asked = f"; {topo['mode']} {topo['level']}: {met}"
    hops = loc.get("worst_pair_hops")
    pair = loc.get("worst_pair")
    between = f" ({pair[0]} <-> {pair[1]})" if pair else ""
    lines = [
        f"Placement: {loc['pods']} pods on {len(loc['nodes'])} nodes ({spread}); "
        f"worst pair {hops if hops is not None else '?'} hops{between}{asked}"
    ]
    lines.extend(_where_lines(loc))  # the UltraServer among them
    lines.extend(
        f"  {p['name']} on {p['node'] or '-'} ({p['gpus']} GPUs, {p['phase']})" for p in pods
    )
    return lines


def job_text(job: Mapping[str, Any]) -> str:
    """`topowatch explain NS/JOB` for an elastic job: size, Workloads, scale events, preemptions."""
    queue = job.get("cluster_queue") or "?"
    lines = [f"{job['namespace']}/{job['name']} ({job['kind']}, {queue}): {job['summary']}"]
    lines.extend(_elastic_lines(job, preemptions=True))
    goodput = job.get("goodput")
    if goodput:
        lines.extend(goodput_lines(goodput))
    lines.extend(f"Note: {note}" for note in job.get("notes") or [])
    return "\n".join(lines) + "\n"


# --- goodput (issue 29) -------------------------------------------------------------------


def goodput_text(job: Mapping[str, Any]) -> str:
    """`topowatch explain NS/JOB` for a job the goodput ledger knows (views.goodput.job_view)."""
    queue = job.get("cluster_queue") or "?"
    lines = [
        f"{job['namespace']}/{job['name']} ({job['kind']}, {queue}): {job['phase']}, "
        f"{job['gpus']} GPUs, team {job.get('team') or '?'}"
    ]
    lines.extend(goodput_lines(job))
    return "\n".join(lines) + "\n"


def goodput_lines(job: Mapping[str, Any], job_named: bool = False) -> list[str]:
    """The job's ETTR and its interruptions, each with cause, evidence and lost GPU-hours.
    `job_named`: say which job (a Workload's explanation, where the job is its owner)."""
    seconds = job.get("seconds") or {}
    ettr = job.get("ettr")
    whose = f" of {job['kind']} {job['name']}" if job_named else ""
    shown = ettr_words(ettr)
    spent = ", ".join(
        f"{phase} {duration_words(seconds[phase])}"
        for phase in ("restarting", "waiting", "preempted", "suspended", "unobserved")
        if seconds.get(phase)
    )
    lines = [
        f"Goodput{whose}: ETTR {shown} (running {duration_words(seconds.get('running', 0.0))} "
        f"of {duration_words(job.get('effective_wall_s') or 0.0)} counted"
        + (f"; {spent}" if spent else "")
        + f"), {_gpu_hours(job.get('lost_gpu_hours'))} GPU-hours lost"
    ]
    work = job.get("work_lost_gpu_hours")
    if work is not None:
        lines.append(f"  Work lost since checkpoints: {_gpu_hours(work)} GPU-hours")
    entries = [e for e in job.get("interruptions") or [] if e.get("cause") != "completed"]
    if not entries:
        lines.append("Not interrupted.")
        return lines
    causes: dict[str, int] = {}
    for entry in entries:
        causes[_cause_words(entry)] = causes.get(_cause_words(entry), 0) + 1
    summary = ", ".join(f"{n} {cause}" for cause, n in causes.items())
    times = "time" if len(entries) == 1 else "times"
    lines.append(f"Interrupted {len(entries)} {times}: {summary}")
    lines.extend(f"  {line}" for entry in entries for line in interruption_lines(entry))
    return lines


def interruption_lines(entry: Mapping[str, Any]) -> list[str]:
    """One entry: when, why (and the evidence), what it cost, and how the recovery went."""
    lost = _gpu_hours(entry.get("lost_gpu_hours"))
    state = "" if entry.get("settled") else " (not settled yet)"
    detail = entry.get("detail") or entry.get("missing") or "no evidence"
    head = (
        f"{entry.get('stopped_at') or '?'} {_cause_words(entry)}{state}: {detail}; "
        f"{entry.get('gpus', 0)} GPUs, {lost} GPU-hours lost"
        + (" so far" if entry.get("open") else "")
    )
    lines = [head]
    steps = [
        (label, entry.get(key))
        for label, key in (
            ("detected", "detected_at"),
            (f"action {entry.get('evidence', {}).get('action') or '?'}", "action_at"),
            ("node back", "node_back_at"),
            ("running again", "resumed_at"),
        )
        if entry.get(key)
    ]
    if steps:
        lines.append("  " + " -> ".join(f"{label} {at}" for label, at in steps))
    if entry.get("uncertain"):
        lines.append(f"  Uncertain: {entry['uncertain']}")
    if entry.get("missing") and entry.get("cause") == "unknown":
        lines.append(f"  Missing: {entry['missing']}")
    if entry.get("work_lost_gpu_hours") is not None:
        lines.append(
            f"  Work lost since its checkpoint at {entry.get('checkpoint_at')}: "
            f"{_gpu_hours(entry['work_lost_gpu_hours'])} GPU-hours"
        )
    elif entry.get("checkpoint_note"):
        lines.append(f"  Checkpoint: {entry['checkpoint_note']}")
    return lines


def _cause_words(entry: Mapping[str, Any]) -> str:
    cause = str(entry.get("cause") or "unknown").replace("_", " ")
    component = entry.get("component")
    return f"{cause} ({component})" if component else cause


def ettr_words(ettr: float | None) -> str:
    return "unknown yet" if ettr is None else f"{ettr:.1%}"


def duration_words(seconds: float) -> str:
    """2d03h, 5h07m, 12m05s, 40s."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86_400)
    hrs, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hrs:02d}h"
    if hrs:
        return f"{hrs}h{mins:02d}m"
    if mins:
        return f"{mins}m{secs:02d}s"
    return f"{secs}s"


def _gpu_hours(value: Any) -> str:
    return f"{float(value or 0.0):.2f}"


def _elastic_lines(job: Mapping[str, Any], preemptions: bool) -> list[str]:
    lines = []
    policy = job.get("policy") or {}
    if policy.get("consecutive_scaling_failures"):
        lines.append(f"Consecutive scaling failures: {policy['consecutive_scaling_failures']}")
    workloads = job.get("workloads") or []
    if workloads:
        lines.append(f"Workloads ({len(workloads)}):")
        for w in workloads:
            notes = [f"{w['replicas']} replicas", w["status"]]
            if w.get("replaces"):
                notes.append(f"replaces {w['replaces']}")
            if w.get("preempted"):
                notes.append("preempted")
            lines.append(f"  {w['name']}: {', '.join(notes)}")
    events = job.get("scale_events") or []
    if events:
        lines.append(f"Scale events ({len(events)}):")
        lines.extend(f"  {_scale_line(e)}" for e in events)
    sizes = job.get("sizes") or []
    if sizes:
        shown = sizes[-12:]
        more = f"... {len(sizes) - len(shown)} earlier, " if len(sizes) > len(shown) else ""
        lines.append(
            "Size history (running replicas): "
            + more
            + ", ".join(f"{s['running']} at {s['time']}" for s in shown)
        )
    records = job.get("preemptions") or []
    if preemptions and records:
        lines.append(f"Preempted {len(records)} time(s):")
        lines.extend(f"  {_preemption_line(r, victim_side=True)}" for r in records)
    return lines


def _scale_line(event: Mapping[str, Any]) -> str:
    start = "?" if event["from_replicas"] is None else event["from_replicas"]
    end = "?" if event["to_replicas"] is None else event["to_replicas"]
    head = f"{event['time']} {event['direction']} {start} -> {end} ({event['cause']})"
    seconds = event.get("seconds_to") or {}
    took = ", ".join(  # a phase reached at a time no object records reads "?"
        f"{p} +{seconds[p]:.0f}s" if p in seconds else f"{p} ?"
        for p in (event.get("phases") or {})
        if p != "requested"
    )
    if took:
        head += f": {took}"
    if event.get("failed"):
        head += f"; FAILED before {event['failed_phase']}: {event['failed']}"
    elif event.get("ended"):
        head += f"; {event['ended']}"
    elif not event.get("done"):
        head += "; in progress"
    return f"{head} [{event['workload']}]"


def preemptions_text(records: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for r in records:
        judged = r["verdict"] if r["verdict"] != "unknown" else "cause unknown"
        lines.append(
            f"{r['time']} {r['victim']} ({r['victim_cluster_queue'] or '?'}) preempted by "
            f"{r['preemptor']} ({r['preemptor_cluster_queue'] or '?'}): {r['reason']}, "
            f"{r['gpus_freed']} GPUs, {judged}"
        )
    return "\n".join(lines) + ("\n" if lines else "no preemptions recorded\n")
