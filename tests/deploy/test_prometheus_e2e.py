"""Every panel of every dashboard, evaluated by a real Prometheus.

The Debian `prometheus` binary scrapes two simulated node agents (one per hardware profile,
with faults injected) and the cluster service over the simulated cluster, every second; once
samples arrive, each panel query (Grafana variables filled in with real values) must return
data, or be listed in EXPECTED_EMPTY with the reason it is empty here. It evaluates the alert
rules too, so an alert can be checked against what the real agents expose.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.node.agent import NodeAgent
from exporter.node.serving import MetricsServer
from exporter.sim.demo_prometheus import start_prometheus
from tests.conftest import ServedCluster, free_port
from tests.deploy.test_dashboards import DEFAULTS, load, panel_queries, substitute
from tests.expositions import PROFILES, SPREAD_JOB, FaultyNode, simulated_world

pytestmark = pytest.mark.real_component
RULES = Path(__file__).resolve().parents[2] / "rules" / "topowatch-alerts.yaml"

# "dashboard: panel [refId]" -> why it has no data against this simulation
_NO_ELASTIC = (
    "the world here runs without elastic jobs (its placement scenario needs their capacity);"
    " these series are checked against the elastic world in test_dashboards and test_elastic"
)
EXPECTED_EMPTY = {
    "health-remediation: Actions [A]": (
        "the controller runs in observe mode here: it decides and audits, nothing is acted on"
    ),
    "topology-placement: Workloads pending on topology [A]": (
        "the simulated Kueue now follows flavorassigner.go: in this world every job is admitted"
        " or waits on quota; tests/cluster covers the topology-pending series"
    ),
    **{
        f"task-governance: {panel}": _NO_ELASTIC
        for panel in (
            "Elastic job size vs bounds [A]",
            *(f"Elastic jobs now [{ref}]" for ref in "ABCDE"),
            "Scale events by direction and cause [A]",
            "Scale-up failures by phase [A]",
            "GPU-hours absorbed by elastic jobs per team [A]",
        )
    },
}


class ServedNode:
    """A faulty simulated node behind a real node agent (poll thread + HTTP server)."""

    def __init__(self, profile: str, name: str) -> None:
        self.name = name
        self.faulty = FaultyNode(profile, name, start=time.time(), clock=time.time)
        self.agent = NodeAgent(self.faulty.poller, interval=0.5)
        self.agent.poll_once()
        self.agent.start()
        self.server = MetricsServer(self.agent, "127.0.0.1", 0)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.agent.stop()
        self.faulty.close()


def write_config(directory: Path, nodes: list[str], cluster: str) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "topowatch-node", "static_configs": [{"targets": nodes}]},
            {"job_name": "topowatch-cluster", "static_configs": [{"targets": [cluster]}]},
        ],
    }
    path = directory / "prometheus.yml"
    path.write_text(json.dumps(config))  # YAML is a superset of JSON
    return path


class Prometheus:
    """Queries a running `prometheus` process over its HTTP API."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    @classmethod
    def launch(cls, config: Path, data: Path) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus missing: run scripts/bootstrap.sh (Debian package prometheus)")
        port = free_port()
        log = data / "prometheus.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        return cls(proc, port, log)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-2000:]}"
            try:
                if self.query(expr):
                    return
            except (urllib.error.URLError, ConnectionError):
                pass  # not listening yet
            time.sleep(0.25)
        pytest.fail(f"timed out waiting for {what}:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, str]]:
    world = simulated_world()
    nodes = [ServedNode(profile, world.node_name(profile)) for profile in PROFILES]
    cluster = ServedCluster(world.service)
    directory = tmp_path_factory.mktemp("prometheus")
    config = write_config(
        directory,
        [f"127.0.0.1:{n.server.port}" for n in nodes],
        f"127.0.0.1:{cluster.port}",
    )
    prometheus = Prometheus.launch(config, directory)
    try:
        # discovery hands targets over after ~5 s; then two scrapes give rate() its two points
        prometheus.wait_for('count(up{job=~"topowatch-.*"} == 1) == 3', 20, "all three targets")
        prometheus.wait_for(
            "count(count_over_time(topowatch_gpus[1m]) >= 3) == 2", 10, "three node scrapes"
        )
        yield prometheus, nodes[0].name
    finally:
        prometheus.stop()
        cluster.stop()
        for n in nodes:
            n.stop()


def test_every_panel_query_returns_data_from_a_real_prometheus(
    stack: tuple[Prometheus, str],
) -> None:
    prometheus, node = stack
    values = {**DEFAULTS, "node": node}
    empty, unexpectedly_full, evaluated = [], [], 0
    for name, model in load().items():
        for where, expr in panel_queries(model):
            key = f"{name}: {where}"
            result = prometheus.query(substitute(expr, values))
            evaluated += 1
            if key in EXPECTED_EMPTY:
                if result:
                    unexpectedly_full.append(key)
            elif not result:
                empty.append(f"{key}: {substitute(expr, values)}")
    assert evaluated > 60
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not unexpectedly_full, f"listed as expected-empty but have data: {unexpectedly_full}"


def test_injected_faults_show_on_the_dashboards_as_an_operator_would_see_them(
    stack: tuple[Prometheus, str],
) -> None:
    prometheus, node = stack
    down = prometheus.query(f'topowatch_nvlink_up{{node="{node}"}} == 0')
    assert {(s["metric"]["gpu"], s["metric"]["link"]) for s in down} == {("0", "3")}
    xids = prometheus.query(f'sum by (xid) (topowatch_xid_errors_total{{node="{node}"}})')
    assert [s["metric"]["xid"] for s in xids] == ["79"]
    # the sick node the controller saw: XID 79's first ladder step is a reboot (RESTART_BM)
    requesting = prometheus.query('topowatch_remediation_nodes_requesting{action="reboot"}')
    assert [s["value"][1] for s in requesting] == ["1"]
    unmet = prometheus.query("topowatch_workload_topology_satisfied == 0")
    assert [s["metric"]["workload"].startswith(f"job-{SPREAD_JOB}-") for s in unmet] == [True]


def test_the_xid_alert_is_keyed_on_the_gpu_and_names_the_pod_that_held_it(
    stack: tuple[Prometheus, str],
) -> None:
    """Each simulated node had XID 79 on GPU 3: one alert per (node, gpu, xid), without the
    scrape's job/instance, naming the pod that held the GPU at the XID (here: still holds it)."""
    prometheus, node = stack
    firing = 'ALERTS{alertname="TopowatchXidNodeRestartRequired",alertstate="firing"}'
    prometheus.wait_for(firing, 10, "the XID 79 alert")
    alerts = [a["metric"] for a in prometheus.query(firing)]
    keys = sorted((a["node"], a["gpu"], a["xid"]) for a in alerts)
    assert keys == sorted((n, "3", "79") for n in {a["node"] for a in alerts})
    assert len(keys) == len(PROFILES)
    (mine,) = [a for a in alerts if a["node"] == node]
    assert "instance" not in mine and "job" not in mine
    (holder,) = prometheus.query(f'topowatch_gpu_up{{node="{node}",gpu="3"}}')
    assert mine["pod"] and mine["pod"] == holder["metric"]["pod"]
    assert (mine["namespace"], mine["container"]) == (
        holder["metric"]["namespace"],
        holder["metric"]["container"],
    )


def test_the_demo_prometheus_scrapes_what_it_is_given_and_cleans_up(tmp_path: Path) -> None:
    node = ServedNode("p5.48xlarge", "demo-node-1")
    cluster = ServedCluster(simulated_world().service)
    port = free_port()
    out = io.StringIO()
    running = start_prometheus(
        port, f"127.0.0.1:{cluster.port}", [f"127.0.0.1:{node.server.port}"], out
    )
    try:
        assert running is not None, out.getvalue()
        assert f"http://127.0.0.1:{port}" in out.getvalue()
        check = subprocess.run(
            ["promtool", "check", "config", str(running.directory / "prometheus.yml")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        # the same URL the demo prints answers, and both jobs are scraped
        prometheus = Prometheus(running.proc, port, running.directory / "prometheus.log")
        prometheus.wait_for('count(up{job=~"topowatch-.*"} == 1) == 2', 20, "demo targets up")
    finally:
        if running is not None:
            running.stop()
        cluster.stop()
        node.stop()
    assert running.proc.returncode is not None and not running.directory.exists()


def test_the_demo_says_in_one_line_when_prometheus_cannot_run() -> None:
    out = io.StringIO()
    assert start_prometheus(9, "127.0.0.1:1", [], out, binary="no-such-prometheus") is None
    assert out.getvalue().count("\n") == 1 and "not installed" in out.getvalue()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = io.StringIO()
        assert start_prometheus(taken.getsockname()[1], "127.0.0.1:1", [], out) is None
    assert out.getvalue().count("\n") == 1 and "taken" in out.getvalue()
