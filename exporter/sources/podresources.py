"""Which pod holds which GPU: the kubelet pod-resources API (v1) and its simulated peer.

The kubelet serves `PodResourcesLister` on a unix socket; `List` returns, for every running
container, the device ids each device plugin handed it. The NVIDIA device plugin's ids are GPU
UUIDs ("GPU-..."), exactly what NVML reports, so they join the GPU readings without translation.

The generated stubs (exporter/sources/podresources_pb) are imported on the first `List`, not
with this module: `api_pb2_grpc` refuses to load under a grpcio older than the grpcio-tools
that generated it (1.85.1) and `api_pb2` under a protobuf older than 7.35.1. An agent that
never asks the kubelet (`--no-kubernetes`) must start whatever grpcio the image has; one that
does and cannot load them fails the `podresources` collector with reason `grpc_unusable` and
the message saying which version it needs, and serves everything else.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc

from exporter.core.snapshot import PodRef
from exporter.sources.interfaces import SourceError

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ("nvidia.com/gpu",)

# The kubelet's own pod-resources client allows 16 MiB; gRPC's Python default of 4 MiB could
# truncate a List on a dense node.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # Keep a restarted kubelet reachable soon; the socket is local, so retrying is cheap.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Subchannels are otherwise shared process-wide, so a fresh channel would inherit the
    # failed one's reconnect backoff and fail at once, even with the kubelet back.
    ("grpc.use_local_subchannel_pool", 1),
)

_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.PERMISSION_DENIED: "permission",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
}


class KubeletPodResources:
    """`PodResourcesSource` backed by the kubelet's pod-resources socket.

    One channel is kept between polls. Every call is bounded by `timeout_seconds` (connection
    set-up included), and a missing socket is reported before gRPC is involved, so an absent
    kubelet costs one `stat` a poll rather than a reconnect loop.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        resource_names: Sequence[str] = DEFAULT_RESOURCES,
        timeout_seconds: float = 1.0,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        if isinstance(resource_names, str):  # a lone name would be split into letters
            resource_names = (resource_names,)
        self.socket_path = socket_path
        self.resource_names = frozenset(resource_names)
        self.timeout_seconds = timeout_seconds
        self._target = "unix://" + os.path.abspath(socket_path)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None  # api_pb2_grpc.PodResourcesListerStub

    def gpu_assignments(self) -> Mapping[str, PodRef]:
        """Device id -> the container holding it, for every configured resource.

        An id listed under two containers (shared GPUs) keeps the first holder the kubelet
        lists, so the answer is stable from poll to poll.
        """
        response = self._list()
        assignments: dict[str, PodRef] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                ref: PodRef | None = None
                for devices in container.devices:
                    if devices.resource_name not in self.resource_names:
                        continue
                    if ref is None:
                        ref = PodRef(
                            namespace=pod.namespace, pod=pod.name, container=container.name
                        )
                    for device_id in devices.device_ids:
                        assignments.setdefault(device_id, ref)
        return assignments

    def close(self) -> None:
        with self._lock:
            self._drop_channel()

    def _list(self) -> Any:
        """One bounded `List` call; every failure becomes a `SourceError`."""
        if not os.path.exists(self.socket_path):
            self.close()  # no channel left retrying a socket that is not there
            raise SourceError(
                "unavailable", f"kubelet pod-resources socket {self.socket_path} does not exist"
            )
        if not os.access(self.socket_path, os.R_OK | os.W_OK):
            raise SourceError(
                "permission", f"no read/write access to kubelet socket {self.socket_path}"
            )
        api_pb2, api_pb2_grpc = _stubs()
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            stub = self._stub
        try:
            return stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_seconds)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # A kubelet restart replaces the socket; a fresh channel connects to the new
                # one at once instead of waiting out the old channel's reconnect backoff.
                with self._lock:
                    if self._stub is stub:
                        self._drop_channel()
            reason = _REASONS.get(code, "rpc_error") if code is not None else "rpc_error"
            name = code.name if code is not None else "unknown"
            raise SourceError(
                reason, f"pod-resources List on {self.socket_path} failed: {name}: {details}"
            ) from err

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None


def _stubs() -> tuple[ModuleType, ModuleType]:
    """The generated message and service modules, imported on first use; `SourceError`
    (`grpc_unusable`) when the installed grpcio or protobuf is older than they need."""
    try:
        from exporter.sources.podresources_pb import api_pb2, api_pb2_grpc
    except Exception as e:  # grpc's RuntimeError, protobuf's VersionError, an ImportError
        raise SourceError(
            "grpc_unusable",
            f"cannot load the kubelet pod-resources client (grpcio {grpc.__version__}; needs"
            f" grpcio >= 1.85.1 and protobuf >= 7.35.1): {e}",
        ) from e
    return api_pb2, api_pb2_grpc


class StaticPodResources:
    """`PodResourcesSource` for the simulation: a fixed assignment, replaceable by tests."""

    def __init__(self, assignments: Mapping[str, PodRef]) -> None:
        self._assignments = dict(assignments)

    def set(self, assignments: Mapping[str, PodRef]) -> None:
        self._assignments = dict(assignments)

    def gpu_assignments(self) -> Mapping[str, PodRef]:
        return dict(self._assignments)

    def close(self) -> None:
        pass
