"""NVLink: a link down, or its error counters rising faster than a threshold.

Counters are cumulative since driver load, so a rate needs the previous poll; a counter that
went down (driver reload) or a link not in the previous poll gives no rate this time. Both
faults break or slow collective communication for the whole job; retraining takes a reset.
"""

from __future__ import annotations

from exporter.snapshot import NodeSnapshot, NvLinkReading
from healthcheck.checks.base import History, finding, rate
from healthcheck.config import HealthConfig
from healthcheck.findings import Finding


def _counter(link: NvLinkReading, name: str) -> int | None:
    value: int | None = getattr(link, f"{name}_errors")
    return value


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    previous: dict[tuple[str, int], NvLinkReading] = {}
    seconds = 0.0
    if history.previous is not None:
        seconds = snapshot.taken_at - history.previous.taken_at
        for g in history.previous.gpu.gpus:
            for link in g.nvlinks:
                previous[(g.uuid, link.link)] = link
    limits = config.nvlink.max_errors_per_second
    out: list[Finding] = []
    for gpu in snapshot.gpu.gpus:
        if not gpu.up:
            continue
        for link in gpu.nvlinks:
            component = f"gpu{gpu.index}:link{link.link}"
            if link.up is False:
                out.append(
                    finding(
                        history,
                        now,
                        "nvlink_down",
                        component,
                        "critical",
                        "reboot",
                        f"NVLink {link.link} of GPU {gpu.index} is inactive",
                    )
                )
                continue
            before = previous.get((gpu.uuid, link.link))
            if before is None:
                continue
            over = []
            for name, limit in sorted(limits.items()):
                per_second = rate(_counter(link, name), _counter(before, name), seconds)
                if per_second is not None and per_second > limit:
                    over.append(f"{name} {per_second:.1f}/s (max {limit:g})")
            if over:
                out.append(
                    finding(
                        history,
                        now,
                        "nvlink_errors",
                        component,
                        "critical",
                        "reboot",
                        "errors rising: " + ", ".join(over),
                    )
                )
    return out
