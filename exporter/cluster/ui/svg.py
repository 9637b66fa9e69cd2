"""The topology picture as one SVG: domains as nested boxes, nodes as rows, GPUs as squares.

Pure: a TopologyPicture in, markup out. Every text and attribute value goes through
html.escape, because node names, namespaces and workload names come from the API server.
"""

from __future__ import annotations

import textwrap
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

HEADER_H = 22  # a domain's title row
NODE_H = 24  # one node row
PAD = 6  # space below a domain's last child
INDENT = 14  # per tree depth
GPU = 14  # a GPU square
GPU_GAP = 3
NAME_W = 210  # node name column, before the GPU squares
WIDTH = 1100
CHAR_W = 7  # a character of 12px system-ui text, rounded up: a wrapped line never overruns
LINE_H = 14  # one more line of a node's note
MARKER_OFFSET = 60  # the marker's start, right of the "N free" note
FREE_FILL = "#e5e7eb"  # a GPU a new pod could get
UNAVAILABLE_FILL = "#9ca3af"  # idle, but on a node that takes no new pods


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU held by a pod; `workload` is the pod's Kueue workload name, "" when it has none."""

    namespace: str
    pod: str
    workload: str

    @property
    def workload_key(self) -> str:
        return f"{self.namespace}/{self.workload}" if self.workload else ""


@dataclass(frozen=True, slots=True)
class NodeTile:
    name: str
    allocatable: int
    free: int
    schedulable: bool
    unhealthy: str  # why the node is unhealthy, "" when it is not
    slots: tuple[GpuSlot | None, ...]


@dataclass(frozen=True, slots=True)
class TopologyPicture:
    """What the topology page shows, copied out of the model under the service's lock."""

    tree: list[dict[str, Any]]  # exporter.topology.tree.render_tree
    fragmentation: list[dict[str, Any]]  # views.topology_view()["fragmentation"]
    nodes: Mapping[str, NodeTile]
    # (level, domain) -> ResourceFlavor -> free GPUs, for domains holding nodes of several
    # flavors: their free GPUs are shown per flavor, never as one sum no job could use.
    flavor_free: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    # Each UltraServer's verdict (views.ultraservers.ultraservers_view), shown as a badge.
    ultraservers: Sequence[Mapping[str, Any]] = ()


def team_of(namespace: str) -> str:
    """HyperPod task governance puts team T in namespace hyperpod-ns-T; others are their own."""
    prefix = "hyperpod-ns-"
    return namespace[len(prefix) :] if namespace.startswith(prefix) else namespace


def team_hue(team: str) -> int:
    """A hue from a checksum, not hash(): the same team keeps its colour across restarts."""
    return zlib.crc32(team.encode()) % 360


def slot_colour(slot: GpuSlot) -> str:
    """The team sets the hue; the workload only the lightness, so teams stay recognisable."""
    lightness = 34 + (zlib.crc32(slot.workload_key.encode() or slot.pod.encode()) % 6) * 6
    return f"hsl({team_hue(team_of(slot.namespace))},70%,{lightness}%)"


def workload_href(namespace: str, name: str) -> str:
    return f"/ui/workloads/{quote(namespace, safe='')}/{quote(name, safe='')}"


def topology_svg(picture: TopologyPicture, highlight: str = "") -> str:
    """`highlight` is a workload key (namespace/name) whose GPUs and nodes are outlined."""
    parts: list[str] = []
    height = _draw_all(picture, highlight, parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="topology" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="GPU topology">{"".join(parts)}</svg>'
    )


def _draw_all(picture: TopologyPicture, highlight: str, parts: list[str]) -> int:
    y = 4
    for root in picture.tree:
        y = _draw(root, 0, y, picture, highlight, parts) + PAD
    return max(y, 40)


def _draw(
    entry: Mapping[str, Any],
    depth: int,
    y: int,
    picture: TopologyPicture,
    highlight: str,
    parts: list[str],
) -> int:
    """Draw `entry` at `y`; returns the y below it."""
    if entry.get("level") == "node":
        return _draw_node(str(entry.get("domain", "")), entry, depth, y, picture, highlight, parts)
    x = depth * INDENT + 2
    start = len(parts)
    parts.append("")  # the box, filled in once its height is known
    split = picture.flavor_free.get((str(entry.get("level", "")), str(entry.get("domain", ""))))
    if split and len(split) > 1:
        free = ", ".join(f"{count} {flavor}" for flavor, count in sorted(split.items()))
        title = (
            f"{entry.get('level', '')} {entry.get('domain', '')} · free by flavor: {free} "
            f"(of {entry.get('allocatable', 0)} GPUs, {entry.get('nodes', 0)} nodes)"
        )
    else:
        title = (
            f"{entry.get('level', '')} {entry.get('domain', '')} · {entry.get('free', 0)} free "
            f"of {entry.get('allocatable', 0)} GPUs ({entry.get('nodes', 0)} nodes)"
        )
    parts.append(f'<text class="domain-title" x="{x + 6}" y="{y + 15}">{escape(title)}</text>')
    bottom = y + HEADER_H
    for child in entry.get("children", []):
        bottom = _draw(child, depth + 1, bottom, picture, highlight, parts)
    bottom += PAD
    parts[start] = (
        f'<g class="domain" data-level="{escape(str(entry.get("level", "")))}" '
        f'data-domain="{escape(str(entry.get("domain", "")))}" '
        f'data-free="{int(entry.get("free", 0))}">'
        f'<rect x="{x}" y="{y}" width="{WIDTH - 2 * x}" height="{bottom - y}" rx="4" '
        f'fill="none" stroke="#94a3b8"/></g>'
    )
    return bottom


def _draw_node(
    name: str,
    entry: Mapping[str, Any],
    depth: int,
    y: int,
    picture: TopologyPicture,
    highlight: str,
    parts: list[str],
) -> int:
    tile = picture.nodes.get(name) or NodeTile(
        name, int(entry.get("allocatable", 0)), int(entry.get("free", 0)), True, "", ()
    )
    x = depth * INDENT + 2
    hosts = bool(highlight) and any(
        s is not None and s.workload_key == highlight for s in tile.slots
    )
    classes = ["node"]
    if tile.unhealthy:
        classes.append("unhealthy")
    elif not tile.schedulable:
        classes.append("unschedulable")
    if hosts:
        classes.append("hosts-highlight")
    gx = x + NAME_W
    count = max(tile.allocatable, len(tile.slots))
    note_x = gx + max(count, 8) * (GPU + GPU_GAP) + 10
    marker_x = note_x + MARKER_OFFSET
    lines = marker_lines(f"⚠ UNHEALTHY: {tile.unhealthy}", WIDTH - x - marker_x - 6)
    height = NODE_H + (len(lines) - 1) * LINE_H if tile.unhealthy else NODE_H
    parts.append(
        f'<g class="{" ".join(classes)}" id="node-{escape(name)}" data-node="{escape(name)}" '
        f'data-free="{tile.free}">'
    )
    if tile.unhealthy:
        parts.append(
            f'<rect x="{x}" y="{y + 1}" width="{WIDTH - 2 * x}" height="{height - 2}" '
            'fill="#fee2e2" stroke="#dc2626"/>'
        )
    elif hosts:
        parts.append(
            f'<rect x="{x}" y="{y + 1}" width="{WIDTH - 2 * x}" height="{NODE_H - 2}" '
            'fill="#fef9c3" stroke="#ca8a04"/>'
        )
    parts.append(f'<text class="node-name" x="{x + 6}" y="{y + 16}">{escape(name)}</text>')
    for index in range(count):
        slot = tile.slots[index] if index < len(tile.slots) else None
        parts.append(_gpu(slot, index, gx + index * (GPU + GPU_GAP), y + 5, tile, highlight))
    note = f"{tile.free} free"
    parts.append(f'<text class="node-free" x="{note_x}" y="{y + 16}">{escape(note)}</text>')
    if tile.unhealthy:
        body = escape(lines[0]) + "".join(
            f'<tspan x="{marker_x}" dy="{LINE_H}">{escape(line)}</tspan>' for line in lines[1:]
        )
        parts.append(
            f'<text class="unhealthy-marker" x="{marker_x}" y="{y + 16}" fill="#b91c1c">'
            f"<title>{escape(tile.unhealthy)}</title>{body}</text>"
        )
    elif not tile.schedulable:
        parts.append(
            f'<text class="unschedulable-marker" x="{marker_x}" y="{y + 16}" '
            'fill="#475569">unschedulable (cordoned or not Ready)</text>'
        )
    parts.append("</g>")
    return y + height


def marker_lines(text: str, width_px: int) -> list[str]:
    """`text` in lines that fit `width_px` (at CHAR_W a character), broken between words
    where it can be; a word longer than a line is broken inside."""
    chars = max(24, width_px // CHAR_W)
    return textwrap.wrap(text, chars, break_on_hyphens=False) or [text]


def _gpu(slot: GpuSlot | None, index: int, x: int, y: int, tile: NodeTile, highlight: str) -> str:
    rect = f'x="{x}" y="{y}" width="{GPU}" height="{GPU}" rx="2"'
    if slot is None:
        fill = FREE_FILL if tile.schedulable else UNAVAILABLE_FILL
        state = "free" if tile.schedulable else "unavailable"
        tip = f"{tile.name} GPU {index}: {state}"
        return f'<rect class="gpu {state}" {rect} fill="{fill}"><title>{escape(tip)}</title></rect>'
    lit = bool(highlight) and slot.workload_key == highlight
    stroke = ' stroke="#000" stroke-width="2.5"' if lit else ""
    owner = slot.workload_key or f"{slot.namespace}/{slot.pod} (no workload)"
    tip = f"{tile.name} GPU {index}: {owner}, pod {slot.pod}, team {team_of(slot.namespace)}"
    body = (
        f'<rect class="gpu used{" highlight" if lit else ""}" {rect} '
        f'fill="{slot_colour(slot)}"{stroke} data-workload="{escape(owner)}">'
        f"<title>{escape(tip)}</title></rect>"
    )
    if not slot.workload:
        return body
    return f'<a href="{escape(workload_href(slot.namespace, slot.workload))}">{body}</a>'


def legend_rows(slots: Sequence[GpuSlot]) -> list[tuple[GpuSlot, int]]:
    """One (sample slot, GPU count) per workload (or workload-less pod), sorted by key."""
    counts: dict[str, tuple[GpuSlot, int]] = {}
    for slot in slots:
        key = slot.workload_key or f"{slot.namespace}/{slot.pod}"
        first, seen = counts.get(key, (slot, 0))
        counts[key] = (first, seen + 1)
    return [counts[key] for key in sorted(counts)]


# --- a job's timeline (the goodput ledger, issue 29) -----------------------------------------

TIMELINE_LEFT = 10
TIMELINE_W = WIDTH - 2 * TIMELINE_LEFT
BAND_Y = 22
BAND_H = 30
PHASE_FILLS: dict[str, str] = {
    "running": "#16a34a",
    "restarting": "#f59e0b",
    "waiting": "#94a3b8",
    "preempted": "#a855f7",
    "suspended": "#cbd5e1",
    "unobserved": "#e5e7eb",
    "other": "#f1f5f9",
}
MARK_FILL = "#b91c1c"


def _duration(seconds: float) -> str:
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def timeline_svg(
    bands: Sequence[Mapping[str, Any]],
    interruptions: Sequence[Mapping[str, Any]],
    start: float,
    end: float,
) -> str:
    """A job's life from `start` to `end` as bands (views.goodput.timeline: phase, start,
    end, from, to) with its interruptions (views.goodput.interruption_view) marked where they
    stopped it; each band and mark says what it is on hover (<title>)."""
    span = max(end - start, 1.0)

    def x(t: float) -> float:
        return TIMELINE_LEFT + (min(max(t, start), end) - start) / span * TIMELINE_W

    parts: list[str] = []
    for band in bands:
        phase = str(band.get("phase", "other"))
        left, right = x(float(band["start"])), x(float(band["end"]))
        tip = (
            f"{phase} from {band.get('from')} to {band.get('to')} "
            f"({_duration(float(band['end']) - float(band['start']))})"
        )
        parts.append(
            f'<rect class="band {escape(phase)}" data-phase="{escape(phase)}" '
            f'x="{left:.1f}" y="{BAND_Y}" width="{max(right - left, 0.5):.1f}" '
            f'height="{BAND_H}" fill="{PHASE_FILLS.get(phase, PHASE_FILLS["other"])}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    for number, entry in enumerate(interruptions, start=1):
        at = entry.get("stopped_at_s")
        if not isinstance(at, int | float) or entry.get("cause") == "completed":
            continue
        mx = x(float(at))
        cause = str(entry.get("cause", "unknown"))
        component = str(entry.get("component") or "")
        tip = (
            f"#{number} {entry.get('stopped_at')}: {cause}"
            + (f" ({component})" if component else "")
            + f": {entry.get('detail') or entry.get('missing') or 'no evidence'}; "
            f"{float(entry.get('lost_gpu_hours') or 0.0):.2f} GPU-hours lost"
            + (f"; uncertain: {entry['uncertain']}" if entry.get("uncertain") else "")
        )
        parts.append(
            f'<a href="#interruption-{number}"><g class="interruption" '
            f'data-cause="{escape(cause)}" data-component="{escape(component)}">'
            f"<title>{escape(tip)}</title>"
            f'<line x1="{mx:.1f}" y1="{BAND_Y - 8}" x2="{mx:.1f}" y2="{BAND_Y + BAND_H + 4}" '
            f'stroke="{MARK_FILL}" stroke-width="2"/>'
            f'<polygon points="{mx - 5:.1f},{BAND_Y - 14} {mx + 5:.1f},{BAND_Y - 14} '
            f'{mx:.1f},{BAND_Y - 6}" fill="{MARK_FILL}"/></g></a>'
        )
    axis_y = BAND_Y + BAND_H + 18
    ticks = 5
    for index in range(ticks + 1):
        t = start + span * index / ticks
        anchor = "start" if index == 0 else "end" if index == ticks else "middle"
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{axis_y}" text-anchor="{anchor}">'
            f"{escape(_clock(t, span))}</text>"
        )
    legend_y = axis_y + 22
    lx = TIMELINE_LEFT
    for phase, fill in PHASE_FILLS.items():
        parts.append(
            f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" fill="{fill}" '
            'stroke="#94a3b8"/>'
            f'<text x="{lx + 16}" y="{legend_y}">{escape(phase)}</text>'
        )
        lx += 24 + 8 * len(phase)
    parts.append(
        f'<polygon points="{lx},{legend_y - 10} {lx + 10},{legend_y - 10} {lx + 5},{legend_y - 2}"'
        f' fill="{MARK_FILL}"/><text x="{lx + 16}" y="{legend_y}">interruption</text>'
    )
    height = legend_y + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="goodput-timeline" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="job timeline">{"".join(parts)}</svg>'
    )


def _clock(t: float, span: float) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%m-%d %H:%M" if span >= 86_400 else "%H:%M:%S") + "Z"
