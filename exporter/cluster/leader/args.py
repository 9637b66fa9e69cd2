"""The leader election flags of `topowatch cluster`, apart from the elector itself.

Building the command line must stay cheap: `topowatch node` builds the same parser on every GPU
node, and the elector pulls in the Kubernetes client. So the flags (client-go's names; its defaults
for lease duration 15 s and renew deadline 10 s; `ElectionConfig` in exporter/sources/lease.py has
the same defaults, and tests/cluster/test_leader_election.py checks that they agree) live here,
importing nothing but argparse.

The retry period is 0.4 s, not client-go's 2 s. A standby counts the lease from when it saw the
last renewal, at one of its jittered retries (retry period x [1, 2.2)), and takes over at the
first retry after it ran out: a failover takes up to lease + 4.4 retry periods. At 0.4 s that is
within lease + 2 s (benchmarks/failover.py prints it); the cost is one Lease request per
replica every 0.4 s.
"""

from __future__ import annotations

import argparse

DEFAULT_LEASE_NAME = "topowatch-cluster"
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 0.4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The leader election flags of `topowatch cluster` (client-go's names and defaults)."""
    group = parser.add_argument_group("leader election (for more than one replica)")
    group.add_argument(
        "--leader-elect",
        action="store_true",
        help="campaign for a coordination.k8s.io Lease; only the leader writes to the cluster",
    )
    group.add_argument(
        "--leader-elect-namespace",
        metavar="NAMESPACE",
        default=None,
        help="namespace of the Lease (default: POD_NAMESPACE, the service account's, default)",
    )
    group.add_argument(
        "--leader-elect-lease-name",
        metavar="NAME",
        default=DEFAULT_LEASE_NAME,
        help=f"name of the Lease (default {DEFAULT_LEASE_NAME})",
    )
    group.add_argument(
        "--leader-elect-lease-duration",
        metavar="SECONDS",
        type=float,
        default=LEASE_DURATION_S,
        help="how long a standby waits for an unrenewed lease before taking over",
    )
    group.add_argument(
        "--leader-elect-renew-deadline",
        metavar="SECONDS",
        type=float,
        default=RENEW_DEADLINE_S,
        help="how long the leader keeps acting without a successful renewal",
    )
    group.add_argument(
        "--leader-elect-retry-period",
        metavar="SECONDS",
        type=float,
        default=RETRY_PERIOD_S,
        help="pause between two attempts to acquire or renew",
    )
