"""KubeletPodResources against a real gRPC PodResourcesLister on a unix socket."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.core.snapshot import PodRef
from exporter.sources.interfaces import SourceError
from exporter.sources.podresources import KubeletPodResources, StaticPodResources
from exporter.sources.podresources_pb import api_pb2_grpc
from tests.podresources_server import FakeKubelet, list_response, pod

GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"

TRAINING = list_response(
    pod(
        "team-a",
        "trainer-0",
        {
            "main": {GPU: ["GPU-aaaa-0", "GPU-aaaa-1"], EFA: ["efa0", "efa1"]},
            "sidecar": {},
        },
    ),
    pod("team-a", "trainer-1", {"main": {GPU: ["GPU-bbbb-2"]}, "logger": {"cpu": ["3"]}}),
    pod("team-b", "eval", {"prep": {EFA: ["efa2"]}, "eval": {GPU: ["GPU-cccc-3"]}}),
    pod("kube-system", "aws-node", {"aws-node": {}}),
)


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet(TRAINING) as server:
        yield server


@pytest.fixture
def client(kubelet: FakeKubelet) -> Iterator[KubeletPodResources]:
    # Generous: a loaded CI machine must not turn an ordinary answer into a timeout.
    source = KubeletPodResources(kubelet.socket_path, timeout_seconds=5.0)
    yield source
    source.close()


class GrpcSpy:
    """What the client asked of gRPC: channels opened and the deadline of every `List`."""

    def __init__(self) -> None:
        self.channels: list[str] = []
        self.list_timeouts: list[float | None] = []


@pytest.fixture
def grpc_spy(monkeypatch: pytest.MonkeyPatch) -> GrpcSpy:
    """Records, then passes on to the real gRPC, every channel and `List` call the client makes,
    so a test can check the deadline it set instead of timing the call."""
    spy = GrpcSpy()
    real_channel = grpc.insecure_channel
    real_stub = api_pb2_grpc.PodResourcesListerStub

    def insecure_channel(target: str, *args: Any, **kwargs: Any) -> Any:
        spy.channels.append(target)
        return real_channel(target, *args, **kwargs)

    class RecordingStub:
        def __init__(self, channel: Any) -> None:
            self._stub = real_stub(channel)

        def List(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            spy.list_timeouts.append(timeout)
            return self._stub.List(request, timeout=timeout, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", insecure_channel)
    monkeypatch.setattr(api_pb2_grpc, "PodResourcesListerStub", RecordingStub)
    return spy


def test_maps_gpu_uuids_to_containers(client: KubeletPodResources) -> None:
    assert client.gpu_assignments() == {
        "GPU-aaaa-0": PodRef("team-a", "trainer-0", "main"),
        "GPU-aaaa-1": PodRef("team-a", "trainer-0", "main"),
        "GPU-bbbb-2": PodRef("team-a", "trainer-1", "main"),
        "GPU-cccc-3": PodRef("team-b", "eval", "eval"),
    }


def test_other_resources_included_when_configured(kubelet: FakeKubelet) -> None:
    source = KubeletPodResources(kubelet.socket_path, resource_names=(GPU, EFA))
    try:
        got = source.gpu_assignments()
    finally:
        source.close()
    assert got["efa0"] == got["efa1"] == PodRef("team-a", "trainer-0", "main")
    assert got["efa2"] == PodRef("team-b", "eval", "prep")
    assert got["GPU-cccc-3"] == PodRef("team-b", "eval", "eval")
    assert len(got) == 7


def test_empty_node(kubelet: FakeKubelet, client: KubeletPodResources) -> None:
    kubelet.response = list_response()
    assert client.gpu_assignments() == {}


def test_channel_is_reused(kubelet: FakeKubelet, client: KubeletPodResources) -> None:
    for _ in range(3):
        assert len(client.gpu_assignments()) == 4
    assert kubelet.calls == 3


def test_missing_socket_is_unavailable_fast(tmp_path: object, grpc_spy: GrpcSpy) -> None:
    """Reported before gRPC is involved, so it cannot wait out the (long) timeout."""
    path = os.path.join(str(tmp_path), "absent.sock")
    source = KubeletPodResources(path, timeout_seconds=5.0)
    with pytest.raises(SourceError) as info:
        source.gpu_assignments()
    assert grpc_spy.channels == []
    assert grpc_spy.list_timeouts == []
    assert info.value.reason == "unavailable"
    assert path in str(info.value)
    source.close()


def test_stale_socket_file_is_unavailable(kubelet: FakeKubelet, grpc_spy: GrpcSpy) -> None:
    """A socket file nobody listens on (kubelet died without cleaning up)."""
    kubelet.stop()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(kubelet.socket_path)
    stale.close()
    source = KubeletPodResources(kubelet.socket_path, timeout_seconds=4.0)
    with pytest.raises(SourceError) as info:
        source.gpu_assignments()
    assert grpc_spy.list_timeouts == [4.0]  # bounded by the timeout, connection set-up included
    assert info.value.reason in ("unavailable", "timeout")
    kubelet.start()  # the kubelet comes back on the same path
    assert len(source.gpu_assignments()) == 4
    assert grpc_spy.list_timeouts == [4.0, 4.0]
    source.close()


def test_slow_server_times_out(kubelet: FakeKubelet, grpc_spy: GrpcSpy) -> None:
    # The answer would come long after the deadline (stopping the kubelet cuts the wait short):
    # a call that did not honour its deadline would get it and raise nothing.
    kubelet.delay_seconds = 10.0
    source = KubeletPodResources(kubelet.socket_path, timeout_seconds=0.3)
    with pytest.raises(SourceError) as info:
        source.gpu_assignments()
    source.close()
    assert info.value.reason == "timeout"
    assert "DEADLINE_EXCEEDED" in str(info.value)
    assert grpc_spy.list_timeouts == [0.3]


def test_permission_denied(kubelet: FakeKubelet, client: KubeletPodResources) -> None:
    kubelet.abort_code = grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(SourceError) as info:
        client.gpu_assignments()
    assert info.value.reason == "permission"


def test_other_status_is_rpc_error(kubelet: FakeKubelet, client: KubeletPodResources) -> None:
    kubelet.abort_code = grpc.StatusCode.INTERNAL
    with pytest.raises(SourceError) as info:
        client.gpu_assignments()
    assert info.value.reason == "rpc_error"
    assert "INTERNAL" in str(info.value)


def test_recovers_after_kubelet_restart(kubelet: FakeKubelet, client: KubeletPodResources) -> None:
    assert len(client.gpu_assignments()) == 4
    kubelet.stop()
    with pytest.raises(SourceError) as info:
        client.gpu_assignments()
    assert info.value.reason == "unavailable"
    kubelet.response = list_response(pod("team-c", "new", {"c": {GPU: ["GPU-dddd-0"]}}))
    kubelet.start()
    assert client.gpu_assignments() == {"GPU-dddd-0": PodRef("team-c", "new", "c")}


def test_recovers_when_socket_replaced_without_a_failed_call(
    kubelet: FakeKubelet, client: KubeletPodResources
) -> None:
    """The kubelet restarts between two polls; the old connection is dead but unnoticed."""
    assert len(client.gpu_assignments()) == 4
    kubelet.restart()
    deadline = time.monotonic() + 10.0  # a guard against looping for ever, not a speed limit
    while True:  # the first call may see the old connection's death; the next must succeed
        try:
            assert len(client.gpu_assignments()) == 4
            break
        except SourceError as err:
            assert err.reason == "unavailable"
            assert time.monotonic() < deadline
    assert kubelet.calls >= 2


def test_static_source() -> None:
    ref = PodRef("ns", "p", "c")
    source = StaticPodResources({"GPU-1": ref})
    got = source.gpu_assignments()
    assert got == {"GPU-1": ref}
    source.set({})
    assert source.gpu_assignments() == {}
    assert got == {"GPU-1": ref}  # earlier answers are copies
    source.close()


# ----- the generated stubs, and the grpcio they need (issue 28) -------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_the_generated_stubs_refuse_grpcio_older_than_1_85_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The premise: the pinned generated code checks the installed grpcio at import (the
    version README and pyproject state as the minimum)."""
    from exporter.sources import podresources_pb

    monkeypatch.setattr(grpc, "__version__", "1.84.0")
    monkeypatch.delitem(sys.modules, "exporter.sources.podresources_pb.api_pb2_grpc")
    monkeypatch.delattr(podresources_pb, "api_pb2_grpc")
    with pytest.raises(RuntimeError, match=r"grpcio>=1\.85\.1"):
        importlib.import_module("exporter.sources.podresources_pb.api_pb2_grpc")


def test_an_old_grpcio_fails_the_collector_not_the_agent(
    kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to read the kubelet under a grpcio the stubs refuse: a SourceError naming the
    version needed (the podresources collector fails, everything else is served)."""
    from exporter.sources import podresources_pb

    monkeypatch.setattr(grpc, "__version__", "1.84.0")
    monkeypatch.delitem(sys.modules, "exporter.sources.podresources_pb.api_pb2_grpc")
    monkeypatch.delattr(podresources_pb, "api_pb2_grpc")
    source = KubeletPodResources(kubelet.socket_path, timeout_seconds=5.0)
    try:
        with pytest.raises(SourceError) as failed:
            source.gpu_assignments()
    finally:
        source.close()
    assert failed.value.reason == "grpc_unusable"
    assert "1.84.0" in str(failed.value) and "grpcio >= 1.85.1" in str(failed.value)


def test_no_kubernetes_starts_under_an_old_grpcio_without_loading_the_stubs(
    tmp_path: Path,
) -> None:
    """`topowatch node --no-kubernetes` never calls the kubelet, so it must start whatever
    grpcio the image has: run on real sources (no GPU here) with grpcio reporting 1.84.0, it
    prints its exposition and has not imported the generated stubs."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    code = (
        "import sys\n"
        "import grpc\n"
        "grpc.__version__ = '1.84.0'\n"
        "from exporter.cli import main\n"
        "rc = main(['--log-level', 'ERROR', 'node', '--once', '--no-kubernetes', '--no-health',"
        f" '--sysfs-root', {str(tmp_path / 'sys')!r}, '--proc-root', {str(tmp_path / 'proc')!r},"
        " '--kernel-log', 'off'])\n"
        "print(sorted(m for m in sys.modules if 'podresources' in m), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "topowatch_nvml_up" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]"
