"""Small builders shared by every dashboard, so the six read alike: one Prometheus datasource
variable, a `cluster` filter that matches series without the label, panels bound to that
datasource, and links that carry the datasource and time range along."""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders.common import ReduceDataOptions
from grafana_foundation_sdk.models.common import VizOrientation
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

TAG = "topowatch"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every query filters on it; "All" is ".*", which also matches series that carry no cluster
# label (a single-cluster Prometheus), so one dashboard serves both set-ups.
CLUSTER = 'cluster=~"$cluster"'
CARRY = "${datasource:queryparam}&${cluster:queryparam}&${__url_time_range}"

UIDS = {
    "fleet": "topowatch-fleet",
    "node": "topowatch-node-hardware",
    "topology": "topowatch-topology",
    "governance": "topowatch-task-governance",
    "health": "topowatch-health",
    "quota": "topowatch-quota-planning",
    "goodput": "topowatch-goodput",
}


def dashboard(key: str, title: str, description: str, tags: list[str]) -> db.Dashboard:
    """A dashboard with the fixed uid for `key`, the datasource and cluster variables, and a
    dropdown to every other topowatch dashboard."""
    return (
        db.Dashboard(title)
        .uid(UIDS[key])
        .description(description)
        .tags([TAG, *tags])
        .time("now-1h", "now")
        .refresh("30s")
        .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            query_variable("cluster", "label_values(topowatch_node_topology_info, cluster)")
        )
        .link(
            db.DashboardLink("topowatch")
            .type(DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(False)
            .keep_time(True)
        )
    )


def query_variable(
    name: str, query: str, label: str | None = None, include_all: bool = True, multi: bool = False
) -> db.QueryVariable:
    variable = (
        db.QueryVariable(name)
        .label(label or name)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    return variable.all_value(".*") if include_all else variable


def link_to(key: str, title: str, params: str = "") -> db.DashboardLink:
    """A link to another topowatch dashboard by uid; `params` adds var-... (data links may use
    ${__data.fields.X})."""
    extra = f"&{params}" if params else ""
    return (
        db.DashboardLink(title).type(DashboardLinkType.LINK).url(f"/d/{UIDS[key]}?{CARRY}{extra}")
    )


def query(expr: str, legend: str = "", instant: bool = False) -> prom.Dataquery:
    q = prom.Dataquery().expr(expr).legend_format(legend or "__auto")
    return q.instant().format(PromQueryFormat.TABLE) if instant else q.range()


def series(
    title: str, description: str, unit: str, *queries: prom.Dataquery, width: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def single(
    title: str, description: str, expr: str, unit: str = "short", width: int = 4
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(query(expr, instant=True).format(PromQueryFormat.TIME_SERIES))
    )


def bars(
    title: str, description: str, expr: str, legend: str, unit: str = "short", width: int = 12
) -> bargauge.Panel:
    """Horizontal bars, one per series of an instant query (e.g. a total over $__range by a
    label), named by `legend`."""
    return (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .orientation(VizOrientation.HORIZONTAL)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(query(expr, legend, instant=True).format(PromQueryFormat.TIME_SERIES))
    )


def grid(
    title: str,
    description: str,
    *queries: prom.Dataquery,
    links: list[db.DashboardLink] | None = None,
    width: int = 12,
    hide: list[str] | None = None,
    rename: dict[str, str] | None = None,
) -> table.Panel:
    """A table of instant queries; several queries are merged on their shared labels. `hide`
    drops more columns (e.g. "Value" where the labels are the answer); `rename` gives columns
    headers (e.g. "Value #A", the first query's, a name)."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
    )
    for q in queries:
        panel = panel.with_target(q)
    panel = panel.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    panel = panel.with_transformation(
        DataTransformerConfig(
            id_val="organize",
            options={
                "excludeByName": {
                    "Time": True,
                    "__name__": True,
                    "job": True,
                    **dict.fromkeys(hide or [], True),
                },
                **({"renameByName": rename} if rename else {}),
            },
        )
    )
    if links:
        panel = panel.data_links(list(links))
    return panel
