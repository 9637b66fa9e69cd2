"""Leadership of the cluster service: which of its replicas may write.

Every replica runs the informers and serves the model (reads scale out, and a standby is warm
when it takes over); only the leader may act on the cluster (remediation's Events and Node
patches). `Leadership` wraps exporter.sources.lease's `LeaderElector` for the service:

    leadership = Leadership.from_args(args, api_client)   # after add_arguments(parser)
    leadership.start()
    ...  if leadership.is_leader: act  ...  families += leadership.families()
    leadership.stop()                       # releases the Lease, so a standby takes over now

Without --leader-elect (one replica, the chart's default) there is no Lease and no request:
the only replica always leads, and `families()` still says so, so that dashboards and alerts
read the same series whatever the replica count.

The identity is the pod's name (POD_NAME, from the downward API) or else the host name: in a
pod both are the pod name, and a restarted pod of a Deployment gets a new one, so a new
process never inherits a lease it did not renew. The Lease lives in --leader-elect-namespace
(default: POD_NAMESPACE, else the service account's namespace, else "default").
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exporter.cluster.leader.args import DEFAULT_LEASE_NAME, add_arguments
from exporter.core.exposition import Family
from exporter.sources.lease import ElectionConfig, LeaderElector, LeaseLock, leader_families

__all__ = [
    "DEFAULT_LEASE_NAME",
    "Leadership",
    "add_arguments",
    "default_identity",
    "default_namespace",
]

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """POD_NAME (the chart sets it from the downward API), else the host name."""
    environ = os.environ if environ is None else environ
    return environ.get("POD_NAME") or socket.gethostname()


def default_namespace(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


class Leadership:
    """Whether this replica of the cluster service leads, and the metrics that say so.

    `enabled` False: no election, always leader. Otherwise an election on the Lease
    `namespace/lease_name` as `identity`; `on_started_leading` / `on_stopped_leading` run on
    the elector's callback thread (start or stop the writers there, or poll `is_leader`).
    `stop()` releases the Lease (a clean shutdown hands over at once, not after a lease).
    """

    def __init__(
        self,
        api_client: Any,
        *,
        enabled: bool,
        namespace: str,
        lease_name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        config: ElectionConfig | None = None,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
    ) -> None:
        self.enabled = enabled
        self.identity = identity or default_identity()
        self.elector: LeaderElector | None = None
        if enabled:
            self.elector = LeaderElector(
                LeaseLock(api_client, namespace, lease_name),
                self.identity,
                config or ElectionConfig(release_on_cancel=True),
                on_started_leading=on_started_leading,
                on_stopped_leading=on_stopped_leading,
            )

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        api_client: Any,
        *,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
    ) -> Leadership:
        """From the flags of `add_arguments`; ValueError for timings client-go would refuse."""
        config = ElectionConfig(
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
            release_on_cancel=True,
        )
        return cls(
            api_client,
            enabled=bool(args.leader_elect),
            namespace=args.leader_elect_namespace or default_namespace(),
            lease_name=args.leader_elect_lease_name,
            config=config,
            on_started_leading=on_started_leading,
            on_stopped_leading=on_stopped_leading,
        )

    def start(self) -> None:
        if self.elector is not None:
            self.elector.start()

    def stop(self) -> None:
        if self.elector is not None:
            self.elector.stop()

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else True

    def families(self) -> list[Family]:
        """topowatch_cluster_leader{identity} and topowatch_cluster_leader_transitions_total."""
        if self.elector is not None:
            return self.elector.families()
        return leader_families(self.identity, True, 0)
