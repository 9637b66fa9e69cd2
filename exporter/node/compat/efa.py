"""`--compat efa`: the AWS EFA node exporter's `node_amazonefa_<counter>{device,port}` names.

Dashboards built on that exporter (HyperPod's observability add-on among them) keep working
when topowatch replaces it. `node_amazonefa_info{device}` is 1 for every EFA device, as the
peer's is (its "EFA Devices" table lists them). The peer types these counters without a
`_total` suffix, which Prometheus' linter rejects for the counter type; they are typed untyped
here, which PromQL treats the same (`rate()` works) and which lints clean.
"""

from __future__ import annotations

from exporter.exposition import GAUGE, UNTYPED, Family, escape_label_value
from exporter.snapshot import NodeSnapshot


def render(snapshot: NodeSnapshot) -> list[Family]:
    info = Family(
        "node_amazonefa_info",
        GAUGE,
        "1 for each EFA device under /sys/class/infiniband (EFA node exporter name).",
    )
    fams: dict[str, Family] = {}
    for d in snapshot.efa:
        device = escape_label_value(d.device)
        info.add_rendered(f'{{device="{device}"}}', 1)
        for port in d.ports:
            labels = f'{{device="{device}",port="{port.port}"}}'
            for name, value in port.counters.items():
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = Family(
                        f"node_amazonefa_{name}",
                        UNTYPED,
                        f"EFA port hw_counter {name} (EFA node exporter name).",
                    )
                fam.add_rendered(labels, value)
    return [info, *fams.values()]
