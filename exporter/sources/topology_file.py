"""A node's topology labels from a topology file, for hosts the Node labels do not place.

A Slurm host has no Node object, so nothing labels its network placement; `topowatch node
--topology-file` reads it from the JSON of `topowatch topology from-ec2 --format json` or a
Slurm topology.conf instead. `topology_file_labels` looks the node up in that file once, at
start; `FileTopologyLabels` puts those labels beneath the Node's own on every poll.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.topology.files import load_placements, placement_labels, under_node_labels

if TYPE_CHECKING:
    from exporter.sources.interfaces import NodeLabelsSource

__all__ = ["FileTopologyLabels", "topology_file_labels"]

# The `topowatch` command's logger: the warning below is about its --topology-file flag, and
# reads as the command's own, as it did when the command read the file itself.
log = logging.getLogger("topowatch")


def topology_file_labels(path: Path | None, node_name: str) -> dict[str, str]:
    """This node's placement labels from --topology-file, by its name or short hostname; {} and
    a warning when the file does not list it (the agent runs, with empty topology labels).
    `TopologyFileError` for a file that cannot be used."""
    if path is None:
        return {}
    placements = load_placements(path)
    placement = placements.get(node_name) or placements.get(node_name.split(".", 1)[0])
    if placement is None:
        log.warning(
            "--topology-file %s does not list node %s; its topology labels stay empty",
            path,
            node_name,
        )
        return {}
    return placement_labels(placement)


class FileTopologyLabels:
    """Node labels with a topology file's placement beneath them (`under_node_labels`): the
    Node's own labels win where there are any, a Slurm host without a Node reads the file's."""

    def __init__(self, node: NodeLabelsSource, from_file: Mapping[str, str]) -> None:
        self._node = node
        self._from_file = dict(from_file)

    def labels(self) -> Mapping[str, str]:
        return under_node_labels(self._node.labels(), self._from_file)

    def drain_errors(self) -> list[str]:
        return self._node.drain_errors()

    def close(self) -> None:
        self._node.close()
