"""The HTTP side: what a scraper gets, and that scrapes never wait on hardware."""

from __future__ import annotations

import gzip
import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

from exporter.core.exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from exporter.node.agent import NodeAgent
from exporter.node.serving import MetricsServer
from tests.conftest import SimHarness

Sim = Callable[..., SimHarness]
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@contextmanager
def serving(agent: NodeAgent) -> Iterator[Callable[..., http.client.HTTPResponse]]:
    server = MetricsServer(agent, "127.0.0.1", 0)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)

    def get(path: str, **headers: str) -> http.client.HTTPResponse:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.body = resp.read()  # type: ignore[attr-defined]
        return resp

    get.port = server.port  # type: ignore[attr-defined]
    try:
        yield get
    finally:
        conn.close()
        server.shutdown()
        server.server_close()


def test_probes_before_and_after_the_first_poll(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    agent = NodeAgent(h.poller, interval=5)
    with serving(agent) as get:
        assert get("/readyz").status == 503
        agent.poll_once()
        assert get("/readyz").status == 200
        assert get("/healthz").status == 200
        assert get("/nope").status == 404


def test_text_openmetrics_and_gzip_by_negotiation_on_one_keepalive_connection(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    agent = NodeAgent(h.poller, interval=5)
    agent.poll_once()
    with serving(agent) as get:
        plain = get("/metrics")
        assert plain.getheader("Content-Type") == TEXT_CONTENT_TYPE
        text = plain.body  # type: ignore[attr-defined]
        assert b"topowatch_gpu_up{" in text and not text.endswith(b"# EOF\n")

        om = get("/metrics", Accept=PROMETHEUS_ACCEPT)
        assert om.getheader("Content-Type") == OPENMETRICS_CONTENT_TYPE
        assert om.body.endswith(b"# EOF\n")  # type: ignore[attr-defined]
        assert any(f.name == "topowatch_gpu_up" for f in parse_om(om.body.decode()))  # type: ignore[attr-defined]

        packed = get("/metrics", **{"Accept-Encoding": "gzip"})
        assert packed.getheader("Content-Encoding") == "gzip"
        assert gzip.decompress(packed.body) == text  # type: ignore[attr-defined]


def test_scrape_serves_last_snapshot_while_a_poll_is_stuck(sim: Sim) -> None:
    """NVML can hang for seconds; a scrape must not wait for it."""
    h = sim("p5.48xlarge")
    agent = NodeAgent(h.poller, interval=5)
    agent.poll_once()
    before = agent.current.text
    release = threading.Event()
    real_read = h.sources.gpu.read

    def stuck_read():  # type: ignore[no-untyped-def]
        release.wait(10)
        return real_read()

    h.sources.gpu.read = stuck_read  # type: ignore[method-assign]
    poll = threading.Thread(target=agent.poll_once)
    poll.start()
    try:
        with serving(agent) as get:
            assert get("/metrics").body == before  # type: ignore[attr-defined]
            assert get("/readyz").status == 200
    finally:
        release.set()
        poll.join(10)
    assert agent.current.text != before  # the stuck poll did land afterwards


def test_a_failing_subscriber_does_not_stop_publishing(sim: Sim) -> None:
    h = sim("p5.48xlarge")

    def broken(_: object) -> None:
        raise RuntimeError("subscriber bug")

    agent = NodeAgent(h.poller, interval=5, on_snapshot=broken)
    agent.poll_once()
    assert agent.ready and b"topowatch_gpu_up" in agent.current.text


def test_background_loop_polls_on_its_interval(sim: Sim) -> None:
    h = sim("p5.48xlarge")
    agent = NodeAgent(h.poller, interval=0.05)
    agent.start()
    try:
        waited = threading.Event()
        for _ in range(1000):  # at most some 10 s: a loaded machine may be slow to start it
            if agent.ready:
                break
            waited.wait(0.01)
        first = agent.current
        assert agent.ready
        for _ in range(1000):
            if agent.current is not first:
                break
            waited.wait(0.01)
        assert agent.current is not first
    finally:
        agent.stop()


def test_a_client_hanging_up_is_quiet_and_the_server_keeps_serving(
    sim: Sim, capfd: pytest.CaptureFixture[str]
) -> None:
    h = sim("p5.48xlarge")
    agent = NodeAgent(h.poller, interval=5)
    agent.poll_once()
    with serving(agent) as get:
        rude = socket.create_connection(("127.0.0.1", get.port))  # type: ignore[attr-defined]
        rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rude.sendall(b"GET /metr")  # half a request, then a TCP reset
        rude.close()
        time.sleep(0.3)
        assert get("/metrics").status == 200
    assert "Traceback" not in capfd.readouterr().err
