"""HyperPod's observability add-on, run as its users run it, against topowatch in compat mode.

The add-on's own dashboards and alert rules (tests/fixtures/hyperpod-addon, source and commit in
its README) are evaluated by the Debian `prometheus` binary, which scrapes two simulated p5 nodes
served by real node agents with `--compat dcgm,efa`: one healthy, one with a hot GPU, a
double-bit ECC error, a flapping NVLink, an XID, a failed row remap and a lost GPU. The scrape
job is the documented one (docs/hyperpod-exporters.md: instance = node name,
cluster_id/cluster_name, honor_labels); a kube-state-metrics target serves
`kube_node_info`/`kube_pod_info` in KSM's format for the two nodes' pods, because the add-on's
variables and its per-task joins read them.

Grafana's part is done the way Grafana does it: each variable resolved in order from
`label_values(...)` against this Prometheus ("All" taking the variable's allValue), the built-ins
($__rate_interval = max($__interval + scrape interval, 4 x scrape interval)) filled in, hidden
targets skipped, instant targets queried at one instant and the others over a range.

Every target that reads a GPU or EFA exporter's metric must return data. A target reading only
other exporters' metrics is out of scope and listed by source below; a name no source here
claims fails the test, so nothing slips out of scope unseen. Where a panel stays empty because of
the dashboard itself, DASHBOARD_BUGS says why; no data is faked for it.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from exporter.core.snapshot import PodRef
from exporter.node.agent import NodeAgent
from exporter.node.poller import Poller
from exporter.node.serving import MetricsServer
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from tests.deploy.test_chart import readme_scrape_config
from tests.deploy.test_dashboards import substitute
from tests.deploy.test_prometheus_e2e import Prometheus

pytestmark = pytest.mark.real_component

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hyperpod-addon"
FAULTY = "hyperpod-i-0a1b2c3d4e5f60718"
HEALTHY = "hyperpod-i-0f1e2d3c4b5a69788"
FAULTS = (
    "thermal@gpu1",  # 92 C and clocks held down: temperature alerts, thermal violation time
    "ecc-dbe@gpu2",  # double-bit ECC error, and the row remapped for it
    "nvlink-crc@gpu3:link4",  # CRC errors, replays and recoveries on one link
    "xid=48@gpu0",  # an XID (48: double-bit ECC error)
    "remap-failure@gpu6",  # row remapping failed
    "gpu-lost@gpu5",  # fell off the bus: one GPU fewer than eight
)
SCRAPE_INTERVAL_S = 1
# Grafana's built-ins for a 1 s scrape interval and a 30 s panel range: $__interval is the
# scrape interval (Grafana's floor), $__rate_interval = max(1 s + 1 s, 4 x 1 s).
BUILTINS = {"__interval": "1s", "__rate_interval": "4s", "__range": "30s"}
RANGE_S = 30

# The metrics each out-of-scope source provides, by name prefix. A target is in scope when it
# reads any DCGM_FI_* (dcgm-exporter) or node_amazonefa_* (EFA exporter) name.
IN_SCOPE = ("DCGM_FI_", "node_amazonefa_")
OTHER_SOURCES = {
    "node_": "node_exporter",
    "process_": "node_exporter",  # its own process, in the cluster board's "Node Exporter" row
    "kube_": "kube-state-metrics",
    "kubelet_": "kubelet",
    "container_": "cAdvisor",
    "up": "Prometheus itself",
    "hyperpod_training_operator_": "HyperPod training operator",
    "training_": "HyperPod training operator",
    "model_": "SageMaker inference model server",
    "tgi_": "Text Generation Inference",
    "TokenLatency_": "LMI (DJL) inference server",
    "TokenThroughput_": "LMI (DJL) inference server",
    "OutputTokens_": "LMI (DJL) inference server",
    "RollingBatchSize_": "LMI (DJL) inference server",
    "fsx_": "FSx for Lustre exporter",
}

# "dashboard: panel [refId] (selection)" -> why the dashboard itself leaves it empty
DASHBOARD_BUGS = {
    "cluster: Row Remap Failure [A] (all hosts)": (
        "`DCGM_FI_DEV_ROW_REMAP_FAILURE > 1`: the field is 0 or 1 (dcgm-exporter's CSV: 'Whether"
        " remapping of rows has failed'), so no GPU can pass > 1; `> 0` was meant"
    ),
    "cluster: Row Remap Failure [A] (one host)": "the same `> 1` on a 0/1 gauge",
    "cluster: EFA Packets [B] (all hosts)": (
        '`instance="$hostname"` with `=` where the row\'s other targets use `=~`: with "All"'
        ' selected Grafana puts in the allValue ".*", which `=` compares literally'
    ),
}

# The add-on's alerts that read GPU metrics: which (GPU, state) each must reach on the faulty
# node within the test, and nothing anywhere else. `for: 5m` would take the test five minutes:
# that alert must be pending (its expression true on every evaluation since the fault), and
# the `for: 1m` ones firing.
EXPECTED_ALERTS = {
    ("GPUHighTemperature", "1"): "pending",
    ("GPUCriticalTemperature", "1"): "firing",
    ("GPUThermalViolation", "1"): "firing",
    ("GPUMemoryErrorDetected", "2"): "firing",
    ("NVLinkErrorsDetected", "3"): "firing",
    ("GPUXidError", "0"): "firing",
}
OUT_OF_SCOPE_ALERTS = {
    "MIGConfigFailure": "kubelet",  # the GPU operator's MIG manager's label on kubelet_node_name
    "NodeDiskSpaceWarning": "node_exporter",
    "FsxLustreStorageWarning": "FSx for Lustre exporter",
}


def load_dashboards() -> dict[str, dict[str, Any]]:
    dashboards: dict[str, dict[str, Any]] = json.loads((FIXTURES / "dashboards.json").read_text())
    return dashboards


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """Grafana's interpolation, with this Prometheus' scrape interval in the built-ins."""
    return substitute(text, values, BUILTINS)


def metric_names(expr: str) -> set[str]:
    """Every metric a query reads, `{__name__=~"..."}` selectors included."""
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def source_of(name: str) -> str | None:
    """None for a GPU/EFA exporter's metric, else the source that provides it."""
    if name.startswith(IN_SCOPE):
        return None
    for prefix, source in OTHER_SOURCES.items():
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return source
    raise AssertionError(f"{name}: no source claims this metric; add it to OTHER_SOURCES")


class AddonNode:
    """A simulated p5 node behind a real node agent serving `--compat dcgm,efa`."""

    def __init__(self, name: str, faults: tuple[str, ...], seed: int, first_worker: int) -> None:
        self.name = name
        self.node = SimulatedNode(
            get_profile("p5.48xlarge"), parse_faults(faults), seed=seed, start=time.time()
        )
        # one job over both nodes: pod names are unique in the namespace, as in a cluster
        held = self.node.pods.gpu_assignments()
        self.node.pods.set(
            {
                uuid: PodRef(
                    pod.namespace, f"llama-pretrain-worker-{first_worker + i // 4}", pod.container
                )
                for i, (uuid, pod) in enumerate(held.items())
            }
        )
        self.sources = self.node.sources()
        poller = Poller(name, self.sources, compat=frozenset({"dcgm", "efa"}), clock=time.time)
        self.agent = NodeAgent(poller, interval=0.5)
        self.agent.poll_once()
        self.agent.start()
        self.server = MetricsServer(self.agent, "127.0.0.1", 0)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def pods(self) -> list[PodRef]:
        return sorted(set(self.node.pods.gpu_assignments().values()), key=lambda p: p.pod)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.agent.stop()
        self.sources.close()
        self.node.close()


def kube_state_metrics(nodes: list[AddonNode]) -> bytes:
    """kube_node_info and kube_pod_info as kube-state-metrics exposes them (its label set)."""
    lines = [
        "# HELP kube_node_info Information about a cluster node.",
        "# TYPE kube_node_info gauge",
    ]
    for i, n in enumerate(nodes):
        lines.append(
            f'kube_node_info{{node="{n.name}",internal_ip="10.1.0.{10 + i}",'
            'kernel_version="6.1.0",os_image="Amazon Linux 2023",'
            'container_runtime_version="containerd://1.7.27",kubelet_version="v1.31.7",'
            f'kubeproxy_version="deprecated",provider_id="aws:///us-east-2a/{n.name[9:]}",'
            f'pod_cidr="",system_uuid="ec2{i:029x}"}} 1'
        )
    lines += ["# HELP kube_pod_info Information about pod.", "# TYPE kube_pod_info gauge"]
    for i, n in enumerate(nodes):
        for j, pod in enumerate(n.pods):
            lines.append(
                f'kube_pod_info{{namespace="{pod.namespace}",pod="{pod.pod}",'
                f'uid="0000{i}{j}00-0000-4000-8000-000000000000",host_ip="10.1.0.{10 + i}",'
                f'pod_ip="10.1.{64 + i}.{j + 2}",node="{n.name}",'
                'created_by_kind="HyperPodPyTorchJob",created_by_name="llama-pretrain",'
                'priority_class="training-priority",host_network="false"} 1'
            )
    return ("\n".join(lines) + "\n").encode()


class StaticTarget:
    """A scrape target serving fixed exposition bytes."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(agents: list[AddonNode], ksm: StaticTarget, rules: Path) -> dict[str, Any]:
    """The documented job (docs/hyperpod-exporters.md), with the pods its pod discovery would
    find written out (Debian's Prometheus has no Kubernetes discovery); KSM gets the same cluster
    labels."""
    [job] = readme_scrape_config()["scrape_configs"]
    job = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    job["static_configs"] = [
        {
            "targets": [f"127.0.0.1:{a.server.port}"],
            "labels": {
                "__meta_kubernetes_pod_label_app_kubernetes_io_name": "topowatch",
                "__meta_kubernetes_pod_label_app_kubernetes_io_component": "node-agent",
                "__meta_kubernetes_pod_container_port_name": "metrics",
                "__meta_kubernetes_pod_node_name": a.name,
            },
        }
        for a in agents
    ]
    cluster_labels = [
        r for r in job["relabel_configs"] if r.get("target_label") in ("cluster_id", "cluster_name")
    ]
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": "1s",
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            job,
            {
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{ksm.port}"]}],
                "relabel_configs": cluster_labels,
            },
        ],
    }


class Grafana:
    """Grafana's side of a panel: variables resolved against Prometheus, then the query."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.prometheus = prometheus

    def api(self, path: str, params: list[tuple[str, str]]) -> Any:
        url = f"http://127.0.0.1:{self.prometheus.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def label_values(self, query: str) -> list[str]:
        """`label_values(selector, label)` or `label_values(label)`, as Grafana asks for it."""
        match = re.fullmatch(r"label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)", query.strip())
        assert match, query
        selector, label = match.groups()
        if selector is None:
            values: list[str] = self.api(f"/api/v1/label/{label}/values", [])
            return sorted(values)
        series = self.api("/api/v1/series", [("match[]", selector)])
        return sorted({s[label] for s in series if s.get(label)})

    def variables(self, dashboard: Mapping[str, Any], chosen: Mapping[str, str]) -> dict[str, str]:
        """Each variable in order: the chosen value, else "All" (allValue, or every value as a
        regex alternation) where the variable offers it, else its first value. Variables of
        other datasources (the FSx board's CloudWatch `regions()`) are not Prometheus'."""
        values: dict[str, str] = {}
        for var in dashboard["variables"]:
            name, kind, query = var["name"], var["type"], var.get("query") or ""
            if kind == "datasource":
                continue
            if name in chosen:
                values[name] = chosen[name]
            elif kind == "constant":
                values[name] = query
            elif kind == "custom":
                options = var.get("options") or [
                    option.split(" : ")[-1].strip() for option in query.split(",")
                ]
                values[name] = interpolate(options[0], values)
            elif kind == "query" and query.startswith("label_values("):
                found = self.label_values(interpolate(query, values))
                if var.get("includeAll"):
                    all_values = "|".join(re.escape(v) for v in found)
                    values[name] = var.get("allValue") or f"({all_values})"
                else:
                    values[name] = found[0] if found else ""
        return values

    def has_data(self, target: Mapping[str, Any], values: Mapping[str, str]) -> bool:
        expr = interpolate(target["expr"], values)
        now = time.time()
        if target.get("instant"):
            result = self.api("/api/v1/query", [("query", expr), ("time", f"{now:.3f}")])
            return bool(result["result"])
        result = self.api(
            "/api/v1/query_range",
            [
                ("query", expr),
                ("start", f"{now - RANGE_S:.3f}"),
                ("end", f"{now:.3f}"),
                ("step", BUILTINS["__interval"]),
            ],
        )
        return any(series["values"] for series in result["result"])


@pytest.fixture(scope="module")
def addon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, float]]:
    nodes = [
        AddonNode(FAULTY, FAULTS, seed=0, first_worker=0),
        AddonNode(HEALTHY, (), seed=1, first_worker=2),
    ]
    ksm = StaticTarget(kube_state_metrics(nodes))
    directory = tmp_path_factory.mktemp("hyperpod-addon")
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(nodes, ksm, FIXTURES / "alert-rules.yaml")))
    started = time.monotonic()
    prometheus = Prometheus.launch(config, directory)
    try:
        prometheus.wait_for("count(up == 1) == 3", 30, "both agents and kube-state-metrics")
        # rate() over $__rate_interval (4 s) needs a few scrapes of each counter
        prometheus.wait_for(
            "count(count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 6) == 15", 30, "six scrapes"
        )
        yield prometheus, started
    finally:
        prometheus.stop()
        ksm.stop()
        for n in nodes:
            n.stop()


def targets(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for panel in dashboard["panels"]:
        if panel["datasource"] != "prometheus":
            continue
        for target in panel["targets"]:
            if "expr" in target and not target.get("hide"):
                yield f"{panel['title'].strip()} [{target['refId']}]", target


def test_every_gpu_and_efa_panel_of_the_addon_shows_data(addon: tuple[Prometheus, float]) -> None:
    prometheus, _ = addon
    grafana = Grafana(prometheus)
    dashboards = load_dashboards()
    empty: dict[str, str] = {}
    out_of_scope: dict[str, set[str]] = {}
    checked = 0
    for board, dashboard in dashboards.items():
        selections = {"all hosts": {}}
        if any(v["name"] == "hostname" for v in dashboard["variables"]):
            selections["one host"] = {"hostname": FAULTY}
        for selection, chosen in selections.items():
            values = grafana.variables(dashboard, chosen)
            for where, target in targets(dashboard):
                names = metric_names(interpolate(target["expr"], values))
                sources = {source_of(n) for n in names}
                if None not in sources:
                    out_of_scope.setdefault(", ".join(sorted(map(str, sources))), set()).add(
                        f"{board}: {where}"
                    )
                    continue
                checked += 1
                if not grafana.has_data(target, values):
                    empty[f"{board}: {where} ({selection})"] = target["expr"]
    assert checked >= 60  # the cluster board's GPU and EFA rows, the tasks board's GPU panels
    assert set(empty) == set(DASHBOARD_BUGS), json.dumps(
        {k: v for k, v in empty.items() if k not in DASHBOARD_BUGS}, indent=1
    )
    # what is left to other exporters, by source (docs/hyperpod-exporters.md lists the same)
    assert set(out_of_scope) == {
        "node_exporter",
        "kubelet",
        "Prometheus itself",
        "cAdvisor, kube-state-metrics",
        "HyperPod training operator",
        "SageMaker inference model server",
        "Text Generation Inference",
        "LMI (DJL) inference server",
    }, sorted(out_of_scope)


def test_the_addons_variables_resolve_to_the_nodes_and_gpus_topowatch_serves(
    addon: tuple[Prometheus, float],
) -> None:
    prometheus, _ = addon
    grafana = Grafana(prometheus)
    cluster = load_dashboards()["cluster"]
    values = grafana.variables(cluster, {})
    [job] = readme_scrape_config()["scrape_configs"]
    [cluster_id] = [
        r["replacement"] for r in job["relabel_configs"] if r.get("target_label") == "cluster_id"
    ]
    assert values["cluster_id"] == cluster_id
    # $gpu's choices come from DCGM_FI_DEV_GPU_TEMP's gpu label: "0".."7", as dcgm-exporter's
    gpus = grafana.label_values("label_values(DCGM_FI_DEV_GPU_TEMP,gpu)")
    assert gpus == [str(g) for g in range(8)]
    # the EFA panels' instance=~"$hostname" meets the node names kube_node_info lists
    hosts = grafana.label_values("label_values(kube_node_info,node)")
    assert grafana.label_values("label_values(node_amazonefa_info,instance)") == hosts
    assert grafana.label_values("label_values(DCGM_FI_DEV_GPU_TEMP,Hostname)") == hosts
    # honor_labels kept the workload's pod on its GPUs' series (not exported_pod)
    pods = grafana.label_values('label_values(DCGM_FI_DEV_GPU_UTIL{gpu="0"},pod)')
    assert pods == ["llama-pretrain-worker-0", "llama-pretrain-worker-2"]
    assert not grafana.label_values("label_values(exported_pod)")


def test_each_gpu_alert_of_the_addon_fires_for_its_fault_and_nowhere_else(
    addon: tuple[Prometheus, float],
) -> None:
    prometheus, started = addon
    grafana = Grafana(prometheus)
    rules = yaml.safe_load((FIXTURES / "alert-rules.yaml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    sources = {name: {source_of(n) for n in metric_names(expr)} for name, expr in exprs.items()}
    scoped = {name for name, found in sources.items() if None in found}
    assert scoped == {name for name, _ in EXPECTED_ALERTS}
    assert {name: ", ".join(map(str, sources[name])) for name in set(exprs) - scoped} == (
        OUT_OF_SCOPE_ALERTS
    )
    # Prometheus loaded every rule and evaluates each without error
    loaded = [r for g in grafana.api("/api/v1/rules", [])["groups"] for r in g["rules"]]
    assert {r["name"] for r in loaded} == set(exprs)
    assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]

    def states() -> dict[tuple[str, str, str], str]:
        alerts = grafana.api("/api/v1/alerts", [])["alerts"]
        return {
            (a["labels"]["alertname"], a["labels"].get("Hostname", ""), a["labels"]["gpu"]): a[
                "state"
            ]
            for a in alerts
            if a["labels"]["alertname"] in scoped
        }

    want = {(name, FAULTY, gpu): state for (name, gpu), state in EXPECTED_ALERTS.items()}
    deadline = started + 150  # `for: 1m` after the first samples, on two busy cores
    got = states()
    while got != want and time.monotonic() < deadline:
        time.sleep(1)
        got = states()
    assert got == want
    # each alert names the GPU of its node by the labels the add-on's descriptions use
    alerts = grafana.api("/api/v1/alerts", [])["alerts"]
    xid = next(a for a in alerts if a["labels"]["alertname"] == "GPUXidError")
    assert xid["labels"]["Hostname"] == FAULTY
    assert xid["labels"]["instance"] == FAULTY
    assert float(xid["value"]) == 48
