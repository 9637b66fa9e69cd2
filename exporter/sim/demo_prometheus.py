"""A Prometheus for `topowatch demo`, so a newcomer can point Grafana at it and see every
dashboard alive. Optional: when the binary is missing or the port is taken, the demo says so in
one line and carries on without it."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)

DEFAULT_PORT = 9090
# The dashboards' "Exporters up" panel selects jobs whose name contains "topowatch".
CLUSTER_JOB = "topowatch-cluster"
NODE_JOB = "topowatch-node"


def prometheus_config(
    cluster_target: str, node_targets: Sequence[str], interval_s: float = 5.0
) -> str:
    """prometheus.yml scraping the cluster service and every node agent (host:port each).
    JSON is valid YAML, and needs no YAML writer."""
    interval = f"{interval_s:g}s"
    jobs = [{"job_name": CLUSTER_JOB, "static_configs": [{"targets": [cluster_target]}]}]
    if node_targets:
        jobs.append({"job_name": NODE_JOB, "static_configs": [{"targets": list(node_targets)}]})
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }
    return json.dumps(config, indent=2) + "\n"


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class DemoPrometheus:
    """The `prometheus` process and its scratch directory (config, TSDB, log)."""

    def __init__(self, proc: subprocess.Popen[bytes], directory: Path, url: str) -> None:
        self.proc = proc
        self.directory = directory
        self.url = url

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
) -> DemoPrometheus | None:
    """Start Prometheus on host:port scraping the demo, print its URL; None (after one line
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
    config = directory / "prometheus.yml"
    config.write_text(prometheus_config(cluster_target, node_targets), encoding="utf-8")
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
    print(f"  prometheus:       {url} (add it to Grafana and import dashboards/*.json)", file=out)
    return DemoPrometheus(proc, directory, url)
