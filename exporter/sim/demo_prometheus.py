"""A Prometheus for `topowatch demo`, so a newcomer can point Grafana at it and see every
dashboard alive, and see the project's alert rules (rules/topowatch-alerts.yaml) evaluated:
an injected fault fires its alert at /classic/alerts, and `AlertSummary` prints a line when an
alert starts firing or resolves. Optional: when the binary is missing or the port is taken, the
demo says so in one line and carries on without it."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger(__name__)

DEFAULT_PORT = 9090
# The dashboards' "Exporters up" panel selects jobs whose name contains "topowatch".
CLUSTER_JOB = "topowatch-cluster"
NODE_JOB = "topowatch-node"
# The project's alert rules, from the source tree (`pip install -e .`, scripts/run.sh); a
# wheel does not carry them, and the demo then says so.
RULES = Path(__file__).resolve().parents[2] / "rules" / "topowatch-alerts.yaml"
DEFAULT_INTERVAL_S = 5.0  # scrape and rule evaluation


def prometheus_config(
    cluster_target: str,
    node_targets: Sequence[str],
    interval_s: float = DEFAULT_INTERVAL_S,
    rule_files: Sequence[str] = (),
) -> str:
    """prometheus.yml scraping the cluster service and every node agent (host:port each) and
    evaluating `rule_files`. JSON is valid YAML, and needs no YAML writer."""
    interval = f"{interval_s:g}s"
    jobs = [{"job_name": CLUSTER_JOB, "static_configs": [{"targets": [cluster_target]}]}]
    if node_targets:
        jobs.append({"job_name": NODE_JOB, "static_configs": [{"targets": list(node_targets)}]})
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }
    if rule_files:
        config["rule_files"] = list(rule_files)
    return json.dumps(config, indent=2) + "\n"


def count_alerts(rules: Path) -> int:
    """How many alerting rules a rules file holds (its `- alert:` entries)."""
    return sum(1 for line in rules.read_text(encoding="utf-8").splitlines() if "- alert:" in line)


def _port_free(host: str, port: int) -> bool:
    """Whether Prometheus could listen there: as Go's listener does, SO_REUSEADDR, so the
    connections a Prometheus just stopped left in TIME_WAIT do not count as taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class DemoPrometheus:
    """The `prometheus` process and its scratch directory (config, TSDB, log)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], directory: Path, url: str, rules: int = 0
    ) -> None:
        self.proc = proc
        self.directory = directory
        self.url = url
        self.rules = rules  # alerting rules loaded from the project's rules file

    def api(self, path: str, timeout: float = 5.0) -> Any:
        """GET `path` of Prometheus' HTTP API (e.g. "/api/v1/alerts") and return its `data`;
        raises OSError (URLError included) or ValueError when there is no good answer."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            body = json.loads(response.read())
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ValueError(f"{path}: {str(body)[:200]}")
        return body.get("data")

    def terminate(self) -> None:
        """Ask Prometheus to exit (SIGTERM) and return at once: it shuts down while the caller
        stops everything else. `stop` then waits for it."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate Prometheus, give it `timeout` s to exit, else kill it; remove its
        directory (its TSDB included, so a kill loses nothing anyone will read)."""
        self.terminate()
        try:
            self.proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            log.warning("prometheus did not exit after SIGTERM; killing it")
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                log.error("prometheus (pid %d) survived SIGKILL for 5 s", self.proc.pid)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_prometheus(
    port: int,
    cluster_target: str,
    node_targets: Sequence[str],
    out: TextIO,
    host: str = "127.0.0.1",
    binary: str = "prometheus",
    rules: Path | None = RULES,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> DemoPrometheus | None:
    """Start Prometheus on host:port scraping the demo every `interval_s` and evaluating the
    alert rules in `rules` (None: none), print its URL in one line; None (after one line
    saying why) when it cannot run."""
    path = shutil.which(binary)
    if path is None:
        print(
            "  prometheus:       not installed (install Debian's `prometheus` to get one"
            " scraping the demo for the dashboards)",
            file=out,
        )
        return None
    if not _port_free(host, port):
        print(
            f"  prometheus:       port {port} is taken; not started (--prometheus-port)",
            file=out,
        )
        return None
    directory = Path(tempfile.mkdtemp(prefix="topowatch-demo-prometheus-"))
    rule_files: list[str] = []
    alerts = 0
    if rules is not None and rules.is_file():
        shutil.copyfile(rules, directory / rules.name)  # the config stands on its own
        rule_files.append(rules.name)
        alerts = count_alerts(rules)
    config = directory / "prometheus.yml"
    config.write_text(
        prometheus_config(cluster_target, node_targets, interval_s, rule_files), encoding="utf-8"
    )
    with (directory / "prometheus.log").open("wb") as log:
        try:
            proc = subprocess.Popen(
                [
                    path,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'tsdb'}",
                    f"--web.listen-address={host}:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            print(f"  prometheus:       could not start ({exc})", file=out)
            return None
    url = f"http://{host}:{port}"
    if rule_files:
        loaded = f"{alerts} alert rules from {rules.name if rules else ''}: {url}/classic/alerts"
    else:
        loaded = f"no alert rules: {rules or 'none given'} not found"
    print(
        f"  prometheus:       {url} ({loaded}; add it to Grafana and import dashboards/*.json)",
        file=out,
    )
    return DemoPrometheus(proc, directory, url, alerts)


class AlertSummary:
    """Prints a line when an alert starts firing (and when it resolves), from Prometheus'
    /api/v1/alerts, every `interval` s on its own thread until `stop`."""

    def __init__(self, prometheus: DemoPrometheus, out: TextIO, interval: float = 5.0) -> None:
        self.prometheus = prometheus
        self.out = out
        self.interval = interval
        self.firing: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AlertSummary:
        self._thread = threading.Thread(target=self._run, name="demo-alerts", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                lines = self.poll()
            except (OSError, ValueError) as exc:  # Prometheus starting, or gone: try again
                log.debug("alerts not read: %s", exc)
                continue
            for line in lines:
                print(line, file=self.out)
            if lines:
                self.out.flush()

    def poll(self) -> list[str]:
        """Read the alerts once; the lines for those that started firing or resolved since."""
        data = self.prometheus.api("/api/v1/alerts")
        now: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        for alert in data.get("alerts", []) if isinstance(data, dict) else []:
            if not isinstance(alert, dict) or alert.get("state") != "firing":
                continue
            raw = alert.get("labels")
            labels: dict[str, Any] = raw if isinstance(raw, dict) else {}
            annotations = alert.get("annotations")
            summary = annotations.get("summary", "") if isinstance(annotations, dict) else ""
            name = str(labels.get("alertname", "?"))
            key = (name, tuple(sorted((str(k), str(v)) for k, v in labels.items())))
            severity = labels.get("severity")
            now[key] = f"{name}{f' ({severity})' if severity else ''}: {summary}".rstrip(": ")
        lines = [
            f"  alert firing:     {text}" for key, text in now.items() if key not in self.firing
        ]
        lines += [
            f"  alert resolved:   {text}" for key, text in self.firing.items() if key not in now
        ]
        self.firing = now
        return lines
