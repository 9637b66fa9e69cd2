"""NVLink: a link down, or its error counters rising faster than a threshold.

Counters are cumulative since driver load, so a rate needs the previous poll; a counter that
went down (driver reload) or a link not in the previous poll gives no rate this time. Both
faults break or slow collective communication for the whole job; retraining takes a reset.
GB200 is judged by NVLink5's counters (`_ATTRIBUTES` below) with the same thresholds' meaning.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import NodeSnapshot, NvLinkReading
from healthcheck.detection.checks.base import History, finding, rate
from healthcheck.detection.config import NVLINK_COUNTERS, HealthConfig

# healthcheck.detection.config.NVLINK_COUNTERS name -> the NvLinkReading counter it rates. Up to
# Hopper the DL counters; on Blackwell (NVML 565+ drops those) NVLink5's NVML_FI_DEV_NVLINK_COUNT_*
# (nvml.h): RCV_ERRORS "Total number of packets with errors Rx on a link" takes the CRC counters'
# place, LINK_RECOVERY_EVENTS "Number of times link went from Up to recovery" the DL recovery
# counter's. A counter the GPU does not have is None and gives no rate.
_ATTRIBUTES = {
    "crc_flit": "crc_flit_errors",
    "crc_data": "crc_data_errors",
    "replay": "replay_errors",
    "recovery": "recovery_errors",
    "rx": "rx_errors",
    "rx_malformed_packet": "malformed_packet_errors",
    "rx_buffer_overrun": "buffer_overrun_errors",
    "rx_remote": "rx_remote_errors",
    "rx_general": "rx_general_errors",
    "local_link_integrity": "local_link_integrity_errors",
    "tx_discards": "tx_discards",
    "link_recovery": "link_recovery_events",
    "link_recovery_failed": "link_recovery_failed_events",
}
assert tuple(_ATTRIBUTES) == NVLINK_COUNTERS


def _counter(link: NvLinkReading, name: str) -> int | None:
    value: int | None = getattr(link, _ATTRIBUTES[name])
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
