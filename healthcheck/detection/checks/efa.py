"""EFA: judged from what the hardware really changes, never from the sysfs port state.

The efa driver hard-codes every port's `state` to ACTIVE and `phys_state` to LinkUp
(efa_query_port in drivers/infiniband/hw/efa/efa_verbs.c; NVSentinel's nic-health-monitor
documents the same), so that state is exported as a metric but means nothing and is not judged.
What does change:

* `efa_link_down` (critical, reboot): the ENA interface paired with the device (same ENI; see
  `exporter.sources.sysfs._pair_netdevs`) is administratively up but has lost its carrier or
  reads an operstate other than "up" ("unknown" counts as up, as in NVSentinel: drivers that
  report no carrier state read "unknown" while forwarding). An interface someone took down is
  not judged: its carrier cannot be read (EINVAL unless the interface is running). EFA-only
  interfaces have no netdev; the counters below are all there is for them.
* `efa_admin_queue` (fatal, reboot): `no_completion_cmds` is above zero. It counts admin
  commands the device never completed (efa_com.c: on a completion timeout the driver counts
  `no_completion` and clears the admin queue's running state, so every later command fails
  "Admin queue is closed") and, like every hw counter, restarts at zero when the device is reset
  or the driver reloaded. So one increase leaves the device unusable until that reset, and the
  finding lasts exactly as long: from the first poll that reads the counter above zero (a rise
  between two polls, or a value already there when the agent starts: the queue is still closed)
  until it reads zero again. Fatal, so damping does not wait for K of N polls: a single
  increase is the fault (NVSentinel's nic-health-monitor treats any increase as fatal).
* `efa_device_errors` (warning, `efa.device_errors_action`, none by default): `cmds_err`,
  `rx_drops` or `retrans_timeout_events` above their rates in `EfaConfig`.
* `efa_remote_errors` (warning, no action): unresponsive-remote or impaired-remote counters
  rising. They usually mean a *peer* is sick and rise on every healthy node talking to it; the
  cluster service correlates these findings across nodes by their `<device>:<port>` component.

Rates use `base.rate`: a counter that went down (a device reset zeroes them) restarts the series
and yields no rate, never a negative or huge one. Damping (k of n polls) is the monitor's.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.core.findings import Finding
from exporter.core.snapshot import EfaDeviceReading, NodeSnapshot
from healthcheck.detection.checks.base import History, finding, rate
from healthcheck.detection.config import HealthConfig

LINK_DOWN = "efa_link_down"
ADMIN_QUEUE = "efa_admin_queue"
DEVICE_ERRORS = "efa_device_errors"
REMOTE_ERRORS = "efa_remote_errors"


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    previous: dict[str, EfaDeviceReading] = {}
    seconds = 0.0
    if history.previous is not None:
        seconds = snapshot.taken_at - history.previous.taken_at
        previous = {d.device: d for d in history.previous.efa}
    out: list[Finding] = []
    for device in snapshot.efa:
        before = previous.get(device.device)
        if device.netdev is not None:
            link = _link_down(device, before, history, now)
            if link is not None:
                out.append(link)
        stuck = _admin_queue(device, before, history, now)
        if stuck is not None:
            out.append(stuck)
        if before is None:
            continue
        out.extend(_device_counters(device, before, seconds, history, config, now))
        before_ports = {p.port: p for p in before.ports}
        for port in device.ports:
            before_port = before_ports.get(port.port)
            if before_port is None:
                continue
            component = f"{device.device}:{port.port}"
            rising = _remote(port.counters, before_port.counters, seconds, config)
            if rising:
                out.append(
                    finding(
                        history, now, REMOTE_ERRORS, component, "warning", "none", ", ".join(rising)
                    )
                )
    return out


def _link_down(
    device: EfaDeviceReading,
    before: EfaDeviceReading | None,
    history: History,
    now: float,
) -> Finding | None:
    netdev = device.netdev
    assert netdev is not None
    if netdev.link_up or netdev.carrier is None:
        # A carrier that cannot be read means the interface is administratively down (the
        # kernel answers EINVAL unless it is running): someone took it down, not a dead link.
        return None
    component = f"{device.device}:{netdev.interface}"
    evidence = (
        f"{netdev.interface} operstate {netdev.operstate or 'unknown'},"
        f" carrier {int(netdev.carrier)}"
    )
    old = before.netdev if before is not None else None
    if (
        old is not None
        and old.interface == netdev.interface
        and netdev.carrier_changes is not None
        and old.carrier_changes is not None
        and netdev.carrier_changes > old.carrier_changes
    ):
        evidence += f", carrier_changes +{netdev.carrier_changes - old.carrier_changes}"
    return finding(history, now, LINK_DOWN, component, "critical", "reboot", evidence)


def _admin_queue(
    device: EfaDeviceReading, before: EfaDeviceReading | None, history: History, now: float
) -> Finding | None:
    """An admin command the device never completed since its last reset: fatal until reset."""
    stuck = device.counters.get("no_completion_cmds")
    if stuck is None or stuck <= 0:
        return None
    evidence = f"no_completion_cmds {stuck}"
    old = before.counters.get("no_completion_cmds") if before is not None else None
    if old is not None and stuck > old:
        evidence += f" (+{stuck - old} since the last poll)"
    evidence += (
        ": an admin command the device never completed; its admin queue stays closed until"
        " the device is reset"
    )
    return finding(history, now, ADMIN_QUEUE, device.device, "fatal", "reboot", evidence)


def _device_counters(
    device: EfaDeviceReading,
    before: EfaDeviceReading,
    seconds: float,
    history: History,
    config: HealthConfig,
    now: float,
) -> list[Finding]:
    out: list[Finding] = []
    now_c, before_c = device.counters, before.counters
    cfg = config.efa
    errors: list[str] = []
    per_minute = rate(now_c.get("cmds_err"), before_c.get("cmds_err"), seconds)
    if per_minute is not None and per_minute * 60 > cfg.cmds_err_per_minute:
        errors.append(f"cmds_err +{per_minute * 60:.1f}/min (max {cfg.cmds_err_per_minute:g})")
    for port in device.ports:
        before_port = next((p for p in before.ports if p.port == port.port), None)
        if before_port is None:
            continue
        for name, limit in (
            ("rx_drops", cfg.rx_drops_per_second),
            ("retrans_timeout_events", cfg.retrans_timeouts_per_second),
        ):
            per_second = rate(port.counters.get(name), before_port.counters.get(name), seconds)
            if per_second is not None and per_second > limit:
                errors.append(f"port {port.port} {name} +{per_second:.1f}/s (max {limit:g})")
    if errors:
        out.append(
            finding(
                history,
                now,
                DEVICE_ERRORS,
                device.device,
                "warning",
                cfg.device_errors_action,
                ", ".join(errors),
            )
        )
    return out


def _remote(
    now_counters: Mapping[str, int],
    before: Mapping[str, int],
    seconds: float,
    config: HealthConfig,
) -> list[str]:
    limit = config.efa.remote_errors_per_second
    out = []
    for name in sorted(config.efa.remote_counters):
        per_second = rate(now_counters.get(name), before.get(name), seconds)
        if per_second is not None and per_second > limit:
            out.append(f"{name} +{per_second:.1f}/s (max {limit:g})")
    return out
