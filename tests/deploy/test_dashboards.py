"""The committed dashboards: regenerating them changes nothing, every query is PromQL that reads
series topowatch really exposes, and the dashboards hang together (unique uids, a Prometheus
datasource variable everywhere, links that land on a dashboard that exists)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from dashboards.boards import DASHBOARDS
from dashboards.generate import main as generate_main
from dashboards.generate import render
from tests.expositions import exposed_metric_names

DIR = Path(__file__).resolve().parents[2] / "dashboards"
# Series Prometheus makes itself for every target, not any exporter's.
PROMETHEUS_SERIES = frozenset({"up"})
# What Grafana puts in for its built-ins, and a plausible value for each dashboard variable.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
DEFAULTS = {
    "cluster": ".*",
    "node": "hyperpod-i-0123456789abcdef0",
    "gpu": ".*",
    "namespace": ".*",
    "team": ".*",
    "cluster_queue": ".*",
    "workload": ".*",
    "level": "network-node-layer-3",
    "flavor": ".*",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")
_UID_IN_URL = re.compile(r"^/d/([\w-]+)\?")


def load() -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(DIR.glob("*.json"))
    }


def substitute(expr: str, values: Mapping[str, str], builtins: Mapping[str, str] = BUILTINS) -> str:
    """Grafana's interpolation for the variables a dashboard defines (and its built-ins);
    anything else, like a regex back-reference "$1" in label_replace, is left alone."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        return values.get(name, match.group(0))

    return _VARIABLE.sub(one, expr)


def panel_queries(model: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title + refId, expr) for every query of every panel, rows' children included."""
    panels = list(model.get("panels", []))
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield f"{panel['title']} [{target['refId']}]", target["expr"]


def variable_selectors(model: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(variable name, the series selector inside its label_values(...) query)."""
    for variable in model["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"])
        assert match, f"variable {variable['name']}: not label_values(...): {variable['query']}"
        if match.group(1):
            yield variable["name"], match.group(1)


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr}"
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def links(model: Mapping[str, Any]) -> Iterator[str]:
    """Every URL in dashboard links and panel data links."""
    for link in model.get("links", []):
        if link.get("type") == "link":
            yield link["url"]
    for panel in model.get("panels", []):
        for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
            yield link["url"]


def all_expressions() -> Iterator[tuple[str, str]]:
    for name, model in load().items():
        for where, expr in panel_queries(model):
            yield f"{name}: {where}", substitute(expr, DEFAULTS)
        for variable, selector in variable_selectors(model):
            yield f"{name}: variable {variable}", substitute(selector, DEFAULTS)


def test_the_committed_json_is_what_the_generator_writes() -> None:
    assert sorted(p.stem for p in DIR.glob("*.json")) == sorted(DASHBOARDS)
    for name in DASHBOARDS:
        committed = (DIR / f"{name}.json").read_text(encoding="utf-8")
        assert committed == render(name), f"{name}.json is stale: run dashboards/generate.py"
    assert generate_main(["--check"]) == 0


def test_there_are_seven_dashboards_each_with_a_fixed_unique_uid_tags_and_a_datasource() -> None:
    models = load()
    assert len(models) == 7
    uids = [m["uid"] for m in models.values()]
    assert len(set(uids)) == 7 and all(uid.startswith("topowatch-") for uid in uids)
    for name, model in models.items():
        assert "topowatch" in model["tags"], name
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        for where, _ in panel_queries(model):
            assert where  # every panel has a title
        for panel in model["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_query_parses_as_promql() -> None:
    failures = []
    count = 0
    for where, expr in all_expressions():
        count += 1
        try:
            promql_parser.parse(expr)
        except Exception as exc:  # the parser raises ValueError-like errors from Rust
            failures.append(f"{where}: {expr!r}: {exc}")
    assert count > 60
    assert not failures, "\n".join(failures)


def test_every_metric_a_dashboard_reads_is_exposed_by_topowatch() -> None:
    exposed = exposed_metric_names() | PROMETHEUS_SERIES
    missing = {
        f"{where}: {name}"
        for where, expr in all_expressions()
        for name in metric_names(expr)
        if name not in exposed
    }
    assert not missing, "\n".join(sorted(missing))


def test_a_made_up_metric_would_be_caught() -> None:
    """The check above is only worth something if it can fail."""
    expr = substitute('rate(topowatch_gpu_made_up_total{node="$node"}[$__rate_interval])', {})
    assert metric_names(expr) == {"topowatch_gpu_made_up_total"}
    assert "topowatch_gpu_made_up_total" not in exposed_metric_names()
    with pytest.raises(Exception):  # noqa: B017 - the Rust parser's error type is not public
        promql_parser.parse("sum by (node (topowatch_gpus)")


def test_links_land_on_dashboards_that_exist_and_walk_workload_to_gpu() -> None:
    models = load()
    uids = {m["uid"]: name for name, m in models.items()}
    edges: set[tuple[str, str]] = set()
    for name, model in models.items():
        for url in links(model):
            match = _UID_IN_URL.match(url)
            assert match, f"{name}: link {url!r} is not a /d/<uid>? link"
            assert match.group(1) in uids, f"{name}: link to unknown uid {match.group(1)}"
            assert "${datasource:queryparam}" in url, f"{name}: link drops the datasource"
            edges.add((name, uids[match.group(1)]))
    # workload (placement) -> the nodes its pods run on -> one GPU of a node
    assert ("topology-placement", "node-hardware") in edges
    assert ("node-hardware", "node-hardware") in edges
    node_board = models["node-hardware"]
    urls = list(links(node_board))
    assert any("var-gpu=${__data.fields.gpu}" in url for url in urls)
    assert any(
        "var-namespace=${__data.fields.namespace}" in url
        for url in links(models["topology-placement"])
    )
    # every dashboard reaches the others through the tag dropdown
    for model in models.values():
        assert any(
            link["type"] == "dashboards" and link["tags"] == ["topowatch"]
            for link in model["links"]
        )


def test_variables_chain_a_node_to_its_gpus() -> None:
    variables = {v["name"]: v for v in load()["node-hardware"]["templating"]["list"]}
    assert '"$namespace"' in variables["node"]["query"]
    assert 'node="$node"' in variables["gpu"]["query"]
    assert variables["gpu"]["includeAll"] and variables["gpu"]["allValue"] == ".*"


# --- NVLink panels on Hopper and on GB200, evaluated by promtool --------------------------------

HOPPER = "hyperpod-i-0a1b2c3d4e5f60718"  # p5: the DL counters
GB200 = "hyperpod-i-0c3d4e5f607182930"  # p6e-gb200: NVLink5's counters, no DL ones
_SCRAPE = 'job="topowatch-node"'


def _link(node: str, gpu: int, link: int) -> str:
    return (
        f'{_SCRAPE},instance="{node}:9402",node="{node}",gpu="{gpu}",uuid="GPU-{gpu}",link="{link}"'
    )


def _gpu(node: str, gpu: int) -> str:
    return f'{_SCRAPE},instance="{node}:9402",node="{node}",gpu="{gpu}",uuid="GPU-{gpu}"'


# Counters every 15 s for 10 minutes; "0+N" grows N per sample, so N/15 per second.
NVLINK_SERIES = [
    # Hopper gpu1 link0: 30 CRC flit + 5 CRC data errors/s, a replay/s, a recovery every 15 s.
    (f"topowatch_nvlink_crc_flit_errors_total{{{_link(HOPPER, 1, 0)}}}", "0+450x40"),
    (f"topowatch_nvlink_crc_data_errors_total{{{_link(HOPPER, 1, 0)}}}", "0+75x40"),
    (f"topowatch_nvlink_replay_errors_total{{{_link(HOPPER, 1, 0)}}}", "0+15x40"),
    (f"topowatch_nvlink_recovery_errors_total{{{_link(HOPPER, 1, 0)}}}", "0+1x40"),
    # Hopper gpu1 link1: clean.
    (f"topowatch_nvlink_crc_flit_errors_total{{{_link(HOPPER, 1, 1)}}}", "0x40"),
    (f"topowatch_nvlink_crc_data_errors_total{{{_link(HOPPER, 1, 1)}}}", "0x40"),
    (f"topowatch_nvlink_replay_errors_total{{{_link(HOPPER, 1, 1)}}}", "0x40"),
    (f"topowatch_nvlink_recovery_errors_total{{{_link(HOPPER, 1, 1)}}}", "0x40"),
    # GB200 gpu0 link2: 50 packets in error/s, 2 malformed/s, a recovery every 15 s.
    (f"topowatch_nvlink_rx_errors_total{{{_link(GB200, 0, 2)}}}", "0+750x40"),
    (f"topowatch_nvlink_rx_malformed_packet_errors_total{{{_link(GB200, 0, 2)}}}", "0+30x40"),
    (f"topowatch_nvlink_rx_buffer_overrun_errors_total{{{_link(GB200, 0, 2)}}}", "0x40"),
    (f"topowatch_nvlink_rx_general_errors_total{{{_link(GB200, 0, 2)}}}", "0x40"),
    (f"topowatch_nvlink_link_recoveries_total{{{_link(GB200, 0, 2)}}}", "0+1x40"),
    # GB200 gpu0 link3: clean.
    (f"topowatch_nvlink_rx_errors_total{{{_link(GB200, 0, 3)}}}", "0x40"),
    (f"topowatch_nvlink_rx_malformed_packet_errors_total{{{_link(GB200, 0, 3)}}}", "0x40"),
    (f"topowatch_nvlink_rx_buffer_overrun_errors_total{{{_link(GB200, 0, 3)}}}", "0x40"),
    (f"topowatch_nvlink_rx_general_errors_total{{{_link(GB200, 0, 3)}}}", "0x40"),
    (f"topowatch_nvlink_link_recoveries_total{{{_link(GB200, 0, 3)}}}", "0x40"),
    # Fabric: GB200 gpu0 registered, gpu1 registration failed; Hopper reports none.
    (
        f'topowatch_gpu_fabric_info{{{_gpu(GB200, 0)},state="completed",status="NVML_SUCCESS",'
        'clique_id="7",cluster_uuid="1c7d2b0e-55aa-4e3c-9a61-2f0e8b7d4c11"}',
        "1x40",
    ),
    (
        f'topowatch_gpu_fabric_info{{{_gpu(GB200, 1)},state="completed",'
        'status="NVML_ERROR_INSUFFICIENT_RESOURCES",clique_id="0",'
        'cluster_uuid="00000000-0000-0000-0000-000000000000"}',
        "1x40",
    ),
    (f"topowatch_gpu_fabric_healthy{{{_gpu(GB200, 0)}}}", "1x40"),
    (f"topowatch_gpu_fabric_healthy{{{_gpu(GB200, 1)}}}", "0x40"),
    (f"topowatch_gpu_up{{{_gpu(GB200, 0)}}}", "1x40"),
    (f"topowatch_gpu_up{{{_gpu(GB200, 1)}}}", "1x40"),
    (f"topowatch_gpu_up{{{_gpu(HOPPER, 1)}}}", "1x40"),
]


def panel_expr(board: str, where: str, node: str) -> str:
    exprs = dict(panel_queries(load()[board]))
    return substitute(exprs[where], {**DEFAULTS, "node": node})


def promtool_evaluates(
    cases: list[dict[str, Any]], series: list[tuple[str, str]] | None = None
) -> None:
    """Run `promtool test rules` with promql_expr_test cases over `series` (NVLINK_SERIES
    unless given) at 5m."""
    import shutil
    import subprocess
    import tempfile

    import yaml

    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    doc = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in (series or NVLINK_SERIES)],
                "promql_expr_test": [{"eval_time": "5m", **case} for case in cases],
            }
        ],
    }
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "panels.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        result = subprocess.run(
            [binary, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 0, result.stdout + result.stderr


def test_nvlink_error_panels_read_both_hoppers_dl_counters_and_gb200s_nvlink5_counters() -> None:
    """GB200 has no CRC counters: a panel reading only them would be blank there."""
    errors = "NVLink errors [A]"
    second = "NVLink errors [B]"
    recoveries = "NVLink errors [C]"
    promtool_evaluates(
        [
            {
                "expr": panel_expr("node-hardware", errors, HOPPER),
                "exp_samples": [{"labels": '{gpu="1", link="0"}', "value": 35}],
            },
            {
                "expr": panel_expr("node-hardware", errors, GB200),
                "exp_samples": [{"labels": '{gpu="0", link="2"}', "value": 50}],
            },
            {
                "expr": panel_expr("node-hardware", second, HOPPER),
                "exp_samples": [{"labels": "{" + _link(HOPPER, 1, 0) + "}", "value": 1}],
            },
            {
                "expr": panel_expr("node-hardware", second, GB200),
                "exp_samples": [{"labels": "{" + _link(GB200, 0, 2) + "}", "value": 2}],
            },
            {
                "expr": panel_expr("node-hardware", recoveries, GB200),
                "exp_samples": [{"labels": '{gpu="0"}', "value": 1 / 15}],
            },
            {
                "expr": panel_expr("fleet", "NVLink error rate by node [A]", HOPPER),
                "exp_samples": [
                    {"labels": f'{{node="{HOPPER}"}}', "value": 35},
                    {"labels": f'{{node="{GB200}"}}', "value": 50},
                ],
            },
            {
                "expr": panel_expr("fleet", "NVLink error rate by node [C]", HOPPER),
                "exp_samples": [
                    {"labels": f'{{node="{HOPPER}"}}', "value": 1 / 15},
                    {"labels": f'{{node="{GB200}"}}', "value": 1 / 15},
                ],
            },
        ]
    )


def test_node_board_shows_each_gpus_fabric_and_counts_the_unhealthy_ones() -> None:
    fabric = "NVLink fabric [A]"
    promtool_evaluates(
        [
            {
                "expr": panel_expr("node-hardware", fabric, GB200),
                "exp_samples": [
                    {
                        "labels": '{gpu="0", state="completed", status="NVML_SUCCESS",'
                        ' clique_id="7", cluster_uuid="1c7d2b0e-55aa-4e3c-9a61-2f0e8b7d4c11"}',
                        "value": 1,
                    },
                    {
                        "labels": '{gpu="1", state="completed",'
                        ' status="NVML_ERROR_INSUFFICIENT_RESOURCES", clique_id="0",'
                        ' cluster_uuid="00000000-0000-0000-0000-000000000000"}',
                        "value": 1,
                    },
                ],
            },
            {  # a GPU that reports no fabric is listed as such, not left out
                "expr": panel_expr("node-hardware", fabric, HOPPER),
                "exp_samples": [{"labels": '{gpu="1", state="not reported"}', "value": 1}],
            },
            {
                "expr": panel_expr("node-hardware", "GPUs with an unhealthy fabric [A]", GB200),
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
            {
                "expr": panel_expr("node-hardware", "GPUs with an unhealthy fabric [A]", HOPPER),
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ]
    )


def _efa(node: str, device: str) -> str:
    return f'node="{node}",device="{device}"'


def _kernel(node: str, kind: str, pattern: str, severity: str, gpu: str, device: str) -> str:
    return (
        f'node="{node}",kind="{kind}",pattern="{pattern}",severity="{severity}",'
        f'gpu="{gpu}",device="{device}"'
    )


# A p5 node (15 s samples, read at 5m): rdmap16s27's ENA interface is down while the driver's
# port state says ACTIVE, as it always does; rdmap16s29's admin queue died; the kernel log has a
# fatal EFA driver line (at 150 s) and a hung task (at 30 s), and lost 4 records.
EFA_KERNEL_SERIES = [
    (f'topowatch_efa_port_up{{{_efa(HOPPER, "rdmap16s27")},port="1"}}', "1x20"),
    (f'topowatch_efa_netdev_up{{{_efa(HOPPER, "rdmap16s27")},interface="ens32"}}', "1x10 0x10"),
    (f'topowatch_efa_netdev_up{{{_efa(HOPPER, "rdmap48s27")},interface="ens40"}}', "1x20"),
    (
        f"topowatch_efa_netdev_carrier_changes_total{{{_efa(HOPPER, 'rdmap16s27')},"
        'interface="ens32"}',
        "2x10 3x10",
    ),
    (
        f"topowatch_efa_netdev_carrier_changes_total{{{_efa(HOPPER, 'rdmap48s27')},"
        'interface="ens40"}',
        "2x20",
    ),
    (f"topowatch_efa_no_completion_cmds_total{{{_efa(HOPPER, 'rdmap16s29')}}}", "0x10 1x10"),
    (f"topowatch_efa_no_completion_cmds_total{{{_efa(HOPPER, 'rdmap16s30')}}}", "0x20"),
    (
        "topowatch_kernel_log_events_total{"
        + _kernel(HOPPER, "efa_driver", "efa_device_reset_failed", "fatal", "", "rdmap16s29")
        + "}",
        "_x10 1x10",
    ),
    (
        "topowatch_kernel_log_last_event_timestamp_seconds{"
        + _kernel(HOPPER, "efa_driver", "efa_device_reset_failed", "fatal", "", "rdmap16s29")
        + "}",
        "_x10 150x10",
    ),
    (
        "topowatch_kernel_log_events_total{"
        + _kernel(HOPPER, "hung_task", "hung_task", "warning", "", "")
        + "}",
        "_x2 1x18",
    ),
    (
        "topowatch_kernel_log_last_event_timestamp_seconds{"
        + _kernel(HOPPER, "hung_task", "hung_task", "warning", "", "")
        + "}",
        "_x2 30x18",
    ),
]


def test_node_board_shows_efa_link_state_from_the_netdev_not_the_drivers_constant() -> None:
    """The efa driver reports every port ACTIVE: the board counts links down from the paired
    ENA interface, and stuck admin queues from no_completion_cmds."""
    promtool_evaluates(
        [
            {
                "expr": panel_expr("node-hardware", "EFA links down [A]", HOPPER),
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
            {
                "expr": panel_expr("node-hardware", "EFA admin queues stuck [A]", HOPPER),
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
            {  # a node with nothing wrong reads 0, not "no data"
                "expr": panel_expr("node-hardware", "EFA links down [A]", GB200),
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
            {
                "expr": panel_expr("node-hardware", "EFA link state [A]", HOPPER),
                "exp_samples": [
                    {"labels": '{device="rdmap16s27", interface="ens32"}', "value": 0},
                    {"labels": '{device="rdmap48s27", interface="ens40"}', "value": 1},
                ],
            },
            {
                "expr": panel_expr("node-hardware", "EFA link state [B]", HOPPER),
                "exp_samples": [
                    {"labels": '{device="rdmap16s27", interface="ens32"}', "value": 3},
                    {"labels": '{device="rdmap48s27", interface="ens40"}', "value": 2},
                ],
            },
        ],
        EFA_KERNEL_SERIES,
    )


def test_node_board_lists_the_latest_kernel_log_events() -> None:
    promtool_evaluates(
        [
            {
                "expr": panel_expr("node-hardware", "Latest kernel log events [A]", HOPPER),
                "exp_samples": [
                    {
                        "labels": '{kind="efa_driver", pattern="efa_device_reset_failed",'
                        ' severity="fatal", device="rdmap16s29"}',
                        "value": 1,
                    },
                    {
                        "labels": '{kind="hung_task", pattern="hung_task", severity="warning"}',
                        "value": 1,
                    },
                ],
            },
            {  # seconds since the latest line, at 300 s
                "expr": panel_expr("node-hardware", "Latest kernel log events [B]", HOPPER),
                "exp_samples": [
                    {
                        "labels": '{kind="efa_driver", pattern="efa_device_reset_failed",'
                        ' severity="fatal", device="rdmap16s29"}',
                        "value": 150,
                    },
                    {
                        "labels": '{kind="hung_task", pattern="hung_task", severity="warning"}',
                        "value": 270,
                    },
                ],
            },
        ],
        EFA_KERNEL_SERIES,
    )


# --- elastic jobs on the task-governance board ---------------------------------------------------

ELASTIC_FAMILIES = {
    "topowatch_elastic_job_replicas",
    "topowatch_elastic_scale_events_total",
    "topowatch_elastic_scale_failures_total",
    "topowatch_elastic_scale_up_phase_seconds_bucket",
    "topowatch_elastic_consecutive_scaling_failures",
    "topowatch_idle_gpu_seconds_total",
    "topowatch_elastic_absorbed_gpu_seconds_total",
}
# the families that carry cluster_queue, so the board's team-queue variable narrows them
ELASTIC_BY_QUEUE = {
    "topowatch_elastic_job_replicas",
    "topowatch_elastic_scale_events_total",
    "topowatch_elastic_scale_failures_total",
}


def row_panels(model: Mapping[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels of the row `title`: nested in it when collapsed, else those up to the next row."""
    panels = model["panels"]
    [start] = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title]
    if panels[start].get("panels"):
        return list(panels[start]["panels"])
    group = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        group.append(panel)
    return group


def selectors(expr: str) -> Iterator[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    yield from found


def test_governance_has_an_elastic_jobs_row_with_idle_gpu_hours_by_reason() -> None:
    from datetime import timedelta

    group = row_panels(load()["task-governance"], "Elastic jobs")
    assert group and all(p["description"] for p in group)
    # a range no other built-in uses, to tell $__range from $__rate_interval in the parse tree
    builtins = {**BUILTINS, "__range": "17m"}
    exprs = {
        f"{p['title']} [{t['refId']}]": substitute(t["expr"], DEFAULTS, builtins)
        for p in group
        for t in p["targets"]
    }
    assert set().union(*(metric_names(e) for e in exprs.values())) == ELASTIC_FAMILIES
    for where, expr in exprs.items():
        for selector in selectors(expr):
            labels = {m.name for m in selector.matchers.matchers}
            assert "cluster" in labels, where
            if selector.name in ELASTIC_BY_QUEUE:
                assert "cluster_queue" in labels, where

    hours = promql_parser.parse(exprs["Idle GPU-hours by reason [A]"])
    assert isinstance(hours, promql_parser.BinaryExpr) and str(hours.op) == "/"
    assert isinstance(hours.rhs, promql_parser.NumberLiteral) and hours.rhs.val == 3600
    total = hours.lhs
    assert isinstance(total, promql_parser.AggregateExpr) and str(total.op) == "sum"
    assert total.modifier is not None
    assert total.modifier.type == promql_parser.AggModifierType.By
    assert list(total.modifier.labels) == ["reason"]
    increase = total.expr
    assert isinstance(increase, promql_parser.Call) and increase.func.name == "increase"
    [window] = increase.args
    assert isinstance(window, promql_parser.MatrixSelector)
    assert window.vector_selector.name == "topowatch_idle_gpu_seconds_total"
    assert window.range == timedelta(minutes=17)  # $__range: GPU-hours over the dashboard's range


# Elastic series at 15 s, read at 5m, as the cluster service's scrape stores them (its own `job`
# label beside the series' `elastic_job`); 8 GPUs idle and claimable throughout.
_SERVICE = 'job="topowatch-cluster",instance="cluster:8080"'
ELASTIC_SERIES = [
    *(
        (
            f'topowatch_elastic_job_replicas{{{_SERVICE},elastic_job="llama",namespace="ns-a",'
            f'kind="HyperPodPyTorchJob",cluster_queue="cq-a",team="a",state="{state}"}}',
            f"{value}x20",
        )
        for state, value in [("min", 2), ("max", 8), ("target", 6), ("running", 4)]
    ),
    (
        f'topowatch_elastic_job_replicas{{{_SERVICE},elastic_job="bert",namespace="ns-b",kind="Job",'
        'cluster_queue="cq-b",team="b",state="running"}',
        "3x20",
    ),
    (
        f'topowatch_elastic_consecutive_scaling_failures{{{_SERVICE},elastic_job="llama",'
        'namespace="ns-a"}',
        "2x20",
    ),
    (
        f'topowatch_idle_gpu_seconds_total{{{_SERVICE},flavor="p5",domain="d1",reason="claimable"}}',
        "0+120x20",
    ),
]


def test_elastic_panels_name_each_job_and_count_idle_gpu_hours() -> None:
    exprs = dict(panel_queries(load()["task-governance"]))

    def expr(where: str, **builtins: str) -> str:
        return substitute(exprs[where], DEFAULTS, {**BUILTINS, **builtins})

    promtool_evaluates(
        [
            {
                "expr": expr("Elastic job size vs bounds [A]"),
                "exp_samples": [
                    {
                        "labels": f'{{namespace="ns-a", elastic_job="llama", state="{s}"}}',
                        "value": v,
                    }
                    for s, v in [("min", 2), ("max", 8), ("target", 6), ("running", 4)]
                ]
                + [
                    {
                        "labels": '{namespace="ns-b", elastic_job="bert", state="running"}',
                        "value": 3,
                    }
                ],
            },
            {
                "expr": expr("Elastic jobs now [E]"),
                "exp_samples": [{"labels": '{namespace="ns-a", elastic_job="llama"}', "value": 2}],
            },
            {  # 8 idle GPUs
                "expr": expr("Idle GPUs by reason [A]"),
                "exp_samples": [{"labels": '{reason="claimable"}', "value": 8}],
            },
            {  # 8 GPUs for the 4 minutes of the range: 32 GPU-minutes
                "expr": expr("Idle GPU-hours by reason [A]", __range="4m"),
                "exp_samples": [{"labels": '{reason="claimable"}', "value": 32 / 60}],
            },
        ],
        ELASTIC_SERIES,
    )
