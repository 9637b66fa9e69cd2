"""The seven topowatch dashboards. Each answers one question (docs/dashboards/index.md); every
query reads only series topowatch exposes (tests/deploy/test_dashboards.py checks that) plus
Prometheus' own `up`."""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.models.common import GraphDrawStyle, StackingMode
from grafana_foundation_sdk.models.dashboard import DynamicConfigValue

from dashboards.kit import (
    CLUSTER,
    bars,
    dashboard,
    grid,
    link_to,
    query,
    query_variable,
    series,
    single,
)

C = CLUSTER
RATE = "$__rate_interval"
# A GPU a finding names: component "gpu3" or "gpu3:link0" -> gpu="3".
FINDING_GPU = (
    f'label_replace(topowatch_health_finding{{{C}, severity=~"warning|critical|fatal"}} == 1,'
    ' "gpu", "$1", "component", "gpu([0-9]+).*")'
)
DEGRADED_GPUS = f"count(count by (node, gpu) ({FINDING_GPU}))"
TEAM_OF_NAMESPACE = '"team", "$1", "namespace", "hyperpod-ns-(.+)"'


# NVLink errors per link in whichever family the GPU exports (TopowatchNvlinkCrcErrorStorm's
# quantity): the DL CRC counters up to Hopper; NVLink5's packets received in error on Blackwell
# (GB200), where NVML has no DL counters. `by` the labels to keep; `sel` the selector.
def nvlink_errors(by: str, sel: str) -> str:
    return (
        f"sum by ({by}) (rate(topowatch_nvlink_crc_flit_errors_total{{{sel}}}[{RATE}])"
        f" + rate(topowatch_nvlink_crc_data_errors_total{{{sel}}}[{RATE}]))"
        f" or sum by ({by}) (rate(topowatch_nvlink_rx_errors_total{{{sel}}}[{RATE}]))"
    )


# Link recoveries (retraining) in either family: the DL recovery counter, NVLink5's recoveries.
def nvlink_recoveries(by: str, sel: str) -> str:
    return (
        f"sum by ({by}) (rate(topowatch_nvlink_recovery_errors_total{{{sel}}}[{RATE}]))"
        f" or sum by ({by}) (rate(topowatch_nvlink_link_recoveries_total{{{sel}}}[{RATE}]))"
    )


# An elastic job's series name it in `elastic_job`: Prometheus owns `job` (the scrape job).
def elastic_job(metric: str, sel: str) -> str:
    return f"{metric}{{{sel}}}"


def elastic_replicas(state: str, sel: str) -> str:
    """One column of the elastic jobs table: each job's replicas in `state`."""
    replicas = elastic_job("topowatch_elastic_job_replicas", f'{sel}, state="{state}"')
    return f"max by (namespace, elastic_job, kind, cluster_queue) ({replicas})"


TO_NODE = link_to(
    "node", "Node hardware for ${__data.fields.node}", "var-node=${__data.fields.node}"
)


def fleet() -> db.Dashboard:
    to_node = link_to(
        "node", "Node hardware for ${__data.fields.node}", "var-node=${__data.fields.node}"
    )
    return (
        dashboard(
            "fleet",
            "topowatch / Fleet",
            "Is the fleet healthy, who uses it, and which nodes need a reboot or replacement?",
            ["fleet"],
        )
        .with_variable(
            query_variable("team", f"label_values(topowatch_team_gpus{{{C}}}, team)", multi=True)
        )
        .link(link_to("health", "Health and remediation"))
        .with_row(db.Row("GPUs"))
        .with_panel(
            single(
                "GPUs healthy",
                "GPUs the node agents enumerate, less those named by an active warning or worse.",
                f"sum(topowatch_gpus{{{C}}}) - ({DEGRADED_GPUS} or vector(0))",
            )
        )
        .with_panel(
            single(
                "GPUs degraded",
                "GPUs with an active health finding of warning severity or worse.",
                f"{DEGRADED_GPUS} or vector(0)",
            )
        )
        .with_panel(
            single(
                "GPUs on nodes asking for action",
                "GPUs on nodes whose agent reports an actionable finding (reboot or replace).",
                f"sum(topowatch_gpus{{{C}}}"
                f" * on (node) (1 - topowatch_health_node_healthy{{{C}}}))",
            )
        )
        .with_panel(
            single(
                "Nodes in remediation",
                "Nodes the remediation controller is acting on right now.",
                f"sum(topowatch_remediation_nodes_active{{{C}}})",
            )
        )
        .with_panel(
            single(
                "Nodes pending reboot",
                "Nodes whose findings ask for a reboot.",
                f'sum(topowatch_remediation_nodes_requesting{{{C}, action="reboot"}})',
            )
        )
        .with_panel(
            single(
                "Nodes pending replacement",
                "Nodes whose findings ask for a replacement.",
                f'sum(topowatch_remediation_nodes_requesting{{{C}, action="replace"}})',
            )
        )
        .with_row(db.Row("Use by team"))
        .with_panel(
            series(
                "GPU utilization by team",
                "Mean GPU utilization of the GPUs each team's pods hold (team from the"
                " hyperpod-ns-<team> namespace).",
                "percentunit",
                query(
                    "avg by (team) (label_replace(topowatch_gpu_utilization_ratio"
                    f'{{{C}, namespace=~"hyperpod-ns-.+"}}, {TEAM_OF_NAMESPACE})'
                    ' and on (team) topowatch_team_gpus{state="nominal", team=~"$team"})',
                    "{{team}}",
                ),
            )
        )
        .with_panel(
            series(
                "GPUs used by team",
                "GPUs each team's admitted workloads hold (Kueue quota usage).",
                "short",
                query(
                    f'sum by (team) (topowatch_team_gpus{{{C}, state="used", team=~"$team"}})',
                    "{{team}}",
                ),
            )
        )
        .with_row(db.Row("Fabric errors"))
        .with_panel(
            series(
                "NVLink error rate by node",
                "Per second, summed over a node's links: errors (CRC flit + data up to Hopper;"
                " on GB200's NVLink5, packets received in error), replays (up to Hopper) and"
                " link recoveries (either).",
                "cps",
                query(nvlink_errors("node", C), "{{node}} errors"),
                query(
                    f"sum by (node) (rate(topowatch_nvlink_replay_errors_total{{{C}}}[{RATE}]))",
                    "{{node}} replay",
                ),
                query(nvlink_recoveries("node", C), "{{node}} recoveries"),
            )
        )
        .with_panel(
            series(
                "EFA error rate by node",
                "Retransmitted packets, receive drops and unresponsive-remote events per second.",
                "cps",
                query(
                    f"sum by (node) (rate(topowatch_efa_retrans_pkts_total{{{C}}}[{RATE}]))",
                    "{{node}} retrans",
                ),
                query(
                    f"sum by (node) (rate(topowatch_efa_rx_drops_total{{{C}}}[{RATE}]))",
                    "{{node}} drops",
                ),
                query(
                    "sum by (node) (rate(topowatch_efa_unresponsive_remote_events_total"
                    f"{{{C}}}[{RATE}]))",
                    "{{node}} unresponsive",
                ),
            )
        )
        .with_row(db.Row("Nodes and exporters"))
        .with_panel(
            grid(
                "Nodes with actionable findings",
                "Each row links to the node's hardware dashboard.",
                query(
                    "max by (node, check, component, action) "
                    f"(topowatch_health_finding_actionable{{{C}}} == 1)",
                    instant=True,
                ),
                links=[to_node],
            )
        )
        .with_panel(
            grid(
                "Exporters up",
                "Prometheus' `up` for every topowatch target, and seconds since each node"
                " agent's last successful poll.",
                query(f'up{{{C}, job=~".*topowatch.*"}}', instant=True),
                query(
                    "time() - max by (node) "
                    f"(topowatch_exporter_last_successful_poll_timestamp_seconds{{{C}}})",
                    instant=True,
                ),
            )
        )
    )


def node_hardware() -> db.Dashboard:
    n = f'{C}, node="$node"'
    g = f'{n}, gpu=~"$gpu"'
    same_gpu = link_to(
        "node", "Only GPU ${__data.fields.gpu}", "var-node=$node&var-gpu=${__data.fields.gpu}"
    )
    return (
        dashboard(
            "node",
            "topowatch / Node hardware",
            "What is wrong with this node's GPUs, NVLink, EFA, kernel log and NUMA placement?",
            ["node", "gpu"],
        )
        .with_variable(
            query_variable(
                "namespace",
                f"label_values(topowatch_gpu_up{{{C}}}, namespace)",
                label="pods of namespace",
            )
        )
        .with_variable(
            query_variable(
                "node",
                f'label_values(topowatch_gpu_up{{{C}, namespace=~"$namespace"}}, node)',
                include_all=False,
            )
        )
        .with_variable(
            query_variable("gpu", f"label_values(topowatch_gpu_up{{{n}}}, gpu)", multi=True)
        )
        .link(link_to("fleet", "Fleet"))
        .link(link_to("health", "Health of this node", "var-node=$node"))
        .with_row(db.Row("GPUs"))
        .with_panel(
            series(
                "GPU utilization",
                "Share of time a kernel ran.",
                "percentunit",
                query(f"topowatch_gpu_utilization_ratio{{{g}}}", "gpu{{gpu}}"),
                width=8,
            )
        )
        .with_panel(
            series(
                "GPU memory used",
                "Framebuffer memory in use.",
                "bytes",
                query(f"topowatch_gpu_memory_used_bytes{{{g}}}", "gpu{{gpu}}"),
                width=8,
            )
        )
        .with_panel(
            series(
                "Power",
                "Board power draw.",
                "watt",
                query(f"topowatch_gpu_power_watts{{{g}}}", "gpu{{gpu}}"),
                width=8,
            )
        )
        .with_panel(
            series(
                "Temperature",
                "GPU and HBM temperature.",
                "celsius",
                query(f"topowatch_gpu_temperature_celsius{{{g}}}", "gpu{{gpu}}"),
                query(f"topowatch_gpu_memory_temperature_celsius{{{g}}}", "gpu{{gpu}} memory"),
                width=8,
            )
        )
        .with_panel(
            series(
                "Clocks",
                "SM and memory clocks; an SM clock below its peak under load means throttling.",
                "hertz",
                query(f"topowatch_gpu_sm_clock_hertz{{{g}}}", "gpu{{gpu}} sm"),
                query(f"topowatch_gpu_memory_clock_hertz{{{g}}}", "gpu{{gpu}} memory"),
                width=8,
            )
        )
        .with_panel(
            grid(
                "Throttle reasons",
                "Clock event reasons active now (thermal, power, sync boost...).",
                query(
                    f"max by (gpu, reason) (topowatch_gpu_clock_event_reason{{{g}}} == 1)",
                    instant=True,
                ),
                width=8,
            )
        )
        .with_panel(
            grid(
                "ECC and row remapping",
                "Uncorrected ECC errors, rows remapped, a remap pending a reset, a remap failure.",
                query(
                    "sum by (gpu) (topowatch_gpu_ecc_errors_total"
                    f'{{{g}, type="uncorrected", scope="volatile"}})',
                    instant=True,
                ),
                query(f"sum by (gpu) (topowatch_gpu_remapped_rows_total{{{g}}})", instant=True),
                query(f"max by (gpu) (topowatch_gpu_remapped_rows_pending{{{g}}})", instant=True),
                query(f"max by (gpu) (topowatch_gpu_remapped_rows_failure{{{g}}})", instant=True),
                links=[same_gpu],
            )
        )
        .with_panel(
            grid(
                "XIDs",
                "XID errors since the agent started, with the catalogue's name and action; minutes"
                " since the last of each and the pod that held the GPU then (not necessarily the"
                " pod holding it now).",
                query(
                    f"sum by (gpu, xid, name, action) (topowatch_xid_errors_total{{{g}}})",
                    instant=True,
                ),
                query(
                    "(time() - max by (gpu, xid, name, action, namespace, pod)"
                    f" (topowatch_xid_last_event_timestamp_seconds{{{g}}})) / 60",
                    instant=True,
                ),
            )
        )
        .with_row(db.Row("NVLink"))
        .with_panel(
            series(
                "NVLink throughput",
                "Bytes per second per GPU, all links.",
                "Bps",
                query(
                    f"sum by (gpu) (rate(topowatch_nvlink_tx_bytes_total{{{g}}}[{RATE}]))",
                    "gpu{{gpu}} tx",
                ),
                query(
                    f"sum by (gpu) (rate(topowatch_nvlink_rx_bytes_total{{{g}}}[{RATE}]))",
                    "gpu{{gpu}} rx",
                ),
            )
        )
        .with_panel(
            series(
                "NVLink errors",
                "Per second, on links that have any: errors, the quantity"
                " TopowatchNvlinkCrcErrorStorm alerts on above 10/s (CRC flit + data up to"
                " Hopper; on GB200's NVLink5, which has no CRC counters, packets received in"
                " error); replays (up to Hopper) or, on NVLink5, packets malformed, dropped for"
                " a buffer overrun or with a header mismatch. Recoveries per GPU in either"
                " family.",
                "cps",
                query(f"({nvlink_errors('gpu, link', g)}) > 0", "gpu{{gpu}} link{{link}} errors"),
                query(
                    f"rate(topowatch_nvlink_replay_errors_total{{{g}}}[{RATE}]) > 0"
                    f" or rate(topowatch_nvlink_rx_malformed_packet_errors_total{{{g}}}[{RATE}])"
                    f" + rate(topowatch_nvlink_rx_buffer_overrun_errors_total{{{g}}}[{RATE}])"
                    f" + rate(topowatch_nvlink_rx_general_errors_total{{{g}}}[{RATE}]) > 0",
                    "gpu{{gpu}} link{{link}} replay / malformed+overrun+header",
                ),
                query(nvlink_recoveries("gpu", g), "gpu{{gpu}} recoveries (all links)"),
            )
        )
        .with_panel(
            grid(
                "NVLink fabric",
                "Each GPU's NVLink fabric registration as NVML reports it (HGX Hopper, GB200):"
                ' state, status, clique and cluster; "not reported" where the GPU or its'
                " driver reports none. A registration that did not complete, or completed with"
                " an error status, keeps the GPU out of its NVLink domain (the fabric check"
                " asks for a reboot).",
                query(
                    "max by (gpu, state, status, clique_id, cluster_uuid)"
                    f" (topowatch_gpu_fabric_info{{{g}}})"
                    " or on (gpu) label_replace("
                    f'max by (gpu) (topowatch_gpu_up{{{g}}}), "state", "not reported",'
                    ' "__name__", ".*")',
                    instant=True,
                ),
                hide=["Value"],
                width=8,
            )
        )
        .with_panel(
            single(
                "GPUs with an unhealthy fabric",
                "GPUs whose fabric registration has not completed with success"
                " (topowatch_gpu_fabric_healthy 0): a failed registration, or one still"
                " running in the minutes after boot.",
                f"count(topowatch_gpu_fabric_healthy{{{n}}} == 0) or vector(0)",
            )
        )
        .with_panel(
            grid(
                "NVLinks down",
                "Links NVML reports inactive.",
                query(f"topowatch_nvlink_up{{{g}}} == 0", instant=True),
            )
        )
        .with_row(db.Row("EFA"))
        .with_panel(
            series(
                "EFA traffic",
                "Bytes per second per device.",
                "Bps",
                query(f"rate(topowatch_efa_tx_bytes_total{{{n}}}[{RATE}])", "{{device}} tx"),
                query(f"rate(topowatch_efa_rx_bytes_total{{{n}}}[{RATE}])", "{{device}} rx"),
            )
        )
        .with_panel(
            series(
                "RDMA",
                "RDMA read and write bytes per second per device.",
                "Bps",
                query(
                    f"rate(topowatch_efa_rdma_read_bytes_total{{{n}}}[{RATE}])",
                    "{{device}} read",
                ),
                query(
                    f"rate(topowatch_efa_rdma_write_bytes_total{{{n}}}[{RATE}])",
                    "{{device}} write",
                ),
            )
        )
        .with_panel(
            series(
                "Retransmits and drops",
                "Retransmitted packets, retransmit timeouts and receive drops per second.",
                "pps",
                query(
                    f"rate(topowatch_efa_retrans_pkts_total{{{n}}}[{RATE}])",
                    "{{device}} retrans",
                ),
                query(
                    f"rate(topowatch_efa_retrans_timeout_events_total{{{n}}}[{RATE}])",
                    "{{device}} retrans timeout",
                ),
                query(f"rate(topowatch_efa_rx_drops_total{{{n}}}[{RATE}])", "{{device}} drops"),
            )
        )
        .with_panel(
            series(
                "Unresponsive and impaired remotes",
                "Events per second: a peer stopped answering, or a connection degraded.",
                "cps",
                query(
                    f"rate(topowatch_efa_unresponsive_remote_events_total{{{n}}}[{RATE}])",
                    "{{device}} unresponsive",
                ),
                query(
                    f"rate(topowatch_efa_impaired_remote_conn_events_total{{{n}}}[{RATE}])",
                    "{{device}} impaired",
                ),
            )
        )
        .with_panel(
            single(
                "EFA devices present",
                "EFA devices in sysfs; fewer than the instance type has means one is missing.",
                f"sum(topowatch_efa_devices{{{n}}})",
            )
        )
        .with_panel(
            single(
                "EFA links down",
                "ENA interfaces paired with an EFA device that are down (operstate not up, or"
                " carrier lost). Only a few devices have one (on p5, most are EFA-only: watch"
                " their counters). The EFA port state is not shown: the efa driver reports every"
                " port ACTIVE whatever the link does.",
                f"count(topowatch_efa_netdev_up{{{n}}} == 0) or vector(0)",
            )
        )
        .with_panel(
            single(
                "EFA admin queues stuck",
                "Devices with admin commands they never completed (no_completion_cmds above 0):"
                " the driver has closed their admin queue until it re-initialises them (reboot).",
                f"count(topowatch_efa_no_completion_cmds_total{{{n}}} > 0) or vector(0)",
            )
        )
        .with_panel(
            grid(
                "EFA link state",
                "Each ENA interface paired with an EFA device: up (1) or not, and its carrier"
                " changes since boot (a rising count is a flapping link).",
                query(f"max by (device, interface) (topowatch_efa_netdev_up{{{n}}})", instant=True),
                query(
                    "max by (device, interface)"
                    f" (topowatch_efa_netdev_carrier_changes_total{{{n}}})",
                    instant=True,
                ),
                width=12,
            )
        )
        .with_row(db.Row("Kernel log"))
        .with_panel(
            series(
                "Kernel log events",
                "Kernel log lines matching a fault pattern, by kind and severity (XIDs, SXIDs,"
                " GPUs fallen off the bus, EFA driver errors, PCIe AER, NVLink, hung tasks).",
                "short",
                query(
                    "sum by (kind, severity)"
                    f" (increase(topowatch_kernel_log_events_total{{{n}}}[{RATE}]))",
                    "{{kind}} {{severity}}",
                ),
            )
        )
        .with_panel(
            series(
                "Kernel log lines read and lost",
                "Records read per second, and those the kernel overwrote before the agent read"
                " them (dropped: a fault may have gone unseen) or that could not be parsed.",
                "short",
                query(f"rate(topowatch_kernel_log_lines_total{{{n}}}[{RATE}])", "{{source}} read"),
                query(
                    f"increase(topowatch_kernel_log_dropped_total{{{n}}}[{RATE}])",
                    "{{source}} dropped",
                ),
                query(
                    f"increase(topowatch_kernel_log_malformed_total{{{n}}}[{RATE}])",
                    "{{source}} malformed",
                ),
            )
        )
        .with_panel(
            grid(
                "Latest kernel log events",
                "Per pattern and GPU or device: lines seen since the agent started (Value #A)"
                " and seconds since the latest (Value #B).",
                query(
                    "max by (kind, pattern, severity, gpu, device)"
                    f" (topowatch_kernel_log_events_total{{{n}}})",
                    instant=True,
                ),
                query(
                    "time() - max by (kind, pattern, severity, gpu, device)"
                    f" (topowatch_kernel_log_last_event_timestamp_seconds{{{n}}})",
                    instant=True,
                ),
                width=24,
            )
        )
        .with_row(db.Row("NUMA and affinity"))
        .with_panel(
            series(
                "NUMA memory used",
                "Memory in use per NUMA node.",
                "bytes",
                query(f'topowatch_numa_memory_bytes{{{n}, field="MemUsed"}}', "numa{{numa_node}}"),
            )
        )
        .with_panel(
            series(
                "NUMA misses",
                "Pages per second allocated off the preferred NUMA node.",
                "short",
                query(
                    f'rate(topowatch_numa_pages_total{{{n}, event="numa_miss"}}[{RATE}])',
                    "numa{{numa_node}}",
                ),
            )
        )
        .with_panel(
            grid(
                "GPU, EFA and NUMA affinity",
                "Each GPU's NUMA node and its nearest EFA devices; pick a row to see one GPU.",
                query(f"max by (gpu, numa_node) (topowatch_gpu_numa_info{{{g}}})", instant=True),
                query(f"count by (gpu) (topowatch_gpu_nearest_efa_info{{{g}}})", instant=True),
                links=[same_gpu],
                width=12,
            )
        )
        .with_panel(
            grid(
                "Misplaced processes",
                "GPU processes allowed to run on CPUs outside the GPU's NUMA node.",
                query(
                    f"max by (gpu, namespace, pod) (topowatch_gpu_processes_off_numa{{{g}}} > 0)",
                    instant=True,
                ),
            )
        )
    )


def topology() -> db.Dashboard:
    w = f'{C}, workload=~"$workload"'
    # Capacity series carry the ResourceFlavor whose nodes they count (flavor="", so no label,
    # when the cluster has none): a job runs on one flavor, so figures of different flavors are
    # shown side by side, never added together.
    f = f'{C}, flavor=~"$flavor"'
    to_nodes = link_to(
        "node",
        "Nodes with pods of ${__data.fields.namespace}",
        "var-namespace=${__data.fields.namespace}",
    )
    to_queue = link_to(
        "governance",
        "Queue ${__data.fields.cluster_queue}",
        "var-cluster_queue=${__data.fields.cluster_queue}",
    )
    return (
        dashboard(
            "topology",
            "topowatch / Topology and placement",
            "Where is capacity free at each network layer, and did workloads land where they"
            " asked?",
            ["topology", "kueue"],
        )
        .with_variable(
            query_variable(
                "level",
                f"label_values(topowatch_cluster_domain_gpus{{{C}}}, level)",
                include_all=False,
            )
        )
        .with_variable(
            query_variable(
                "flavor",
                f"label_values(topowatch_cluster_free_gpus{{{C}}}, flavor)",
                label="ResourceFlavor",
                multi=True,
            )
        )
        .with_variable(
            query_variable(
                "workload", f"label_values(topowatch_workload_gpus{{{C}}}, workload)", multi=True
            )
        )
        .link(link_to("governance", "Task governance"))
        .with_row(db.Row("Capacity by domain"))
        .with_panel(
            series(
                "Free GPUs per domain at $level",
                "Free GPUs in each domain of the chosen layer, per ResourceFlavor: on the"
                " flavor's nodes its pods may use now.",
                "short",
                query(
                    "sum by (flavor, domain) "
                    f'(topowatch_cluster_domain_gpus{{{f}, level="$level", state="free"}})',
                    "{{flavor}} {{domain}}",
                ),
            )
        )
        .with_panel(
            series(
                "Used GPUs per domain at $level",
                "GPUs held by pods in each domain of the chosen layer, per ResourceFlavor.",
                "short",
                query(
                    "sum by (flavor, domain) "
                    f'(topowatch_cluster_domain_gpus{{{f}, level="$level", state="used"}})',
                    "{{flavor}} {{domain}}",
                ),
            )
        )
        .with_panel(
            series(
                "Fragmentation by layer",
                "1 - largest free block / free GPUs, per ResourceFlavor: 0 when every free GPU"
                " of the flavor sits in one domain.",
                "percentunit",
                query(f"topowatch_cluster_fragmentation_ratio{{{f}}}", "{{flavor}} {{level}}"),
            )
        )
        .with_panel(
            series(
                "Largest free block vs free GPUs",
                "Per ResourceFlavor, the most free GPUs one domain of each layer holds, against"
                " all the flavor's free GPUs (a job gets one flavor; it fits only in whole pods"
                " per node: topowatch explain says for one job).",
                "short",
                query(
                    f"topowatch_cluster_largest_free_block_gpus{{{f}}}",
                    "{{flavor}} {{level}} largest",
                ),
                query(f"topowatch_cluster_free_gpus{{{f}}}", "{{flavor}} {{level}} free"),
            )
        )
        .with_row(db.Row("Locality of running workloads"))
        .with_panel(
            grid(
                "Workload locality",
                "Per live workload: GPUs, domains spanned at $level, UltraServers spanned, and"
                " the worst hop distance between two of its nodes.",
                query(
                    f"max by (namespace, workload, cluster_queue) (topowatch_workload_gpus{{{w}}})",
                    instant=True,
                ),
                query(
                    "max by (namespace, workload, cluster_queue) "
                    f'(topowatch_workload_domains{{{w}, level="$level"}})',
                    instant=True,
                ),
                query(
                    "max by (namespace, workload, cluster_queue) "
                    f"(topowatch_workload_worst_pair_hops{{{w}}})",
                    instant=True,
                ),
                links=[to_nodes, to_queue],
                width=24,
            )
        )
        .with_panel(
            grid(
                "Workloads whose topology request was not met",
                "Live workloads whose pods span more than one domain of the level they asked for.",
                query(
                    "max by (namespace, workload, cluster_queue, mode, level) "
                    f"(topowatch_workload_topology_satisfied{{{w}}} == 0)",
                    instant=True,
                ),
                links=[to_nodes],
            )
        )
        .with_panel(
            series(
                "Workloads pending on topology",
                "Workloads that fit the quota but find no domain with room for their shape.",
                "short",
                query(
                    "sum by (cluster_queue) "
                    f'(topowatch_pending_workloads{{{C}, cause="topology"}})',
                    "{{cluster_queue}}",
                ),
            )
        )
    )


def governance() -> db.Dashboard:
    q = f'{C}, cluster_queue=~"$cluster_queue"'
    to_workload = link_to(
        "topology",
        "Placement of ${__data.fields.workload}",
        "var-workload=${__data.fields.workload}",
    )
    bounds = f'{q}, state=~"running|target|min|max"'
    return (
        dashboard(
            "governance",
            "topowatch / Task governance",
            "Why are jobs waiting, who preempted whom, and which teams borrow or lend?",
            ["kueue", "governance"],
        )
        .with_variable(
            query_variable(
                "cluster_queue",
                f"label_values(topowatch_team_gpus{{{C}}}, cluster_queue)",
                label="team queue",
                multi=True,
            )
        )
        .link(link_to("topology", "Topology and placement"))
        .link(link_to("quota", "Quota planning"))
        .with_row(db.Row("Admission"))
        .with_panel(
            series(
                "Admission wait p90 by queue and topology mode",
                "90th percentile of the time from queueing to admission, over the rate window.",
                "s",
                query(
                    "histogram_quantile(0.9, sum by (le, cluster_queue, topology_mode) "
                    f"(rate(topowatch_admission_wait_seconds_bucket{{{q}}}[{RATE}])))",
                    "{{cluster_queue}} {{topology_mode}}",
                ),
            )
        )
        .with_panel(
            series(
                "Mean admission wait by queue and topology mode",
                "Mean wait of every admission the service has seen.",
                "s",
                query(
                    "sum by (cluster_queue, topology_mode) "
                    f"(topowatch_admission_wait_seconds_sum{{{q}}})"
                    " / sum by (cluster_queue, topology_mode) "
                    f"(topowatch_admission_wait_seconds_count{{{q}}})",
                    "{{cluster_queue}} {{topology_mode}}",
                ),
            )
        )
        .with_panel(
            series(
                "Pending workloads by cause",
                "Workloads waiting, by what blocks them: quota, topology, or something else.",
                "short",
                query(
                    f"sum by (cluster_queue, cause) (topowatch_pending_workloads{{{q}}})",
                    "{{cluster_queue}} {{cause}}",
                ),
            )
        )
        .with_row(db.Row("Preemptions"))
        .with_panel(
            grid(
                "Preemption ledger",
                "Preemptions in the time range by victim queue, preempting queue, Kueue reason"
                " and cause. Per-workload pairs: the cluster service's /api/v1/preemptions.",
                query(
                    "sum by (cluster_queue, preempting_cluster_queue, reason, cause) "
                    "(increase(topowatch_preemptions_total"
                    f'{{{C}, preempting_cluster_queue=~"$cluster_queue"}}[$__range]))',
                    instant=True,
                ),
            )
        )
        .with_panel(
            series(
                "Preemptions by reason",
                "Preemptions per second by Kueue reason and cause.",
                "ops",
                query(
                    "sum by (reason, cause) (rate(topowatch_preemptions_total"
                    f'{{{C}, preempting_cluster_queue=~"$cluster_queue"}}[{RATE}]))',
                    "{{reason}} {{cause}}",
                ),
            )
        )
        .with_row(db.Row("Borrowing and lending"))
        .with_panel(
            series(
                "Borrowed and lent GPUs per team",
                "GPUs a team borrows from the cohort above its nominal quota, and lends to it.",
                "short",
                query(
                    f'sum by (team, state) (topowatch_team_gpus{{{q}, state=~"borrowed|lent"}})',
                    "{{team}} {{state}}",
                ),
            )
        )
        .with_panel(
            series(
                "Nominal quota vs used per team",
                "A team above its nominal line is borrowing.",
                "short",
                query(
                    f'sum by (team, state) (topowatch_team_gpus{{{q}, state=~"nominal|used"}})',
                    "{{team}} {{state}}",
                ),
            )
        )
        .with_panel(
            grid(
                "Live workloads",
                "GPUs per admitted workload; each row links to its placement.",
                query(
                    f"max by (namespace, workload, cluster_queue) (topowatch_workload_gpus{{{q}}})",
                    instant=True,
                ),
                links=[to_workload],
                width=24,
            )
        )
        .with_row(db.Row("Elastic jobs"))
        .with_panel(
            series(
                "Elastic job size vs bounds",
                "Replicas per elastic job (HyperPodPyTorchJob elasticPolicy, Kueue elastic Job):"
                " running pods, the target the operator scales to, and the min and max bounds"
                " (dashed) from its spec.",
                "short",
                query(
                    "max by (namespace, elastic_job, state) "
                    f"({elastic_job('topowatch_elastic_job_replicas', bounds)})",
                    "{{namespace}}/{{elastic_job}} {{state}}",
                ),
            ).override_by_regexp(
                ".* (min|max)$",
                [
                    DynamicConfigValue(
                        id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                    )
                ],
            )
        )
        .with_panel(
            grid(
                "Elastic jobs now",
                "Per live elastic job: replicas running, the operator's target, the spec's min"
                " and max, and status.elasticScalingStatus.consecutiveScalingFailures (scale-ups"
                " that failed in a row).",
                query(elastic_replicas("running", q), instant=True),
                query(elastic_replicas("target", q), instant=True),
                query(elastic_replicas("min", q), instant=True),
                query(elastic_replicas("max", q), instant=True),
                query(
                    "max by (namespace, elastic_job) "
                    f"({elastic_job('topowatch_elastic_consecutive_scaling_failures', C)})"
                    " and on (namespace, elastic_job) " + elastic_replicas("running", q),
                    instant=True,
                ),
                rename={
                    "elastic_job": "job",
                    "Value #A": "running",
                    "Value #B": "target",
                    "Value #C": "min",
                    "Value #D": "max",
                    "Value #E": "consecutive scaling failures",
                },
            )
        )
        .with_panel(
            series(
                "Scale events by direction and cause",
                "Elastic jobs scaled up or down per rate window, by why: capacity_freed (GPUs"
                " came free), preemption (Kueue reclaimed them), faulty_pod, user_change (the"
                " spec's bounds changed) or unknown.",
                "short",
                query(
                    "sum by (direction, cause) (increase(topowatch_elastic_scale_events_total"
                    f"{{{q}}}[{RATE}]))",
                    "{{direction}} {{cause}}",
                ),
            ).draw_style(GraphDrawStyle.BARS)
        )
        .with_panel(
            series(
                "Scale-up failures by phase",
                "Scale-ups that failed per rate window, by the phase they failed in: admission"
                " (Kueue never admitted the new Workload slice), scheduling, ready (pods never"
                " became ready) or restart (the job did not restart at the new size).",
                "short",
                query(
                    "sum by (phase) (increase(topowatch_elastic_scale_failures_total"
                    f"{{{q}}}[{RATE}]))",
                    "{{phase}}",
                ),
            ).draw_style(GraphDrawStyle.BARS)
        )
        .with_panel(
            series(
                "Time to scale up by phase",
                "p50 and p90 of the seconds from a scale-up request (its Workload created) to"
                " the new size being admitted, scheduled, ready and restarted, over the rate"
                " window.",
                "s",
                query(
                    "histogram_quantile(0.5, sum by (le, phase) "
                    f"(rate(topowatch_elastic_scale_up_phase_seconds_bucket{{{C}}}[{RATE}])))",
                    "{{phase}} p50",
                ),
                query(
                    "histogram_quantile(0.9, sum by (le, phase) "
                    f"(rate(topowatch_elastic_scale_up_phase_seconds_bucket{{{C}}}[{RATE}])))",
                    "{{phase}} p90",
                ),
            )
        )
        .with_panel(
            bars(
                "Idle GPU-hours by reason",
                "GPU-hours left idle over the time range, by why. claimable: a pending or"
                " elastic job could have used these GPUs now; quota/topology: Kueue kept waiting"
                " work out for that reason; no_demand: nothing asked for them;"
                " health/deep_health_check/maintenance: the node was not offered.",
                "sum by (reason) "
                f"(increase(topowatch_idle_gpu_seconds_total{{{C}}}[$__range])) / 3600",
                "{{reason}}",
                unit="suffix: GPU-h",
            )
        )
        .with_panel(
            series(
                "Idle GPUs by reason",
                "Average idle GPUs per rate window (idle GPU-seconds per second), stacked by"
                " reason; the reasons are those of Idle GPU-hours by reason.",
                "short",
                query(
                    f"sum by (reason) (rate(topowatch_idle_gpu_seconds_total{{{C}}}[{RATE}]))",
                    "{{reason}}",
                ),
            ).stacking(StackingConfig().mode(StackingMode.NORMAL))
        )
        .with_panel(
            bars(
                "GPU-hours absorbed by elastic jobs per team",
                "GPU-hours each team's elastic jobs ran above their minimum replicas over the"
                " time range: capacity that would otherwise have sat idle or gone to others.",
                "sum by (team) "
                f"(increase(topowatch_elastic_absorbed_gpu_seconds_total{{{C}}}[$__range])) / 3600",
                "{{team}}",
                unit="suffix: GPU-h",
            )
        )
    )


def health() -> db.Dashboard:
    n = f'{C}, node=~"$node"'
    to_node = link_to(
        "node", "Node hardware for ${__data.fields.node}", "var-node=${__data.fields.node}"
    )
    return (
        dashboard(
            "health",
            "topowatch / Health and remediation",
            "Which checks fail, what did remediation decide and do, and is it still allowed to?",
            ["health", "remediation"],
        )
        .with_variable(
            query_variable(
                "node", f"label_values(topowatch_health_node_healthy{{{C}}}, node)", multi=True
            )
        )
        .link(link_to("fleet", "Fleet"))
        .with_row(db.Row("Remediation state"))
        .with_panel(
            single(
                "Breaker tripped",
                "1 while the circuit breaker stops all remediation; an admin must reset it.",
                f"max(topowatch_remediation_breaker_tripped{{{C}}})",
            )
        )
        .with_panel(
            single(
                "Budget left",
                "Nodes that may still enter remediation now.",
                f"sum(topowatch_remediation_budget_nodes{{{C}}})"
                f" - sum(topowatch_remediation_nodes_active{{{C}}})",
            )
        )
        .with_panel(
            single(
                "Nodes in remediation",
                "Actions started and not yet confirmed or timed out.",
                f"sum(topowatch_remediation_nodes_active{{{C}}})",
            )
        )
        .with_panel(
            grid(
                "Mode",
                "observe decides and audits only; act carries decisions out.",
                query(f"max by (mode) (topowatch_remediation_mode{{{C}}} == 1)", instant=True),
                width=4,
            )
        )
        .with_panel(
            single(
                "Nodes asking for action",
                "Nodes whose findings ask for a reboot or replacement.",
                f"sum(topowatch_remediation_nodes_requesting{{{C}}})",
            )
        )
        .with_panel(
            single(
                "Unhealthy nodes",
                "Nodes with an actionable finding.",
                f"count(topowatch_health_node_healthy{{{n}}} == 0) or vector(0)",
            )
        )
        .with_row(db.Row("Failing checks"))
        .with_panel(
            grid(
                "Active findings",
                "Every active finding; rows link to the node's hardware.",
                query(
                    "max by (node, check, component, severity, action) "
                    f"(topowatch_health_finding{{{n}}} == 1)",
                    instant=True,
                ),
                links=[to_node],
                width=24,
            )
        )
        .with_panel(
            series(
                "Failing checks by severity",
                "Active findings over time.",
                "short",
                query(
                    f"count by (check, severity) (topowatch_health_finding{{{n}}} == 1)",
                    "{{check}} {{severity}}",
                ),
            )
        )
        .with_panel(
            series(
                "Check errors",
                "Health checks that could not run (a check crashing is not a finding).",
                "short",
                query(
                    "sum by (check) "
                    f"(increase(topowatch_health_check_errors_total{{{n}}}[{RATE}]))",
                    "{{check}}",
                ),
            )
        )
        .with_row(db.Row("Decisions and actions"))
        .with_panel(
            grid(
                "Decisions",
                "Decisions and provider outcomes in the time range, by verdict, reason, action.",
                query(
                    "sum by (verdict, reason, action) "
                    f"(increase(topowatch_remediation_decisions_total{{{C}}}[$__range]))",
                    instant=True,
                ),
            )
        )
        .with_panel(
            series(
                "Actions",
                "Actions started (act) and provider outcomes (succeeded, failed) per second.",
                "ops",
                query(
                    "sum by (verdict, action) (rate(topowatch_remediation_decisions_total"
                    f'{{{C}, verdict=~"act|succeeded|failed"}}[{RATE}]))',
                    "{{verdict}} {{action}}",
                ),
            )
        )
        .with_panel(
            series(
                "Detection to action (p50, p99)",
                "From a failure's first sighting on the node (damping included) to the provider "
                "call, by action.",
                "s",
                query(
                    "histogram_quantile(0.5, sum by (le, action) (rate("
                    f"topowatch_remediation_detection_to_action_seconds_bucket{{{C}}}[$__range])))",
                    "p50 {{action}}",
                ),
                query(
                    "histogram_quantile(0.99, sum by (le, action) (rate("
                    f"topowatch_remediation_detection_to_action_seconds_bucket{{{C}}}[$__range])))",
                    "p99 {{action}}",
                ),
            )
        )
    )


def quota() -> db.Dashboard:
    t = f'{C}, team=~"$team"'
    to_queue = link_to(
        "governance",
        "Queue ${__data.fields.cluster_queue}",
        "var-cluster_queue=${__data.fields.cluster_queue}",
    )
    return (
        dashboard(
            "quota",
            "topowatch / Quota planning",
            "What should each team's quota be, and why (from the quota advisor)?",
            ["quota", "kueue"],
        )
        .with_variable(
            query_variable("team", f"label_values(topowatch_team_gpus{{{C}}}, team)", multi=True)
        )
        .link(link_to("governance", "Task governance"))
        .with_panel(
            grid(
                "Recommended vs current",
                "Per team and quota field: the advisor's recommendation with its reason, and"
                " the value in force.",
                query(
                    "max by (cluster_queue, team, kind, reason) "
                    f"(topowatch_quota_recommended_gpus{{{t}}})",
                    instant=True,
                ),
                query(
                    f"max by (cluster_queue, team, kind) (topowatch_quota_current_gpus{{{t}}})",
                    instant=True,
                ),
                links=[to_queue],
                width=24,
            )
        )
        .with_panel(
            series(
                "Recommended change",
                "Recommended minus current GPUs per team and field: positive means raise.",
                "short",
                query(
                    f"sum by (team, kind) (topowatch_quota_recommended_gpus{{{t}}})"
                    f" - sum by (team, kind) (topowatch_quota_current_gpus{{{t}}})",
                    "{{team}} {{kind}}",
                ),
            )
        )
        .with_panel(
            series(
                "Quota and use now",
                "Nominal quota, GPUs used, borrowed and lent per team.",
                "short",
                query(f"sum by (team, state) (topowatch_team_gpus{{{t}}})", "{{team}} {{state}}"),
            )
        )
    )


def goodput() -> db.Dashboard:
    """How much GPU time the cluster loses, to what and where (docs/goodput.md has the
    definitions)."""
    t = f'{C}, team=~"$team"'
    to_node = link_to(
        "node", "Node hardware for ${__data.fields.node}", "var-node=${__data.fields.node}"
    )
    return (
        dashboard(
            "goodput",
            "topowatch / Goodput and reliability",
            "How much GPU time does the cluster lose, to what, where, and which nodes keep"
            " failing?",
            ["goodput", "reliability", "kueue"],
        )
        .with_variable(
            query_variable(
                "team", f"label_values(topowatch_goodput_ettr_ratio{{{C}}}, team)", multi=True
            )
        )
        .link(link_to("health", "Health and remediation"))
        .link(link_to("governance", "Task governance"))
        .with_row(db.Row("Goodput"))
        .with_panel(
            single(
                "ETTR",
                "Effective training time ratio of the selected teams: time running over wall"
                " time since first admission, less the time the owners chose to wait.",
                f"sum(topowatch_goodput_running_seconds{{{t}}})"
                f" / sum(topowatch_goodput_effective_wall_seconds{{{t}}})",
                unit="percentunit",
            )
        )
        .with_panel(
            single(
                "GPU-hours lost",
                "GPUs held idle or torn down by interruptions, times the time until their job"
                " ran again (open interruptions up to now), over the ledger's retention.",
                f"sum(topowatch_goodput_lost_gpu_seconds{{{t}}}) / 3600 or vector(0)",
            )
        )
        .with_panel(
            single(
                "Interruptions",
                "Running jobs that stopped running in the dashboard's range, every cause but"
                " completion.",
                f'sum(increase(topowatch_interruptions_total{{{t}, cause!="completed"}}'
                "[$__range])) or vector(0)",
            )
        )
        .with_panel(
            single(
                "GPU time running",
                "Share of every GPU-second of the selected range spent running a workload.",
                f'sum(increase(topowatch_gpu_seconds_total{{{C}, category="running"}}'
                f"[$__range])) / sum(increase(topowatch_gpu_seconds_total{{{C}}}[$__range]))",
                unit="percentunit",
            )
        )
        .with_panel(
            single(
                "Repeat offenders",
                "Nodes with repeated hardware findings in the window (default 2 in 7 days):"
                " remediation replaces them rather than rebooting.",
                f"count(topowatch_node_repeat_offender{{{C}}} == 1) or vector(0)",
            )
        )
        .with_panel(
            single(
                "Jobs left out",
                "Jobs without per-job series because of the series cap.",
                f"max(topowatch_goodput_job_series_dropped{{{C}}}) or vector(0)",
            )
        )
        .with_panel(
            series(
                "ETTR by team",
                "Each team's effective training time ratio over its live and recent jobs.",
                "percentunit",
                query(f"max by (team) (topowatch_goodput_ettr_ratio{{{t}}})", "{{team}}"),
            )
        )
        .with_panel(
            bars(
                "GPU-hours lost by cause",
                "Lost GPU-hours per cause: preempted, node fault, remediation, elastic"
                " scale-down, user, unknown.",
                f"sum by (cause) (topowatch_goodput_lost_gpu_seconds{{{t}}}) / 3600",
                "{{cause}}",
            )
        )
        .with_panel(
            grid(
                "Jobs with the lowest ETTR",
                "Live and recent jobs, worst first, with their interruption count.",
                query(f"bottomk(20, topowatch_job_ettr_ratio{{{t}}})", instant=True),
                query(f"topowatch_job_interruptions{{{t}}}", instant=True),
                rename={"Value #A": "ETTR", "Value #B": "interruptions"},
                width=24,
            )
        )
        .with_row(db.Row("Where every GPU-second went"))
        .with_panel(
            series(
                "GPUs by state",
                "The GPU-second ledger as GPUs: running, restarting, absorbed by elastic jobs"
                " above their minimum, idle, and unavailable by reason. The states add up to"
                " the capacity.",
                "short",
                query(
                    f"sum by (category) (rate(topowatch_gpu_seconds_total{{{C}}}[{RATE}]))",
                    "{{category}}",
                ),
            ).stacking(StackingConfig().mode(StackingMode.NORMAL))
        )
        .with_panel(
            series(
                "Idle GPUs by reason",
                "Idle GPUs split by what keeps them idle: claimable, topology, quota, no demand.",
                "short",
                query(
                    "sum by (reason) "
                    f"(rate(topowatch_gpu_idle_seconds_by_reason_total{{{C}}}[{RATE}]))",
                    "{{reason}}",
                ),
            ).stacking(StackingConfig().mode(StackingMode.NORMAL))
        )
        .with_panel(
            bars(
                "Interruptions by cause and component",
                "Interruptions in the range per cause, and for node faults and remediation the"
                " component that failed.",
                f"sum by (cause, component) (increase(topowatch_interruptions_total{{{t}}}"
                "[$__range]))",
                "{{cause}} {{component}}",
            )
        )
        .with_row(db.Row("Fleet reliability"))
        .with_panel(
            bars(
                "Interruptions per 1,000 node-days",
                "Per failing component (GPU, HBM/ECC, NVLink/fabric, EFA/network, host/kernel,"
                " software, unknown): compare with Meta's published rates.",
                f"sum by (component) (topowatch_fleet_interruptions{{{C}}}) / on () group_left ()"
                f" (sum(topowatch_fleet_observed_node_seconds{{{C}}}) / 86400 / 1000)",
                "{{component}}",
            )
        )
        .with_panel(
            grid(
                "Mean time between hardware findings",
                "Hours per hardware finding, per instance type, layer-3 domain and UltraServer.",
                query(f"topowatch_fleet_mtbf_seconds{{{C}}} / 3600", instant=True),
                rename={"Value": "MTBF (hours)"},
            )
        )
        .with_panel(
            grid(
                "Repeat offenders",
                "Nodes with repeated hardware findings in the window, and how many.",
                query(f"topowatch_node_hardware_incidents{{{C}}}", instant=True),
                query(f"topowatch_node_repeat_offender{{{C}}} == 1", instant=True),
                links=[to_node],
                rename={"Value #A": "incidents", "Value #B": "repeat offender"},
                width=24,
            )
        )
    )


# file name (without .json) -> builder
DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "fleet": fleet,
    "node-hardware": node_hardware,
    "topology-placement": topology,
    "task-governance": governance,
    "health-remediation": health,
    "quota-planning": quota,
    "goodput-reliability": goodput,
}
