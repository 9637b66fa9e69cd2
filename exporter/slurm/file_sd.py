"""Prometheus file_sd targets for every node agent, from slurmctld's node list (pure).

Prometheus' `file_sd_configs` reads a JSON list of target groups and re-reads the file when it
changes (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config),
so a Prometheus on the head node follows nodes joining and leaving the cluster with no other
discovery. One group per node, so each target carries its own `node` and `partition` labels; a
node in several partitions gets them comma-joined in sorted order (`partition=~".*,?gpu,?.*"`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from exporter.sources.slurm.nodes import SlurmNode


def targets(nodes: Iterable[SlurmNode], port: int, cluster: str) -> list[dict[str, object]]:
    groups: list[dict[str, object]] = []
    for node in sorted(nodes, key=lambda n: n.name):
        host = f"[{node.address}]" if ":" in node.address else node.address
        groups.append(
            {
                "targets": [f"{host}:{port}"],
                "labels": {
                    "cluster": cluster,
                    "partition": ",".join(sorted(node.partitions)),
                    "node": node.name,
                },
            }
        )
    return groups


def render(nodes: Iterable[SlurmNode], port: int, cluster: str) -> str:
    return json.dumps(targets(nodes, port, cluster), indent=1) + "\n"
