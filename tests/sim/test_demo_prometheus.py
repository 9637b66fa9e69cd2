"""The demo's Prometheus loads the project's alert rules and an injected fault fires its alert
(issue 31): the real `prometheus` binary, started the way the demo starts it (one-second scrape
and evaluation here), scraping a real node agent over a simulated node given XID 79 on GPU 3.
/api/v1/rules holds every alerting rule of rules/topowatch-alerts.yaml, each evaluated without
error; TopowatchXidNodeRestartRequired fires for that GPU (the XID alerts have no `for`), and the
demo's `AlertSummary` prints one line when it starts firing."""

from __future__ import annotations

import io
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.node.agent import NodeAgent
from exporter.node.poller import Poller
from exporter.node.serving import MetricsServer
from exporter.sim.demo_prometheus import (
    RULES,
    AlertSummary,
    DemoPrometheus,
    count_alerts,
    prometheus_config,
    start_prometheus,
)
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from healthcheck.detection.monitor import HealthMonitor
from tests.conftest import free_port

pytestmark = pytest.mark.real_component
NODE = "demo-node-1"


@pytest.fixture
def agent() -> Iterator[MetricsServer]:
    node = SimulatedNode(get_profile("p5.48xlarge"), parse_faults(["xid=79@gpu3"]))
    sources = node.sources()
    agent = NodeAgent(Poller(NODE, sources, health=HealthMonitor()), interval=0.5)
    agent.poll_once()
    agent.start()
    server = MetricsServer(agent, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    agent.stop()
    sources.close()
    node.close()


@pytest.fixture
def prometheus(agent: MetricsServer) -> Iterator[tuple[DemoPrometheus, io.StringIO]]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus missing: run scripts/bootstrap.sh (Debian package prometheus)")
    out = io.StringIO()
    # no cluster service here: its target is down (TopowatchExporterDown waits 5 minutes)
    running = start_prometheus(
        free_port(), f"127.0.0.1:{free_port()}", [f"127.0.0.1:{agent.port}"], out, interval_s=1.0
    )
    assert running is not None, out.getvalue()
    yield running, out
    running.stop()


def eventually(check: Any, timeout: float, what: str, running: DemoPrometheus) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        assert running.proc.poll() is None, (running.directory / "prometheus.log").read_text()
        try:
            last = check()
        except (OSError, ValueError, urllib.error.URLError) as exc:  # not up yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    log = (running.directory / "prometheus.log").read_text()[-2000:]
    pytest.fail(f"timed out waiting for {what}: last {last!r}\n{log}")


def test_the_config_loads_the_rules_file() -> None:
    config = prometheus_config("c:1", ["n:2"], 1.0, ["topowatch-alerts.yaml"])
    assert '"rule_files": [\n    "topowatch-alerts.yaml"\n  ]' in config
    assert '"evaluation_interval": "1s"' in config
    assert "rule_files" not in prometheus_config("c:1", [])
    assert RULES.is_file() and count_alerts(RULES) > 20


def test_the_rules_load_evaluate_and_the_injected_xid_fires_its_alert(
    prometheus: tuple[DemoPrometheus, io.StringIO],
) -> None:
    running, out = prometheus
    printed = out.getvalue()
    assert printed.count("\n") == 1
    assert f"{count_alerts(RULES)} alert rules" in printed and "/classic/alerts" in printed
    assert running.rules == count_alerts(RULES)

    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in running.api("/api/v1/rules")["groups"] for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules):
            return rules
        return None

    rules = eventually(evaluated, 60, "every rule evaluated once", running)
    assert len([r for r in rules if r["type"] == "alerting"]) == count_alerts(RULES)
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []

    summary = AlertSummary(running, out)

    def fired() -> list[str]:
        return [line for line in summary.poll() if "TopowatchXidNodeRestartRequired" in line]

    (line,) = eventually(fired, 60, "the XID alert firing", running)
    assert line.startswith("  alert firing:     TopowatchXidNodeRestartRequired (critical)")
    assert f"XID 79 on {NODE} GPU 3 needs a node restart" in line
    assert not fired()  # said once, not at every poll
    # the classic alerts page the demo prints shows it too
    with urllib.request.urlopen(running.url + "/classic/alerts", timeout=5) as page:
        assert "TopowatchXidNodeRestartRequired" in page.read().decode()


def test_without_the_rules_file_the_demo_says_so_in_its_one_line(tmp_path: Any) -> None:
    out = io.StringIO()
    running = start_prometheus(
        free_port(), "127.0.0.1:1", [], out, rules=tmp_path / "missing.yaml", interval_s=1.0
    )
    try:
        assert running is not None and running.rules == 0
        assert out.getvalue().count("\n") == 1 and "no alert rules" in out.getvalue()
    finally:
        if running is not None:
            running.stop()
