"""A real gRPC `PodResourcesLister` on a unix socket, standing in for the kubelet in tests.

It runs the generated servicer in a `grpc.server`, so the client under test goes through the real
transport, framing and status codes. The answer, an artificial delay and an abort status can be
changed while it runs; `stop()` followed by `start()` is a kubelet restart on the same path.

    with FakeKubelet(list_response(pod("ns", "p", {"c": {"nvidia.com/gpu": ["GPU-1"]}}))) as k:
        client = KubeletPodResources(k.socket_path)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc

from exporter.sources.podresources_pb import api_pb2, api_pb2_grpc

# resource name -> device ids, per container name
Containers = Mapping[str, Mapping[str, Sequence[str]]]


def pod(namespace: str, name: str, containers: Containers) -> Any:
    """A `PodResources` message from plain mappings."""
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in devices.items()
                ],
            )
            for container, devices in containers.items()
        ],
    )


def list_response(*pods: Any) -> Any:
    """A `ListPodResourcesResponse` holding `pods` (made with `pod`)."""
    return api_pb2.ListPodResourcesResponse(pod_resources=list(pods))


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, owner: FakeKubelet) -> None:
        self._owner = owner

    def List(self, request: Any, context: Any) -> Any:  # gRPC method names
        return self._owner._answer(context, self._owner.response)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        devices = [
            d for p in self._owner.response.pod_resources for c in p.containers for d in c.devices
        ]
        return self._owner._answer(context, api_pb2.AllocatableResourcesResponse(devices=devices))

    def Get(self, request: Any, context: Any) -> Any:
        for p in self._owner.response.pod_resources:
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return self._owner._answer(
                    context, api_pb2.GetPodResourcesResponse(pod_resources=p)
                )
        context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")


class FakeKubelet:
    """The pod-resources server. Without `socket_path` it makes (and later removes) a short
    temporary directory, since unix socket paths are limited to about 100 bytes."""

    def __init__(
        self,
        response: Any | None = None,
        *,
        socket_path: str | None = None,
        delay_seconds: float = 0.0,
        abort_code: grpc.StatusCode | None = None,
        abort_details: str = "injected failure",
    ) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(prefix="kubelet-")
            socket_path = os.path.join(self._own_dir, "kubelet.sock")
        self.socket_path = socket_path
        self.response: Any = response if response is not None else list_response()
        self.delay_seconds = delay_seconds
        self.abort_code = abort_code
        self.abort_details = abort_details
        self.calls = 0
        self._calls_lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        """Listen on `socket_path` (replacing a stale socket file, as the kubelet does)."""
        if self._server is not None:
            raise RuntimeError("already running")
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        if server.add_insecure_port("unix://" + os.path.abspath(self.socket_path)) == 0:
            raise RuntimeError(f"could not bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving at once: delayed handlers are woken and the socket file is removed."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> FakeKubelet:
        return self.start() if self._server is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _answer(self, context: Any, message: Any) -> Any:
        with self._calls_lock:
            self.calls += 1
        if self.delay_seconds > 0 and self._stopping.wait(self.delay_seconds):
            context.abort(grpc.StatusCode.UNAVAILABLE, "server stopping")
        if self.abort_code is not None:
            context.abort(self.abort_code, self.abort_details)
        return message
