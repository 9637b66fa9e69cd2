"""Server-rendered pages for people: topology, one workload, the preemption ledger.

No build step and no script: the model's views become HTML strings here, with every value from
the cluster passed through html.escape. Reading the model (`topology_picture`) is separate from
rendering, so the service can copy what it needs under its lock and render outside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from exporter.cluster.capacity.levels import flavor_levels
from exporter.cluster.explain import (
    duration_words,
    ettr_words,
    explain_text,
    goodput_text,
    interruption_lines,
    job_text,
)
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import Node, Pod
from exporter.cluster.ui.svg import (
    GpuSlot,
    NodeTile,
    TopologyPicture,
    legend_rows,
    slot_colour,
    team_of,
    timeline_svg,
    topology_svg,
    workload_href,
)
from exporter.cluster.views import workloads as views
from exporter.cluster.views.ultraservers import ultraservers_view
from exporter.topology.tree import render_tree

__all__ = [
    "GpuSlot",
    "NodeTile",
    "TopologyPicture",
    "goodput_href",
    "goodput_job_page",
    "goodput_page",
    "gpu_slots",
    "not_found_page",
    "preemptions_page",
    "topology_page",
    "topology_picture",
    "unhealthy_reason",
    "workload_page",
]


_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#0f172a}
nav a{margin-right:1em} table{border-collapse:collapse;margin:.6em 0}
td,th{border:1px solid #cbd5e1;padding:2px 8px;text-align:left}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px}
pre{background:#f1f5f9;padding:.6em;white-space:pre-wrap}
svg text{font:12px system-ui,sans-serif} .domain-title{font-weight:600}
.bar{display:inline-block;height:10px;background:#16a34a;vertical-align:middle}
.bar.lost{background:#b91c1c} td.num{text-align:right}
"""


# --- reading the model ------------------------------------------------------------------------


def unhealthy_reason(node: Node) -> str:
    """HyperPod's Unschedulable* health label, our TopowatchHealthy=False and why the node is
    unavailable (deep health check, EC2 scheduled event), joined."""
    reasons = []
    if node.health.startswith("Unschedulable"):
        reasons.append(f"HyperPod {node.health}")
    if node.condition_note:
        reasons.append(node.condition_note)
    if node.unavailable:
        reasons.append(f"unavailable: {node.unavailable_detail}")
    return "; ".join(reasons)


def gpu_slots(
    pods: Iterable[Pod], owners: Mapping[tuple[str, str], str] | None = None
) -> dict[str, list[GpuSlot]]:
    """Per node, one slot per GPU held, pods in name order (Kubernetes exposes no GPU index).

    `owners` maps (namespace, pod) to the workload the model matched it to (by job UID or
    owner); a pod it does not name falls back to its kueue.x-k8s.io/workload annotation.
    """
    holding = sorted((p for p in pods if p.holds_gpus), key=lambda p: (p.name, p.namespace))
    known = owners or {}
    slots: dict[str, list[GpuSlot]] = {}
    for pod in holding:
        workload = known.get(pod.key, pod.workload)
        slots.setdefault(pod.node, []).extend(
            [GpuSlot(pod.namespace, pod.name, workload)] * pod.gpus
        )
    return slots


def topology_picture(model: ClusterModel) -> TopologyPicture:
    """Copy what the topology page needs out of the model (call under the service's lock)."""
    owners = {
        pod.key: name
        for (_, name), state in model.workloads.items()
        for pod in model.pods_of(state.workload)
    }
    held = gpu_slots(model.pods.values(), owners)
    tiles: dict[str, NodeTile] = {}
    for name, node in model.nodes.items():
        slots = held.get(name, [])
        tiles[name] = NodeTile(
            name=name,
            allocatable=node.allocatable_gpus,
            free=model.tree.node_free(name),
            schedulable=node.schedulable,
            unhealthy=unhealthy_reason(node),
            slots=tuple(slots) + (None,) * max(0, node.allocatable_gpus - len(slots)),
        )
    levels = list(model.tree.levels_present())
    split: dict[tuple[str, str], dict[str, int]] = {}
    for flavor in sorted(model.flavors):
        eligibility = model.eligibility(flavor)
        for capacity in flavor_levels(eligibility, model.tree, model.nodes, levels):
            for domain, values in capacity.domains.items():
                split.setdefault((capacity.level, domain), {})[flavor] = values[3]
    return TopologyPicture(
        tree=render_tree(model.tree),
        fragmentation=views.topology_view(model)["fragmentation"],
        nodes=tiles,
        flavor_free={key: flavors for key, flavors in split.items() if len(flavors) > 1},
        ultraservers=tuple(ultraservers_view(model)),
    )


# --- pages ------------------------------------------------------------------------------------


def topology_page(picture: TopologyPicture, highlight: str = "") -> str:
    """Layers, nodes and GPUs; `highlight` (namespace/name) outlines one workload's GPUs."""
    unhealthy = sorted(t.name for t in picture.nodes.values() if t.unhealthy)
    body = [f"<h1>GPU topology</h1><p>{len(picture.nodes)} nodes, {len(unhealthy)} unhealthy"]
    if unhealthy:
        body.append(
            ": " + ", ".join(f'<a href="#node-{escape(n)}">{escape(n)}</a>' for n in unhealthy)
        )
    body.append("</p>")
    if highlight:
        hosts = sorted(
            t.name
            for t in picture.nodes.values()
            if any(s and s.workload_key == highlight for s in t.slots)
        )
        namespace, _, name = highlight.partition("/")
        body.append(
            f'<p class="highlight-note">Highlighting '
            f"{_link(workload_href(namespace, name), highlight)} on {len(hosts)} node(s): "
            f"{escape(', '.join(hosts) or 'none')}</p>"
        )
    body.append(_fragmentation_table(picture.fragmentation))
    body.append(_ultraserver_badges(picture.ultraservers))
    body.append(_legend(picture))
    body.append(topology_svg(picture, highlight))
    return _page("Topology", "".join(body))


def _fragmentation_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One table per ResourceFlavor: a job runs on one flavor's nodes, so free GPUs of
    different instance types are never added together (views.fragmentation_rows)."""
    by_flavor: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_flavor.setdefault(str(row.get("flavor") or ""), []).append(row)
    if not by_flavor:
        by_flavor[""] = []
    out: list[str] = []
    for flavor, flavor_rows in by_flavor.items():
        title = f" — flavor {escape(flavor)}" if flavor else ""
        out.append(
            f'<h2>Free GPUs by level{title}</h2><table class="fragmentation"'
            f' data-flavor="{escape(flavor)}"><tr><th>level</th>'
            "<th>domains</th><th>free GPUs</th><th>largest free block</th><th>in domain</th>"
            "<th>fragmentation</th></tr>"
        )
        for row in flavor_rows:
            out.append(
                f'<tr data-level="{escape(str(row["level"]))}">'
                f"<td>{escape(str(row['level']))}</td>"
                f"<td>{int(row['domains'])}</td><td>{int(row['free'])}</td>"
                f'<td class="largest-free">{int(row["largest_free"])}</td>'
                f"<td>{escape(str(row['largest_domain']) or '-')}</td>"
                f"<td>{float(row['fragmentation_ratio']):.0%}</td></tr>"
            )
        out.append("</table>")
    return "".join(out)


_VERDICT_COLOURS = {"healthy": "#16a34a", "degraded": "#d97706", "failed": "#b91c1c"}


def _ultraserver_badges(rows: Sequence[Mapping[str, Any]]) -> str:
    """One badge per UltraServer (NVLink domain): its verdict, nodes healthy of total, usable
    GPUs; the reason as the badge's title and beside it when not healthy."""
    if not rows:
        return ""
    out = ['<h2>UltraServers</h2><ul class="ultraservers">']
    for row in rows:
        verdict = str(row["verdict"])
        colour = _VERDICT_COLOURS.get(verdict, "#64748b")
        us = escape(str(row["ultraserver"]))
        badge = (
            f'<span class="badge verdict-{escape(verdict)}" title="{escape(str(row["reason"]))}"'
            f' style="background:{colour};color:#fff;padding:0 6px;border-radius:8px">'
            f"{escape(verdict)}</span>"
        )
        nodes, gpus = row["nodes"], row["gpus"]
        why = f" — {escape(str(row['reason']))}" if verdict != "healthy" else ""
        out.append(
            f'<li id="ultraserver-{us}">{badge} {us}: {nodes["healthy"]} of {nodes["total"]}'
            f" nodes healthy, {gpus['usable']} of {gpus['total']} GPUs usable{why}</li>"
        )
    out.append("</ul>")
    return "".join(out)


def _legend(picture: TopologyPicture) -> str:
    slots = [s for t in picture.nodes.values() for s in t.slots if s is not None]
    if not slots:
        return "<p>No pod holds a GPU.</p>"
    out = [
        '<h2>Workloads on GPUs</h2><table class="legend">'
        "<tr><th>workload</th><th>team</th><th>GPUs</th></tr>"
    ]
    for slot, count in legend_rows(slots):
        swatch = f'<span class="swatch" style="background:{slot_colour(slot)}"></span>'
        if slot.workload:
            label = _link(workload_href(slot.namespace, slot.workload), slot.workload_key)
        else:
            label = f"{escape(slot.namespace)}/{escape(slot.pod)} (no workload)"
        out.append(
            f'<tr class="workload"><td>{swatch}{label}</td>'
            f"<td>{escape(team_of(slot.namespace))}</td><td>{count}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def workload_page(view: Mapping[str, Any]) -> str:
    """The explain answer, its timeline, and where its pods run (views.workload_view)."""
    key = f"{view['namespace']}/{view['name']}"
    topo = f"/ui/topology?workload={quote(key, safe='')}"
    body = [
        f'<h1>{escape(key)}</h1><p class="status">Status: <b>{escape(str(view["status"]))}</b>'
        f' · <a href="{escape(topo)}">its nodes on the topology</a>'
        ' · <a href="/ui/preemptions">all preemptions</a></p>',
        f'<h2>Explanation</h2><pre class="explain">{escape(explain_text(view))}</pre>',
        '<h2>Timeline</h2><table class="timeline"><tr><th>time</th><th>step</th>'
        "<th>reason</th><th>detail</th></tr>",
    ]
    for entry in view.get("timeline", []):
        body.append(
            f"<tr><td>{escape(str(entry['time'] or '?'))}</td><td>{escape(str(entry['step']))}</td>"
            f"<td>{escape(str(entry['reason']))}</td><td>{escape(str(entry['detail']))}</td></tr>"
        )
    body.append("</table>")
    pods = view.get("pods", [])
    if pods:
        body.append(
            '<h2>Pods</h2><table class="pods">'
            "<tr><th>pod</th><th>node</th><th>GPUs</th><th>phase</th></tr>"
        )
        for pod in pods:
            node = str(pod["node"] or "")
            where = (
                f'<a href="{escape(topo)}#node-{escape(quote(node, safe=""))}">{escape(node)}</a>'
                if node
                else "-"
            )
            body.append(
                f"<tr><td>{escape(str(pod['name']))}</td><td>{where}</td>"
                f"<td>{int(pod['gpus'])}</td><td>{escape(str(pod['phase']))}</td></tr>"
            )
        body.append("</table>")
    elastic = view.get("elastic")
    if elastic:
        job_link = (
            f"/ui/jobs/{quote(elastic['namespace'], safe='')}/{quote(elastic['name'], safe='')}"
        )
        heading = "Elastic job" if elastic.get("elastic") else "Job"  # elastic or not: its spec
        body.append(
            f'<h2>{heading} <a href="{escape(job_link)}">{escape(str(elastic["name"]))}</a></h2>'
            f"<p>{escape(str(elastic['summary']))}</p>" + _scale_table(elastic["scale_events"])
        )
    goodput = view.get("goodput")
    if goodput:
        body.append(
            f"<h2>Goodput of {escape(str(goodput['kind']))} "
            f"{_link(goodput_href(goodput['namespace'], goodput['name']), goodput['name'])}</h2>"
            f"<p>ETTR {escape(ettr_words(goodput.get('ettr')))}, interrupted "
            f"{int(goodput.get('interruption_count') or 0)} time(s), "
            f"{float(goodput.get('lost_gpu_hours') or 0.0):.2f} GPU-hours lost.</p>"
        )
    suffered = view.get("preemptions_suffered", [])
    caused = view.get("preemptions_caused", [])
    if suffered:
        body.append("<h2>Preempted by</h2>" + _preemption_table(suffered))
    if caused:
        body.append("<h2>Preempted others</h2>" + _preemption_table(caused))
    return _page(key, "".join(body))


def job_page(job: Mapping[str, Any]) -> str:
    """An elastic job: size against its bounds, scale events, size history, preemptions."""
    key = f"{job['namespace']}/{job['name']}"
    body = [
        f'<h1>{escape(key)}</h1><p class="status">{escape(str(job["kind"]))}:'
        f" <b>{escape(str(job['summary']))}</b></p>",
        f'<h2>Explanation</h2><pre class="explain">{escape(job_text(job))}</pre>',
        "<h2>Scale events</h2>" + _scale_table(job["scale_events"]),
    ]
    if job.get("preemptions"):
        body.append("<h2>Preempted by</h2>" + _preemption_table(job["preemptions"]))
    return _page(key, "".join(body))


def _scale_table(events: Sequence[Mapping[str, Any]]) -> str:
    if not events:
        return "<p>No scale events recorded.</p>"
    out = [
        '<table class="scale-events"><tr><th>time</th><th>direction</th><th>replicas</th>'
        "<th>cause</th><th>seconds to admitted / scheduled / ready / restarted</th>"
        "<th>outcome</th></tr>"
    ]
    for e in events:
        took = e.get("seconds_to") or {}
        reached = e.get("phases") or {}
        phases = " / ".join(  # "?": reached at a time no object records
            f"{took[p]:.0f}" if p in took else ("?" if p in reached else "-")
            for p in ("admitted", "scheduled", "ready", "restarted")
        )
        outcome = (
            f"failed before {e['failed_phase']}: {e['failed']}"
            if e.get("failed")
            else e.get("ended") or ("done" if e.get("done") else "in progress")
        )
        replicas = f"{e['from_replicas'] if e['from_replicas'] is not None else '?'} → " + (
            f"{e['to_replicas'] if e['to_replicas'] is not None else '?'}"
        )
        out.append(
            f"<tr><td>{escape(str(e['time']))}</td><td>{escape(str(e['direction']))}</td>"
            f"<td>{escape(replicas)}</td><td>{escape(str(e['cause']))}</td>"
            f"<td>{escape(phases)}</td><td>{escape(outcome)}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def preemptions_page(records: Sequence[Mapping[str, Any]]) -> str:
    """The ledger, newest first: who preempted whom, why, and whether topology drove it."""
    newest = sorted(records, key=lambda r: str(r.get("time") or ""), reverse=True)
    if not newest:
        return _page("Preemptions", "<h1>Preemptions</h1><p>No preemptions recorded.</p>")
    return _page("Preemptions", f"<h1>Preemptions</h1>{_preemption_table(newest)}")


def _preemption_table(records: Iterable[Mapping[str, Any]]) -> str:
    out = [
        '<table class="preemptions"><tr><th>time</th><th>victim</th><th>victim queue</th>'
        "<th>preemptor</th><th>preemptor queue</th><th>reason</th><th>cause</th>"
        "<th>GPUs freed</th></tr>"
    ]
    for r in records:
        verdict = str(r.get("verdict", "unknown"))
        detail = str(r.get("verdict_detail", ""))
        out.append(
            f"<tr><td>{escape(str(r.get('time') or '?'))}</td>"
            f"<td>{_workload_link(str(r.get('victim', '')))}</td>"
            f"<td>{escape(str(r.get('victim_cluster_queue') or '?'))}</td>"
            f"<td>{_workload_link(str(r.get('preemptor', '')))}</td>"
            f"<td>{escape(str(r.get('preemptor_cluster_queue') or '?'))}</td>"
            f"<td>{escape(str(r.get('reason', '')))}</td>"
            f'<td class="cause">{escape(f"{verdict}: {detail}" if detail else verdict)}</td>'
            f"<td>{escape(str(r.get('gpus_freed', '')))}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _workload_link(key: str) -> str:
    """A link for "namespace/name"; the ledger's "uid:..." and "unknown" stay plain text."""
    namespace, slash, name = key.partition("/")
    if not slash or not namespace or not name or key.startswith("uid:"):
        return escape(key)
    return _link(workload_href(namespace, name), key)


def _link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


# --- goodput (issue 29) -------------------------------------------------------------------------


def goodput_href(namespace: str, job: str) -> str:
    return f"/ui/goodput/{quote(namespace, safe='')}/{quote(job, safe='')}"


def goodput_job_page(job: Mapping[str, Any]) -> str:
    """One job's goodput (views.goodput.job_view): its timeline drawn, each interruption with
    its cause, evidence and cost, the time in each phase."""
    key = f"{job['namespace']}/{job['name']}"
    seconds = job.get("seconds") or {}
    bands = job.get("timeline") or []
    entries = job.get("interruptions") or []
    body = [
        f"<h1>{escape(key)}</h1>"
        f'<p class="status">{escape(str(job["kind"]))} · team '
        f"{escape(str(job.get('team') or '?'))} · queue "
        f"{escape(str(job.get('cluster_queue') or '?'))} · {int(job.get('gpus') or 0)} GPUs · "
        f"<b>{escape(str(job['phase']))}</b> · ETTR "
        f'<b class="ettr">{escape(ettr_words(job.get("ettr")))}</b> · '
        f"{float(job.get('lost_gpu_hours') or 0.0):.2f} GPU-hours lost"
        ' · <a href="/ui/goodput">fleet goodput</a></p>',
        "<h2>Timeline</h2>",
    ]
    if bands:
        start = min(float(b["start"]) for b in bands)
        end = max(float(b["end"]) for b in bands)
        body.append(timeline_svg(bands, entries, start, end))
    else:
        body.append("<p>Not admitted yet: no timeline.</p>")
    body.append(
        '<h2>Time by phase</h2><table class="phases"><tr><th>phase</th><th>time</th>'
        "<th>share of wall time</th></tr>"
    )
    wall = float(job.get("wall_s") or 0.0)
    for phase, value in seconds.items():
        share = f"{float(value) / wall:.1%}" if wall > 0 else "-"
        body.append(
            f'<tr data-phase="{escape(str(phase))}"><td>{escape(str(phase))}</td>'
            f'<td class="num">{escape(duration_words(float(value)))}</td>'
            f'<td class="num">{share}</td></tr>'
        )
    body.append("</table>")
    body.append(f"<h2>Interruptions ({len(entries)})</h2>")
    body.append(_interruption_table(entries) if entries else "<p>Not interrupted.</p>")
    body.append(f'<h2>Explanation</h2><pre class="explain">{escape(goodput_text(job))}</pre>')
    return _page(f"{key} goodput", "".join(body))


def _interruption_table(entries: Sequence[Mapping[str, Any]]) -> str:
    out = [
        '<table class="interruptions"><tr><th>#</th><th>stopped</th><th>cause</th>'
        "<th>evidence</th><th>GPUs</th><th>GPU-hours lost</th><th>recovery</th></tr>"
    ]
    for number, e in enumerate(entries, start=1):
        cause = str(e.get("cause", "unknown"))
        component = str(e.get("component") or "")
        evidence = str(e.get("detail") or e.get("missing") or "")
        if e.get("uncertain"):
            evidence += f" (uncertain: {e['uncertain']})"
        recovery = interruption_lines(e)[1:2]
        out.append(
            f'<tr id="interruption-{number}" class="interruption" data-cause="{escape(cause)}">'
            f"<td>{number}</td><td>{escape(str(e.get('stopped_at') or '?'))}</td>"
            f"<td>{escape(cause)}{escape(f' ({component})' if component else '')}</td>"
            f'<td>{escape(evidence)}</td><td class="num">{int(e.get("gpus") or 0)}</td>'
            f'<td class="num">{float(e.get("lost_gpu_hours") or 0.0):.2f}'
            f"{' so far' if e.get('open') else ''}</td>"
            f"<td>{escape(recovery[0].strip() if recovery else '')}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def goodput_page(fleet: Mapping[str, Any]) -> str:
    """The fleet (views.goodput.fleet_view): ETTR by team, GPU-hours lost by cause, where the
    GPU-seconds went, interruptions per 1,000 node-days and MTBF, repeat offenders, and the
    jobs that lost the most."""
    whole = fleet.get("cluster") or {}
    body = [
        "<h1>Goodput and reliability</h1>"
        f'<p class="status">Cluster ETTR <b class="ettr">'
        f"{escape(ettr_words(whole.get('ettr')))}</b> over {int(whole.get('jobs') or 0)} "
        f"live and recent jobs · {int(whole.get('interruptions') or 0)} interruptions · "
        f"{float(whole.get('lost_gpu_hours') or 0.0):.2f} GPU-hours lost · as of "
        f"{escape(str(fleet.get('as_of')))}</p>",
        '<h2>ETTR by team</h2><table class="teams"><tr><th>team</th><th>jobs</th>'
        "<th>ETTR</th><th>running</th><th>counted wall time</th><th>interruptions</th>"
        "<th>GPU-hours lost</th></tr>",
    ]
    for team in fleet.get("teams") or []:
        ettr = team.get("ettr")
        bar = (
            f'<span class="bar" style="width:{max(0.0, min(1.0, float(ettr))) * 120:.0f}px">'
            "</span> "
            if ettr is not None
            else ""
        )
        body.append(
            f'<tr data-team="{escape(str(team["name"]))}"><td>{escape(str(team["name"]) or "-")}'
            f'</td><td class="num">{int(team["jobs"])}</td><td>{bar}'
            f"{escape(ettr_words(ettr))}</td>"
            f'<td class="num">{escape(duration_words(float(team["running_s"])))}</td>'
            f'<td class="num">{escape(duration_words(float(team["effective_wall_s"])))}</td>'
            f'<td class="num">{int(team["interruptions"])}</td>'
            f'<td class="num">{float(team.get("lost_gpu_hours") or 0.0):.2f}</td></tr>'
        )
    body.append("</table>")
    body.append(_lost_by_cause(whole.get("lost_gpu_hours_by_cause") or {}))
    body.append(_ledger_table(fleet.get("gpu_seconds") or {}))
    body.append(_reliability(fleet.get("reliability") or {}))
    body.append(_jobs_table(fleet.get("jobs") or [], int(fleet.get("jobs_total") or 0)))
    return _page("Goodput", "".join(body))


def _lost_by_cause(lost: Mapping[str, Any]) -> str:
    rows = sorted(((str(c), float(v or 0.0)) for c, v in lost.items()), key=lambda r: -r[1])
    if not rows:
        return "<h2>GPU-hours lost by cause</h2><p>No GPU-hours lost.</p>"
    most = max(v for _, v in rows) or 1.0
    out = [
        '<h2>GPU-hours lost by cause</h2><table class="lost-by-cause">'
        "<tr><th>cause</th><th>GPU-hours</th></tr>"
    ]
    for cause, value in rows:
        out.append(
            f'<tr data-cause="{escape(cause)}"><td>{escape(cause)}</td><td>'
            f'<span class="bar lost" style="width:{value / most * 160:.0f}px"></span> '
            f"{value:.2f}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _ledger_table(ledger: Mapping[str, Any]) -> str:
    by_flavor: Mapping[str, Mapping[str, Any]] = ledger.get("by_flavor") or {}
    if not by_flavor:
        return ""
    categories = list(dict.fromkeys(c for per in by_flavor.values() for c in per))
    out = [
        "<h2>Where the GPU-hours went</h2>"
        '<table class="gpu-ledger"><tr><th>flavor</th>'
        + "".join(f"<th>{escape(c)}</th>" for c in categories)
        + "</tr>"
    ]
    for flavor, per in by_flavor.items():
        out.append(
            f"<tr><td>{escape(flavor or '-')}</td>"
            + "".join(f'<td class="num">{float(per.get(c) or 0.0):.1f}</td>' for c in categories)
            + "</tr>"
        )
    out.append("</table>")
    return "".join(out)


_SCOPE_NAMES = {
    "instance_type": "instance type",
    "domain": "layer-3 network domain",
    "ultraserver": "UltraServer",
    "node": "node",
}


def _reliability(summary: Mapping[str, Any]) -> str:
    out = [
        f"<h2>Fleet reliability</h2><p>{float(summary.get('node_days') or 0.0):.1f} node-days "
        "observed.</p>"
        '<table class="by-component"><tr><th>component</th><th>interruptions</th>'
        "<th>per 1,000 node-days</th><th>hardware incidents</th></tr>"
    ]
    for component, row in (summary.get("interruptions_by_component") or {}).items():
        out.append(
            f'<tr data-component="{escape(str(component))}"><td>{escape(str(row["name"]))}</td>'
            f'<td class="num">{int(row["interruptions"])}</td>'
            f'<td class="num">{float(row["per_1000_node_days"]):.2f}</td>'
            f'<td class="num">{int(row["hardware_incidents"])}</td></tr>'
        )
    out.append("</table>")
    for scope, rows in (summary.get("mtbf") or {}).items():
        if scope == "node" or not rows:
            continue
        out.append(
            f"<h3>Mean time between hardware incidents by {escape(_SCOPE_NAMES.get(scope, scope))}"
            f'</h3><table class="mtbf" data-scope="{escape(scope)}"><tr><th>name</th>'
            "<th>node-days</th><th>incidents</th><th>MTBF (hours)</th></tr>"
        )
        for row in rows:
            mtbf = row.get("mtbf_hours")
            out.append(
                f"<tr><td>{escape(str(row['name']) or '(none)')}</td>"
                f'<td class="num">{float(row["node_days"]):.1f}</td>'
                f'<td class="num">{int(row["incidents"])}</td>'
                f'<td class="num">{f"{float(mtbf):.1f}" if mtbf is not None else "-"}</td></tr>'
            )
        out.append("</table>")
    rule = summary.get("repeat_offender_rule") or {}
    days = float(rule.get("window_s") or 0.0) / 86_400
    offenders = summary.get("repeat_offenders") or []
    out.append(
        f"<h2>Repeat offenders</h2><p>{int(rule.get('incidents') or 0)} or more hardware "
        f"incidents within {days:g} days: replace, do not reboot.</p>"
    )
    if not offenders:
        out.append('<p class="no-offenders">No repeat offenders.</p>')
        return "".join(out)
    out.append(
        '<table class="repeat-offenders"><tr><th>node</th><th>incidents</th><th>first</th>'
        "<th>last</th><th>components</th></tr>"
    )
    for o in offenders:
        node = str(o["node"])
        href = f"/ui/topology#node-{quote(node, safe='')}"
        out.append(
            f'<tr data-node="{escape(node)}"><td>{_link(href, node)}</td>'
            f'<td class="num">{int(o["incidents"])}</td><td>{escape(str(o["first"]))}</td>'
            f"<td>{escape(str(o['last']))}</td>"
            f"<td>{escape(', '.join(str(c) for c in o.get('components') or []))}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _jobs_table(jobs: Sequence[Mapping[str, Any]], total: int) -> str:
    if not jobs:
        return "<h2>Jobs</h2><p>No job admitted yet.</p>"
    out = [
        f"<h2>Jobs that lost the most ({len(jobs)} of {total})</h2>"
        '<table class="jobs"><tr><th>job</th><th>team</th><th>phase</th><th>GPUs</th>'
        "<th>ETTR</th><th>interruptions</th><th>GPU-hours lost</th></tr>"
    ]
    for job in jobs:
        key = f"{job['namespace']}/{job['name']}"
        out.append(
            f"<tr><td>{_link(goodput_href(job['namespace'], job['name']), key)}</td>"
            f"<td>{escape(str(job.get('team') or '-'))}</td><td>{escape(str(job['phase']))}</td>"
            f'<td class="num">{int(job.get("gpus") or 0)}</td>'
            f"<td>{escape(ettr_words(job.get('ettr')))}</td>"
            f'<td class="num">{int(job.get("interruption_count") or 0)}</td>'
            f'<td class="num">{float(job.get("lost_gpu_hours") or 0.0):.2f}</td></tr>'
        )
    out.append("</table>")
    return "".join(out)


def not_found_page(what: str) -> str:
    return _page(
        "Not found",
        f'<h1>Not found</h1><p class="not-found">{escape(what)} is not known to this service.</p>',
    )


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · topowatch</title><style>{_STYLE}</style></head><body>"
        '<nav><a href="/ui/topology">Topology</a><a href="/ui/preemptions">Preemptions</a>'
        '<a href="/ui/goodput">Goodput</a><a href="/api/v1/workloads">Workloads (JSON)</a></nav>'
        f"{body}</body></html>\n"
    )
