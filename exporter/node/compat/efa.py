"""`--compat efa`: the AWS EFA node exporter's `node_amazonefa_<counter>{device,port}` names.

Dashboards built on that exporter (HyperPod's observability add-on among them) keep working
when topowatch replaces it. `node_amazonefa_info{device}` is 1 for every EFA device, as the
peer's is (its "EFA Devices" table lists them). The peer types these counters without a
`_total` suffix, which Prometheus' linter rejects for the counter type; they are typed untyped
here, which PromQL treats the same (`rate()` works) and which lints clean.
"""

from __future__ import annotations

from exporter.core.exposition import (
    GAUGE,
    UNTYPED,
    Family,
    escape_label_value,
)
from exporter.core.snapshot import NodeSnapshot
from exporter.node.compat import lines


def render(snapshot: NodeSnapshot) -> list[Family]:
    """~700 samples on a p5 (32 devices x ~22 counters), written in one pass over the table of
    counters x ports (exporter/node/compat/lines.py); a counter some port lacks (an older
    driver on one device) is left out for that port."""
    info = Family("node_amazonefa_info", GAUGE, _INFO_HELP)
    devices = [(escape_label_value(d.device), d) for d in snapshot.efa]
    info.lines.extend(f'node_amazonefa_info{{device="{dev}"}} 1\n' for dev, _ in devices)
    ports = [(dev, port) for dev, d in devices for port in d.ports]
    series = tuple(f'{{device="{dev}",port="{port.port}"}}' for dev, port in ports)
    keys = [tuple(port.counters) for _, port in ports]
    if keys and keys.count(keys[0]) == len(keys):  # one driver: every port, the same counters
        names = list(keys[0])
        columns: list[tuple[int | None, ...]] = list(
            zip(*[tuple(port.counters.values()) for _, port in ports], strict=True)
        )
    else:
        names = list(dict.fromkeys(name for row in keys for name in row))
        columns = [tuple(port.counters.get(name) for _, port in ports) for name in names]
    specs = [(f"node_amazonefa_{name}", UNTYPED, _COUNTER_HELP.format(name)) for name in names]
    return [info, *lines.families(specs, series, columns)]


_INFO_HELP = "1 for each EFA device under /sys/class/infiniband (EFA node exporter name)."
_COUNTER_HELP = "EFA port hw_counter {} (EFA node exporter name)."
