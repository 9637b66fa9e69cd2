"""A node's place in the cluster's topology, read from its Kubernetes labels.

EC2 publishes its network topology as node labels: `network-node-layer-1` is the layer farthest
from the instance, and the deepest layer present (3 on p5, 4 on newer types) is the one the
instance hangs from. Region and zone sit above the network tree; UltraServer membership (one
NVLink domain) is a separate, flat grouping. Nothing here knows about Kubernetes objects or
Kueue: label keys are the only contract, so `topowatch topology from-ec2` can reuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LEVELS: tuple[str, ...] = (
    "region",
    "zone",
    "network-node-layer-1",
    "network-node-layer-2",
    "network-node-layer-3",
    "network-node-layer-4",
    "node",
)
NETWORK_LEVELS: tuple[str, ...] = LEVELS[2:6]
ULTRASERVER = "ultraserver"  # the flat level of UltraServer membership (not in LEVELS)

REGION_KEY = "topology.kubernetes.io/region"
ZONE_KEY = "topology.kubernetes.io/zone"
LAYER_KEYS: tuple[str, ...] = tuple(
    f"topology.k8s.aws/network-node-layer-{n}" for n in range(1, len(NETWORK_LEVELS) + 1)
)
HOSTNAME_KEY = "kubernetes.io/hostname"
ULTRASERVER_KEY = "topology.k8s.aws/ultraserver-id"
INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"
# HyperPod's health agent marks nodes here before it reboots or replaces them.
HEALTH_STATUS_KEY = "sagemaker.amazonaws.com/node-health-status"
# HyperPod's deep health check (DCGM level 4, EFA, NCCL) on this node: InProgress, Passed or
# Failed (sagemaker-hyperpod-eks-resiliency-node-labels). Absent when none ever ran.
DEEP_HEALTH_CHECK_KEY = "sagemaker.amazonaws.com/deep-health-check-status"
# The HyperPod instance group a node belongs to (what StartClusterHealthCheck names).
INSTANCE_GROUP_KEY = "sagemaker.amazonaws.com/instance-group-name"
DEEP_HEALTH_PASSED = "Passed"
DEEP_HEALTH_UNAVAILABLE: frozenset[str] = frozenset({"InProgress", "Failed"})
# The provider id EKS and HyperPod give a Node: aws:///<zone>/<instance id>.
PROVIDER_ID_PREFIX = "aws:///"
_LEGACY_INSTANCE_TYPE_KEY = "beta.kubernetes.io/instance-type"

# Every label `Placement.from_labels` reads: a change to any other label (HyperPod's health
# status, say) leaves a node where it was, which the cluster model uses to skip re-placing it.
PLACEMENT_KEYS: frozenset[str] = frozenset(
    {
        REGION_KEY,
        ZONE_KEY,
        *LAYER_KEYS,
        ULTRASERVER_KEY,
        INSTANCE_TYPE_KEY,
        _LEGACY_INSTANCE_TYPE_KEY,
        HOSTNAME_KEY,
    }
)

LABEL_KEY_OF_LEVEL: dict[str, str] = {
    "region": REGION_KEY,
    "zone": ZONE_KEY,
    **dict(zip(NETWORK_LEVELS, LAYER_KEYS, strict=True)),
    "node": HOSTNAME_KEY,
}
_LEVEL_OF_LABEL_KEY: dict[str, str] = {
    **{key: level for level, key in LABEL_KEY_OF_LEVEL.items()},
    ULTRASERVER_KEY: ULTRASERVER,
}


def level_of_label_key(key: str) -> str | None:
    """The level a node label key names (Kueue Topology levels are label keys), else None."""
    return _LEVEL_OF_LABEL_KEY.get(key)


def _label(labels: Mapping[str, str], key: str) -> str:
    """A label's value, "" when absent or not a string (a malformed object must not crash us)."""
    value = labels.get(key)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one node sits. Absent labels are "".

    `layers` holds layer-1 down to the deepest layer present, so its length is the depth of the
    node's network tree; a missing intermediate layer stays in place as "" so that index i is
    always layer i+1.
    """

    region: str
    zone: str
    layers: tuple[str, ...]
    ultraserver: str
    instance_type: str
    hostname: str = ""

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Placement:
        if type(labels) is not dict and not isinstance(labels, Mapping):
            labels = {}
        get = labels.get  # `_label` where the value is not a plain str: this runs per Node event
        layers = tuple([v if type(v := get(k)) is str else _label(labels, k) for k in LAYER_KEYS])
        depth = len(layers)
        while depth and not layers[depth - 1]:
            depth -= 1
        return cls(
            v if type(v := get(REGION_KEY)) is str else _label(labels, REGION_KEY),
            v if type(v := get(ZONE_KEY)) is str else _label(labels, ZONE_KEY),
            layers[:depth],
            v if type(v := get(ULTRASERVER_KEY)) is str else _label(labels, ULTRASERVER_KEY),
            v
            if type(v := get(INSTANCE_TYPE_KEY)) is str and v
            else _label(labels, INSTANCE_TYPE_KEY) or _label(labels, _LEGACY_INSTANCE_TYPE_KEY),
            v if type(v := get(HOSTNAME_KEY)) is str else _label(labels, HOSTNAME_KEY),
        )

    def domain_at(self, level: str) -> str | None:
        """The domain id (the label value) at `level`, None where the node has none."""
        if level == "region":
            value = self.region
        elif level == "zone":
            value = self.zone
        elif level == "node":
            value = self.hostname
        elif level == ULTRASERVER:
            value = self.ultraserver
        elif level in NETWORK_LEVELS:
            index = NETWORK_LEVELS.index(level)
            value = self.layers[index] if index < len(self.layers) else ""
        else:
            return None
        return value or None


def hops(a: Placement, b: Placement, same_node: bool = False) -> int | None:
    """Links on the network path between two nodes, by their network-node labels.

    0 for the same node. Otherwise each node climbs from itself to the lowest network node the
    two share: with equal depths that is twice the number of levels strictly below that network
    node, the instance level included (3 layers: same layer-3 -> 2, same layer-2 -> 4, same
    layer-1 -> 6). Nodes that share no layer meet above the network tree: 2 x (layers + 1),
    so 8 with 3 layers. None when either node has no network labels, since nothing can be said.

    Network node ids are globally unique, so the lowest shared id decides even when a layer
    above it is missing from the labels; nodes of different depths count their own climbs.
    """
    if same_node:
        return 0
    if not a.layers or not b.layers:
        return None
    shared = 0
    for index in range(min(len(a.layers), len(b.layers)) - 1, -1, -1):
        value = a.layers[index]
        if value and value == b.layers[index]:
            shared = index + 1
            break
    return (len(a.layers) - shared + 1) + (len(b.layers) - shared + 1)
