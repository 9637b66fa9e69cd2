"""The Helm chart renders, lints and validates offline, and deploys nothing it should not.

Rendering and linting use Helm's own Go library (helm-python-sdk); every rendered core object
is checked by kubernetes-validate --strict against Kubernetes 1.30. ServiceMonitor and
PrometheusRule are checked twice: against cloudcoil's models generated from prometheus-operator's
own CRDs (types, patterns, required fields; they let unknown fields through), and against a
closed subset of the monitoring.coreos.com/v1 schema written below, which refuses any field the
CRD does not define, as the API server's pruning would silently drop it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as operator_v1

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "topowatch"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "topowatch", "monitoring"

ACT_VALUES: dict[str, Any] = {
    "remediation": {"enabled": True, "mode": "act"},
    "serviceMonitor": {
        "enabled": True,
        "additionalLabels": {"release": "kube-prometheus-stack"},
        "staticLabels": {"cluster_id": "abc123def456", "cluster_name": "ml-cluster"},
    },
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    "cluster": {"alertsToken": {"existingSecret": "topowatch-alerts", "key": "token"}},
    "nodeAgent": {"runtimeClassName": "nvidia", "compat": ["dcgm", "efa"]},
}
OBSERVE_VALUES: dict[str, Any] = {"remediation": {"enabled": True, "mode": "observe"}}
CHECK_SCRIPT = "#!/bin/sh\nnvidia-smi -q >/dev/null 2>&1 || { echo 'nvidia-smi failed'; exit 1; }\n"
HEALTH_VALUES: dict[str, Any] = {
    "nodeAgent": {
        "health": {
            "config": {
                "damping": {"k": 2, "n": 4},
                "nvlink": {"max_errors_per_second": {"crc_flit": 20, "rx": 20}},
                "custom_checks": [
                    {
                        "name": "smi",
                        "path": "/etc/topowatch/checks/smi.sh",
                        "interval_seconds": 60,
                        "action": "reboot",
                    }
                ],
            },
            "customChecks": {"scripts": {"smi.sh": CHECK_SCRIPT}},
        }
    }
}
KMSG_VALUES: dict[str, Any] = {"nodeAgent": {"kernelLog": {"source": "kmsg", "privileged": True}}}
EPHEMERAL_VALUES: dict[str, Any] = {"history": {"persistence": {"enabled": False}}}
POSTGRESQL_VALUES: dict[str, Any] = {
    "history": {"postgresql": {"existingSecret": "topowatch-history-db", "key": "database-url"}}
}

Manifest = dict[str, Any]


def render(chart_dir: Path, values: dict[str, Any] | None) -> list[Manifest]:
    chart = helm.Chart.load(chart_dir)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    documents: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        documents.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return documents


@cache
def rendered(profile: str) -> tuple[Manifest, ...]:
    values = {
        "default": None,
        "observe": OBSERVE_VALUES,
        "act": ACT_VALUES,
        "health": HEALTH_VALUES,
        "kmsg": KMSG_VALUES,
        "ephemeral": EPHEMERAL_VALUES,
        "postgresql": POSTGRESQL_VALUES,
    }[profile]
    return tuple(render(CHART, values))


def objects(manifests: tuple[Manifest, ...] | list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: tuple[Manifest, ...] | list[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in objects(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def pod_specs(manifests: tuple[Manifest, ...]) -> Iterator[tuple[str, Manifest]]:
    for m in manifests:
        if m["kind"] in ("DaemonSet", "Deployment"):
            yield m["metadata"]["name"], m["spec"]["template"]["spec"]


def chart_copy(tmp_path: Path) -> Path:
    """A private copy of the chart whose dashboards and rules a test may replace."""
    copy = tmp_path / "topowatch"
    shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("dashboards", "rules"))
    return copy


# --- render, lint, validate ---------------------------------------------------------------


def test_app_version_follows_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]


@pytest.mark.parametrize(
    "values",
    [
        None,
        OBSERVE_VALUES,
        ACT_VALUES,
        HEALTH_VALUES,
        KMSG_VALUES,
        EPHEMERAL_VALUES,
        POSTGRESQL_VALUES,
    ],
    ids=["default", "observe", "act", "health", "kmsg", "ephemeral", "postgresql"],
)
def test_chart_lints_without_warnings(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and serious == []


@pytest.mark.parametrize(
    "profile", ["default", "observe", "act", "health", "kmsg", "ephemeral", "postgresql"]
)
def test_every_core_manifest_passes_strict_kubernetes_validation(profile: str) -> None:
    manifests = rendered(profile)
    core = [m for m in manifests if not m["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {m["kind"] for m in core} >= {
        "DaemonSet",
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for manifest in core:
        # Raises ValidationError (unknown field, wrong type) or SchemaNotFoundError.
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_strict_validation_would_catch_a_misspelled_field() -> None:
    daemonset = json.loads(json.dumps(objects(rendered("default"), "DaemonSet")[0]))
    daemonset["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSION, strict=True)


def test_schema_refuses_misspelled_values() -> None:
    chart = helm.Chart.load(CHART)
    typos: list[dict[str, Any]] = [
        {"nodeAgnet": {}},
        {"nodeAgent": {"runAsroot": True}},
        {"cluster": {"resource": {}}},
        {"remediation": {"mode": "enforce"}},
        {"serviceMonitor": {"enable": True}},
        {"nodeAgent": {"admissionPolicy": {"enable": False}}},
        {"nodeAgent": {"admissionPolicy": True}},
    ]
    for typo in typos:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(typo)
    chart.validate_schema(ACT_VALUES)


def test_optional_objects_are_gated_by_values() -> None:
    default_kinds = {m["kind"] for m in rendered("default")}
    assert "ServiceMonitor" not in default_kinds and "PrometheusRule" not in default_kinds
    default_maps = [m["metadata"]["name"] for m in objects(rendered("default"), "ConfigMap")]
    assert "topowatch-cluster-remediation" not in default_maps
    assert "topowatch-cluster-remediation" in {m["metadata"]["name"] for m in rendered("act")}
    monitors = objects(rendered("act"), "ServiceMonitor")
    assert {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in monitors} == {
        "node-agent",
        "cluster",
    }


# --- security -----------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "act"])
def test_pods_run_hardened(profile: str) -> None:
    specs = dict(pod_specs(rendered(profile)))
    assert set(specs) == {"topowatch-node-agent", "topowatch-cluster"}
    for name, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert not ctx.get("privileged"), name
        for init in spec.get("initContainers", []):  # the state directory's owner: CHOWN only
            assert name == "topowatch-node-agent" and init["name"] == "kernel-log-state-owner"
            ctx = init["securityContext"]
            assert (
                ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
            )
            assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
            assert not ctx.get("privileged")
            assert [m["mountPath"] for m in init["volumeMounts"]] == ["/state"]


def host_paths(spec: Manifest) -> dict[str, dict[str, Any]]:
    """hostPath volumes by host path: their type and the agent container's mount of them."""
    mounts = {m["name"]: m for c in spec["containers"] for m in c["volumeMounts"]}
    return {
        v["hostPath"]["path"]: {"type": v["hostPath"].get("type"), "mount": mounts[v["name"]]}
        for v in spec["volumes"]
        if "hostPath" in v
    }


JOURNAL_PATHS = ["/etc/machine-id", "/run/log/journal", "/var/log/journal"]
STATE_PATH = "/var/lib/topowatch"  # nodeAgent.kernelLog.stateHostPath's default


def test_host_paths_are_the_agents_inputs_all_read_only() -> None:
    """sysfs, procfs, the pod-resources socket and (kernel log, journal mode by default) the
    systemd journal and the machine id: read-only. The one host directory written is the kernel
    log's state (stateHostPath), and nothing else of the host is mounted."""
    for profile in ("default", "act"):
        for name, spec in pod_specs(rendered(profile)):
            paths = host_paths(spec)
            if name.endswith("cluster"):
                assert paths == {}
                continue
            assert sorted(paths) == sorted(
                ["/proc", "/sys", "/var/lib/kubelet/pod-resources", STATE_PATH, *JOURNAL_PATHS]
            )
            for path, volume in paths.items():
                assert volume["mount"]["readOnly"] is (path != STATE_PATH), path
            assert paths[STATE_PATH]["type"] == "DirectoryOrCreate"
            assert paths["/sys"]["mount"]["mountPath"] == "/host/sys"
            assert paths["/proc"]["mount"]["mountPath"] == "/host/proc"


def test_root_is_an_explicit_switch_for_the_node_agent_only() -> None:
    manifests = render(CHART, {"nodeAgent": {"runAsRoot": True, "supplementalGroups": [44]}})
    specs = dict(pod_specs(tuple(manifests)))
    agent = specs["topowatch-node-agent"]
    assert agent["securityContext"]["runAsUser"] == 0
    assert agent["securityContext"]["supplementalGroups"] == [44]
    assert agent["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert specs["topowatch-cluster"]["securityContext"]["runAsNonRoot"] is True


def granted(role: Manifest) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
REMEDIATION_WRITES = {("", "nodes", "patch"), ("", "events", "create")}


@pytest.mark.parametrize("profile", ["default", "observe"])
def test_cluster_service_cannot_write_unless_remediation_acts(profile: str) -> None:
    role = granted(one(rendered(profile), "ClusterRole", "topowatch-cluster"))
    # Observe mode writes only Events (every decision is one); it never touches a Node.
    events = {("", "events", "create")} if profile == "observe" else set()
    assert {grant for grant in role if grant[2] in WRITE_VERBS} == events
    assert {verb for _, _, verb in role} - WRITE_VERBS == {"get", "list", "watch"}
    kueue = {resource for group, resource, _ in role if group == "kueue.x-k8s.io"}
    assert kueue == {
        "workloads",
        "clusterqueues",
        "localqueues",
        "cohorts",
        "resourceflavors",
        "topologies",
        "workloadpriorityclasses",
    }
    assert {resource for group, resource, _ in role if group == ""} == {"nodes", "pods", "events"}


@pytest.mark.parametrize(
    ("mode", "writes"),
    [("observe", {("", "events", "create")}), ("act", REMEDIATION_WRITES)],
)
def test_remediation_may_create_events_whenever_the_controller_runs(
    mode: str, writes: set[tuple[str, str, str]]
) -> None:
    """Every decision is an Event in both modes; without `create events` they would fail."""
    values = {"remediation": {"enabled": True, "mode": mode}, "rbac": {"create": True}}
    role = granted(one(render(CHART, values), "ClusterRole", "topowatch-cluster"))
    assert ("", "events", "create") in role
    assert {grant for grant in role if grant[2] in WRITE_VERBS} == writes


def test_the_charts_remediation_config_is_one_the_service_accepts() -> None:
    from healthcheck.remediation.policy import DEFAULT_LADDER, PolicyConfig

    for profile in ("observe", "act"):
        config_map = one(rendered(profile), "ConfigMap", "topowatch-cluster-remediation")
        raw = yaml.safe_load(config_map["data"]["remediation.yaml"])
        config, problems = PolicyConfig.from_mapping(raw)
        assert problems == [] and config.mode == profile
        assert config.ladder.rules == DEFAULT_LADDER.rules
        assert config.healthy_reset_s == 86400
        assert raw["rack_escalation"] == {"enabled": False, "share": 0.5}
        assert config.rack_escalation is False and config.rack_share == 0.5


def test_rack_escalation_is_a_chart_value_passed_to_the_remediation_config() -> None:
    values = {
        "remediation": {
            "enabled": True,
            "mode": "act",
            "config": {"rack_escalation": {"enabled": True, "share": 0.75}},
        }
    }
    from healthcheck.remediation.policy import PolicyConfig

    config_map = one(render(CHART, values), "ConfigMap", "topowatch-cluster-remediation")
    raw = yaml.safe_load(config_map["data"]["remediation.yaml"])
    config, problems = PolicyConfig.from_mapping(raw)
    assert problems == []
    assert config.rack_escalation is True and config.rack_share == 0.75
    assert raw["budget"] == {"nodes": 2, "percent": 2}  # the other defaults stay


def test_remediation_in_act_mode_gets_only_its_write_verbs() -> None:
    role = granted(one(rendered("act"), "ClusterRole", "topowatch-cluster"))
    writes = {grant for grant in role if grant[2] in WRITE_VERBS}
    assert writes == REMEDIATION_WRITES


def test_node_agent_may_only_report_on_nodes() -> None:
    role = granted(one(rendered("default"), "ClusterRole", "topowatch-node-agent"))
    writes = {grant for grant in role if grant[2] in WRITE_VERBS}
    assert writes == {
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "events", "create"),
    }
    assert {r for _, r, _ in role} == {"nodes", "nodes/status", "events"}
    quiet = render(CHART, {"nodeAgent": {"reportNodeStatus": False}})
    quiet_role = granted(one(quiet, "ClusterRole", "topowatch-node-agent"))
    assert {verb for _, _, verb in quiet_role} == {"get", "list", "watch"}


def test_node_agent_writes_are_scoped_by_an_admission_policy_by_default() -> None:
    """RBAC lets the agent patch every Node; the policy (tests/deploy/test_admission_policy.py runs
    its CEL) narrows that to its own Node and topowatch's keys. On by default: the chart
    needs Kubernetes 1.30, where admissionregistration.k8s.io/v1 serves it."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    for profile in ("default", "observe", "act"):
        manifests = rendered(profile)
        policy = one(manifests, "ValidatingAdmissionPolicy", "topowatch-node-reports")
        binding = one(manifests, "ValidatingAdmissionPolicyBinding", "topowatch-node-reports")
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert binding["spec"]["policyName"] == "topowatch-node-reports"
        assert binding["spec"]["validationActions"] == ["Deny"]
    for values in (
        {"nodeAgent": {"admissionPolicy": {"enabled": False}}},
        {"nodeAgent": {"enabled": False}},
    ):
        kinds = {m["kind"] for m in render(CHART, values)}
        assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    # without the health report the agent writes nothing, and the policy still keeps every
    # other writer off the findings annotation
    quiet = render(CHART, {"nodeAgent": {"reportNodeStatus": False}})
    one(quiet, "ValidatingAdmissionPolicy", "topowatch-node-reports")


def test_bindings_tie_each_role_to_its_own_service_account() -> None:
    manifests = rendered("act")
    for binding in objects(manifests, "ClusterRoleBinding"):
        name = binding["metadata"]["name"]
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
        ]
        one(manifests, "ServiceAccount", name)


# --- what each component is told ----------------------------------------------------------


def args_of(spec: Manifest) -> list[str]:
    container = spec["containers"][0]
    assert "command" not in container  # the image's ENTRYPOINT is topowatch
    return [str(a) for a in container["args"]]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_node_agent_reads_the_host_through_its_mounts() -> None:
    spec = dict(pod_specs(rendered("act")))["topowatch-node-agent"]
    args = args_of(spec)
    assert args[0] == "node" and flag(args, "--listen") == "0.0.0.0:9402"
    assert flag(args, "--sysfs-root") == "/host/sys" and flag(args, "--proc-root") == "/host/proc"
    assert flag(args, "--pod-resources-socket").startswith("/var/lib/kubelet/pod-resources/")
    assert flag(args, "--compat") == "dcgm,efa"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert spec["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert "runtimeClassName" not in dict(pod_specs(rendered("default")))["topowatch-node-agent"]


def test_cluster_service_gets_remediation_config_and_alerts_token_from_the_cluster() -> None:
    manifests = rendered("act")
    spec = dict(pod_specs(manifests))["topowatch-cluster"]
    args = args_of(spec)
    assert args[0] == "cluster" and flag(args, "--listen") == "0.0.0.0:9403"
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_path = Path(flag(args, "--remediation-config"))
    assert str(config_path.parent) == mounts["remediation"]
    config_map = one(manifests, "ConfigMap", volumes["remediation"]["configMap"]["name"])
    config = yaml.safe_load(config_map["data"][config_path.name])
    assert config["mode"] == "act" and config["providers"] == ["hyperpod"]
    token_path = Path(flag(args, "--alerts-token-file"))
    assert str(token_path.parent) == mounts["alerts-token"]
    secret = volumes["alerts-token"]["secret"]
    assert secret["secretName"] == "topowatch-alerts"
    assert secret["items"] == [{"key": "token", "path": token_path.name}]
    default_args = args_of(dict(pod_specs(rendered("default")))["topowatch-cluster"])
    assert "--remediation-config" not in default_args and "--alerts-token-file" not in default_args


def test_probes_use_the_health_endpoints_on_the_metrics_port() -> None:
    for name, spec in pod_specs(rendered("default")):
        container = spec["containers"][0]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, (
            name
        )


def test_resources_follow_the_benchmarks() -> None:
    specs = dict(pod_specs(rendered("default")))
    agent = specs["topowatch-node-agent"]["containers"][0]["resources"]
    cluster = specs["topowatch-cluster"]["containers"][0]["resources"]
    assert agent == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"cpu": "200m", "memory": "192Mi"},
    }
    assert cluster == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_services_expose_a_metrics_port_that_the_service_monitors_select() -> None:
    manifests = rendered("act")
    services = {
        s["metadata"]["labels"]["app.kubernetes.io/component"]: s
        for s in objects(manifests, "Service")
    }
    pods = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m
        for m in manifests
        if m["kind"] in ("DaemonSet", "Deployment")
    }
    for monitor in objects(manifests, "ServiceMonitor"):
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        service = services[component]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        pod_labels = pods[component]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        # the agent's own pod/namespace/container/node labels name the GPU's workload: kept
        honor = monitor["spec"]["endpoints"][0].get("honorLabels", False)
        assert honor is (component == "node-agent")


# --- the node agent's health config and custom checks -------------------------------------


def agent_spec(manifests: tuple[Manifest, ...] | list[Manifest]) -> Manifest:
    return dict(pod_specs(tuple(manifests)))["topowatch-node-agent"]


def agent_pod(manifests: tuple[Manifest, ...] | list[Manifest]) -> Manifest:
    template: Manifest = one(manifests, "DaemonSet", "topowatch-node-agent")["spec"]["template"]
    return template


def mounts_of(spec: Manifest) -> dict[str, Manifest]:
    return {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}


def volumes_of(spec: Manifest) -> dict[str, Manifest]:
    return {v["name"]: v for v in spec["volumes"]}


def mounted_file(spec: Manifest, path: str) -> tuple[Manifest, Manifest, str]:
    """(the mount whose mountPath is path's directory, its volume, the file name)."""
    directory, name = str(Path(path).parent), Path(path).name
    (mount,) = [m for m in mounts_of(spec).values() if m["mountPath"] == directory]
    return mount, volumes_of(spec)[mount["name"]], name


def test_the_health_config_reaches_the_agent_as_a_read_only_file_it_accepts() -> None:
    from healthcheck.detection.config import config_from_mapping

    manifests = rendered("health")
    spec = agent_spec(manifests)
    args = args_of(spec)
    mount, volume, name = mounted_file(spec, flag(args, "--health-config"))
    assert mount["readOnly"] is True
    config_map = one(manifests, "ConfigMap", volume["configMap"]["name"])
    config = config_from_mapping(yaml.safe_load(config_map["data"][name]))  # raises if refused
    assert config.damping.k == 2 and config.nvlink.max_errors_per_second["rx"] == 20
    assert config.nvlink.max_errors_per_second["crc_data"] == 10  # the rest stay default
    (check,) = config.custom_checks
    assert (check.name, check.action, check.interval_seconds) == ("smi", "reboot", 60)


def test_custom_check_scripts_are_mounted_executable_and_read_only_where_the_config_runs_them() -> (
    None
):
    from healthcheck.detection.config import config_from_mapping

    manifests = rendered("health")
    spec = agent_spec(manifests)
    health = one(manifests, "ConfigMap", "topowatch-node-agent-health")
    config = config_from_mapping(yaml.safe_load(health["data"]["health.yaml"]))
    (check,) = config.custom_checks
    mount, volume, name = mounted_file(spec, check.path)
    assert mount["readOnly"] is True
    assert volume["configMap"]["defaultMode"] == 0o555  # r-x: the agent's user runs them
    scripts = one(manifests, "ConfigMap", volume["configMap"]["name"])
    assert scripts["data"] == {name: CHECK_SCRIPT}  # verbatim: the shebang line first
    # the container itself stays as hardened as without them
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_without_a_health_config_the_agent_gets_no_flag_no_volume_and_no_config_map() -> None:
    manifests = rendered("default")
    spec = agent_spec(manifests)
    assert "--health-config" not in args_of(spec)
    assert not {"health-config", "custom-checks"} & set(volumes_of(spec))
    names = {m["metadata"]["name"] for m in objects(manifests, "ConfigMap")}
    assert not {"topowatch-node-agent-health", "topowatch-node-agent-checks"} & names
    assert "checksum/health" not in agent_pod(manifests)["metadata"].get("annotations", {})
    # scripts alone (run by path from an admin's own config elsewhere) mount, pass no flag
    alone = render(CHART, {"nodeAgent": {"health": {"customChecks": {"scripts": {"a.sh": "x"}}}}})
    alone_spec = agent_spec(alone)
    assert "--health-config" not in args_of(alone_spec)
    assert mounts_of(alone_spec)["custom-checks"]["mountPath"] == "/etc/topowatch/checks"


def test_an_existing_config_map_of_scripts_replaces_the_charts_own() -> None:
    values = {"nodeAgent": {"health": {"customChecks": {"existingConfigMap": "gpu-checks"}}}}
    manifests = render(CHART, values)
    volume = volumes_of(agent_spec(manifests))["custom-checks"]
    assert volume["configMap"] == {"name": "gpu-checks", "defaultMode": 0o555}
    assert "topowatch-node-agent-checks" not in {
        m["metadata"]["name"] for m in objects(manifests, "ConfigMap")
    }
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_a_change_of_health_config_or_scripts_rolls_the_daemonset() -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = agent_pod(render(CHART, values))["metadata"]["annotations"]
        return str(annotations["checksum/health"])

    base = checksum(HEALTH_VALUES)
    assert len(base) == 64
    tuned = json.loads(json.dumps(HEALTH_VALUES))
    tuned["nodeAgent"]["health"]["config"]["damping"]["k"] = 3
    rescripted = json.loads(json.dumps(HEALTH_VALUES))
    rescripted["nodeAgent"]["health"]["customChecks"]["scripts"]["smi.sh"] += "exit 0\n"
    assert len({base, checksum(tuned), checksum(rescripted), checksum(HEALTH_VALUES)}) == 3
    # the admin's own pod annotations are kept beside it
    annotated = json.loads(json.dumps(HEALTH_VALUES))
    annotated["nodeAgent"]["podAnnotations"] = {"team": "ml-infra"}
    annotations = agent_pod(render(CHART, annotated))["metadata"]["annotations"]
    assert annotations == {"team": "ml-infra", "checksum/health": base}


def test_the_chart_refuses_a_custom_check_whose_script_it_does_not_carry() -> None:
    values = json.loads(json.dumps(HEALTH_VALUES))
    values["nodeAgent"]["health"]["config"]["custom_checks"][0]["path"] = (
        "/etc/topowatch/checks/smi-typo.sh"
    )
    with pytest.raises(helm.HelmError, match=re.escape("smi-typo.sh")):
        render(CHART, values)
    both = {
        "nodeAgent": {
            "health": {"customChecks": {"scripts": {"a.sh": "x"}, "existingConfigMap": "mine"}}
        }
    }
    with pytest.raises(helm.HelmError):
        render(CHART, both)


@pytest.mark.parametrize(
    "health",
    [
        {"config": "nvlink: {}"},  # a string, not a mapping
        {"config": {"nvlinks": {}}},  # not a key the agent knows
        {"config": {"custom_checks": [{"name": "x"}]}},  # no path
        {"config": {"custom_checks": [{"name": "x", "path": "checks/x.sh"}]}},  # relative
        {"customChecks": {"scripts": {"x.sh": 1}}},
        {"customChecks": {"scripts": {"../x.sh": "#!/bin/sh"}}},  # not a ConfigMap key
        {"customChecks": {"scripts": ["x.sh"]}},
        {"customChecks": {"existingConfigMap": True}},
        {"customChecks": {"defaultMode": 511}},
        {"configs": {}},
    ],
)
def test_schema_refuses_a_health_config_of_the_wrong_shape(health: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({"nodeAgent": {"health": health}})


def test_the_schemas_health_config_keys_are_the_agents() -> None:
    """The schema refuses a misspelled key at install; it must know every key the agent does."""
    import dataclasses

    from healthcheck.detection.config import HealthConfig

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["nodeAgent"]["properties"]["health"]["properties"]["config"]
    assert set(config["propertyNames"]["enum"]) == {
        f.name for f in dataclasses.fields(HealthConfig)
    }


# --- the kernel log monitor ------------------------------------------------------------------


def container_context(spec: Manifest) -> Manifest:
    context: Manifest = spec["containers"][0]["securityContext"]
    return context


def test_by_default_the_kernel_log_comes_from_the_journal_without_privilege() -> None:
    spec = agent_spec(rendered("default"))
    args = args_of(spec)
    assert flag(args, "--kernel-log") == "journal"
    journal_dirs = [args[i + 1] for i, a in enumerate(args) if a == "--journal-dir"]
    assert journal_dirs == ["/var/log/journal", "/run/log/journal"]
    paths = host_paths(spec)
    for directory in journal_dirs:  # mounted where the flag says, read-only, never created
        assert paths[directory]["mount"]["mountPath"] == directory
        assert paths[directory]["mount"]["readOnly"] is True
        assert paths[directory]["type"] == "Directory"
    assert paths["/etc/machine-id"]["type"] == "File"
    assert paths["/etc/machine-id"]["mount"]["mountPath"] == "/etc/machine-id"
    assert "/dev/kmsg" not in paths
    ctx = container_context(spec)
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert "supplementalGroups" not in spec["securityContext"]  # no journalGroup given


def test_the_journal_group_is_added_to_the_agents_groups() -> None:
    values = {"nodeAgent": {"supplementalGroups": [44], "kernelLog": {"journalGroup": 190}}}
    spec = agent_spec(render(CHART, values))
    assert spec["securityContext"]["supplementalGroups"] == [44, 190]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container_context(spec)["capabilities"] == {"drop": ["ALL"]}
    # only the journal needs it: kmsg or off leave the groups as given
    for kernel_log in (
        {"source": "kmsg", "privileged": True, "journalGroup": 190},
        {"enabled": False, "journalGroup": 190},
    ):
        other = {"nodeAgent": {"supplementalGroups": [44], "kernelLog": kernel_log}}
        assert agent_spec(render(CHART, other))["securityContext"]["supplementalGroups"] == [44]


def test_kmsg_is_refused_unless_privilege_is_asked_for_explicitly() -> None:
    chart = helm.Chart.load(CHART)
    for kernel_log in ({"source": "kmsg"}, {"source": "kmsg", "privileged": False}):
        values = {"nodeAgent": {"kernelLog": kernel_log}}
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(values)
        with pytest.raises(helm.HelmError):
            render(CHART, values)
    chart.validate_schema(KMSG_VALUES)
    # privileged without kmsg grants nothing: the journal needs no privilege
    spec = agent_spec(render(CHART, {"nodeAgent": {"kernelLog": {"privileged": True}}}))
    assert container_context(spec)["privileged"] is False


def test_kmsg_mounts_the_device_read_only_and_is_privileged_with_cap_syslog() -> None:
    manifests = rendered("kmsg")
    spec = agent_spec(manifests)
    assert flag(args_of(spec), "--kernel-log") == "kmsg"
    assert "--journal-dir" not in args_of(spec)
    paths = host_paths(spec)
    assert sorted(paths) == [
        "/dev/kmsg",
        "/proc",
        "/sys",
        "/var/lib/kubelet/pod-resources",
        STATE_PATH,
    ]
    assert paths["/dev/kmsg"]["type"] == "CharDevice"
    assert paths["/dev/kmsg"]["mount"] == {
        "name": "kmsg",
        "mountPath": "/dev/kmsg",
        "readOnly": True,
    }
    ctx = container_context(spec)
    assert ctx["privileged"] is True
    # the API server refuses privileged with allowPrivilegeEscalation false
    assert ctx["allowPrivilegeEscalation"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert ctx["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True  # root stays a separate switch
    # the cluster service is untouched
    cluster = dict(pod_specs(manifests))["topowatch-cluster"]
    assert container_context(cluster)["capabilities"] == {"drop": ["ALL"]}
    assert container_context(cluster)["privileged"] is False


def test_a_disabled_kernel_log_is_off_and_mounts_nothing() -> None:
    spec = agent_spec(render(CHART, {"nodeAgent": {"kernelLog": {"enabled": False}}}))
    args = args_of(spec)
    assert flag(args, "--kernel-log") == "off"
    assert "--kernel-log-state" not in args and "--journal-dir" not in args
    assert sorted(host_paths(spec)) == ["/proc", "/sys", "/var/lib/kubelet/pod-resources"]
    assert set(volumes_of(spec)) == {"host-sys", "host-proc", "pod-resources", "tmp"}
    assert container_context(spec)["capabilities"] == {"drop": ["ALL"]}
    assert "initContainers" not in spec  # no state directory to hand over


def test_the_kernel_log_state_is_kept_on_the_host_across_pods_by_default() -> None:
    """Issue 28: the kernel log's cursor and what the agent judged from the lines before it
    (xids.state.json) are one state; on an emptyDir a rollout lost both. By default they live
    in a hostPath (DirectoryOrCreate), the one host directory mounted read-write; an init
    container with CAP_CHOWN alone hands it to the agent's uid (the kubelet creates it root's
    0755). `stateHostPath: ""` keeps the emptyDir (a container restart only)."""
    spec = agent_spec(rendered("default"))
    state = flag(args_of(spec), "--kernel-log-state")
    (mount,) = [m for m in mounts_of(spec).values() if m["mountPath"] == state]
    assert mount["readOnly"] is False
    assert volumes_of(spec)[mount["name"]]["hostPath"] == {
        "path": STATE_PATH,
        "type": "DirectoryOrCreate",
    }
    [init] = spec["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["volumeMounts"] == [{"name": mount["name"], "mountPath": "/state"}]
    script = init["command"][-1]
    assert 'os.chown("/state", 65532, 65532)' in script
    assert spec["securityContext"]["runAsUser"] == 65532  # the uid it hands the directory to
    compile(script, "kernel-log-state-owner", "exec")  # the script at least parses

    elsewhere = {"nodeAgent": {"kernelLog": {"stateHostPath": "/data/topowatch"}}}
    other = agent_spec(render(CHART, elsewhere))
    assert host_paths(other)["/data/topowatch"]["mount"]["mountPath"] == state

    root = agent_spec(render(CHART, {"nodeAgent": {"runAsRoot": True}}))
    assert "initContainers" not in root  # root writes it as it is

    ephemeral = agent_spec(render(CHART, {"nodeAgent": {"kernelLog": {"stateHostPath": ""}}}))
    state = flag(args_of(ephemeral), "--kernel-log-state")
    (mount,) = [m for m in mounts_of(ephemeral).values() if m["mountPath"] == state]
    assert "emptyDir" in volumes_of(ephemeral)[mount["name"]]  # survives a container restart
    assert STATE_PATH not in host_paths(ephemeral) and "initContainers" not in ephemeral
    assert "LOST WITH THE POD" in notes({"nodeAgent": {"kernelLog": {"stateHostPath": ""}}})
    assert f"kept in {STATE_PATH} on each node" in notes(None)


@pytest.mark.parametrize(
    "kernel_log",
    [
        {"source": "dmesg"},
        {"enabled": "yes"},
        {"journalGroup": "systemd-journal"},
        {"journalGroup": -1},
        {"journalDirs": []},
        {"journalDirs": ["var/log/journal"]},
        {"stateHostPath": "relative/dir"},
        {"privileged": "true"},
        {"kmsgPath": "/dev/kmsg"},
    ],
)
def test_schema_refuses_kernel_log_values_of_the_wrong_shape(kernel_log: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({"nodeAgent": {"kernelLog": kernel_log}})


def notes(values: dict[str, Any] | None) -> str:
    rendered_files = helm.Chart.load(CHART).render(
        values, name=RELEASE, namespace=NAMESPACE, is_install=True
    )
    return next(text for path, text in rendered_files.items() if path.endswith("NOTES.txt"))


def test_the_install_notes_say_what_each_kernel_log_mode_grants() -> None:
    journal = notes(None)
    assert "no privilege, no capability" in journal
    assert "journalGroup is not set" in journal  # the agent could not open the journal
    assert "journalGroup is not set" not in notes(
        {"nodeAgent": {"kernelLog": {"journalGroup": 190}}}
    )
    kmsg = notes(KMSG_VALUES)
    assert "PRIVILEGED" in kmsg and "every" in kmsg and "CAP_SYSLOG" in kmsg
    assert "dmesg_restrict" in kmsg and "runAsRoot" in kmsg  # CAP_SYSLOG needs root to stick
    assert "Kernel log monitor: off." in notes({"nodeAgent": {"kernelLog": {"enabled": False}}})


# --- prometheus-operator objects (closed subset of monitoring.coreos.com/v1) ----------------

DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": STRING_MAP, "matchExpressions": {"type": "array"}},
}
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
RELABEL_ACTIONS = [
    *("replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod"),
    *("labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep"),
    *("lowercase", "Lowercase", "uppercase", "Uppercase"),
    *("keepequal", "KeepEqual", "dropequal", "DropEqual"),
]
RELABEL_CONFIG = {  # monitoring.coreos.com/v1 RelabelConfig
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        "action": {"enum": RELABEL_ACTIONS},
    },
}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": RELABEL_CONFIG},
                            "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG},
                        },
                    },
                },
            },
        },
    },
}
RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "for": {"type": "string", "pattern": DURATION},
        "keep_firing_for": {"type": "string", "pattern": DURATION, "minLength": 1},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "limit": {"type": "integer"},
                            "labels": STRING_MAP,
                            "rules": {"type": "array", "items": RULE},
                        },
                    },
                }
            },
        },
    },
}


def check_prometheus_operator_object(manifest: Manifest) -> None:
    schema = {"ServiceMonitor": SERVICE_MONITOR_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}
    jsonschema.validate(manifest, schema[manifest["kind"]])
    if manifest["kind"] == "PrometheusRule":  # groups is a list-map keyed by name in the CRD
        names = [g["name"] for g in manifest["spec"]["groups"]]
        assert len(names) == len(set(names)), f"duplicate rule group names: {names}"


SAMPLE_RULES = """\
groups:
  - name: topowatch-gpu
    rules:
      - alert: TopowatchGPUXid79
        expr: increase(topowatch_xid_errors_total{xid="79"}[10m]) > 0
        for: 0m
        labels: {severity: critical}
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.node }} fell off the bus"
          runbook_url: https://example.invalid/runbook.md#topowatchgpuxid79
"""


def test_prometheus_rule_carries_the_rules_file_verbatim(tmp_path: Path) -> None:
    chart = chart_copy(tmp_path)
    (chart / "rules").mkdir()
    (chart / "rules" / "topowatch-alerts.yaml").write_text(SAMPLE_RULES)
    manifests = render(chart, ACT_VALUES)
    rule = one(manifests, "PrometheusRule", "topowatch-alerts")
    assert rule["spec"] == yaml.safe_load(SAMPLE_RULES)  # {{ $labels }} survives, unrendered
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for manifest in manifests:
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            check_prometheus_operator_object(manifest)
    assert not objects(render(chart, None), "PrometheusRule")


def test_the_structural_check_refuses_what_the_operator_would() -> None:
    monitor = json.loads(json.dumps(objects(rendered("act"), "ServiceMonitor")[0]))
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        check_prometheus_operator_object(monitor)
    monitor = json.loads(json.dumps(objects(rendered("act"), "ServiceMonitor")[0]))
    monitor["spec"]["endpoints"][0]["relabelings"][0]["target_label"] = "instance"  # snake_case
    with pytest.raises(jsonschema.ValidationError):
        check_prometheus_operator_object(monitor)
    bad_rule = yaml.safe_load(SAMPLE_RULES)
    del bad_rule["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        check_prometheus_operator_object(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PrometheusRule",
                "metadata": {"name": "x"},
                "spec": bad_rule,
            }
        )


def test_chart_prometheus_operator_objects_are_well_formed() -> None:
    manifests = rendered("act")
    operator_objects = [
        m for m in manifests if m["apiVersion"].startswith("monitoring.coreos.com/")
    ]
    assert len(objects(manifests, "ServiceMonitor")) == 2
    models: dict[str, type[operator_v1.ServiceMonitor] | type[operator_v1.PrometheusRule]] = {
        "ServiceMonitor": operator_v1.ServiceMonitor,
        "PrometheusRule": operator_v1.PrometheusRule,
    }
    for manifest in operator_objects:
        check_prometheus_operator_object(manifest)
        models[manifest["kind"]].model_validate(manifest)  # raises on any CRD violation
    rules_copy = CHART / "rules" / "topowatch-alerts.yaml"
    if rules_copy.is_file():
        rule = one(manifests, "PrometheusRule", "topowatch-alerts")
        assert rule["spec"]["groups"] == yaml.safe_load(rules_copy.read_text())["groups"]
    else:
        assert not objects(manifests, "PrometheusRule")


# --- HyperPod labels: cluster_id, cluster_name, instance = node name ------------------------

HYPERPOD_LABELS = {"cluster_id": "abc123def456", "cluster_name": "ml-cluster"}
NODE_NAME = "hyperpod-i-0123456789abcdef0"
HYPERPOD_DOC = REPO / "docs" / "hyperpod-exporters.md"  # "Replacing dcgm-exporter and ..."


def endpoint_of(manifests: tuple[Manifest, ...] | list[Manifest], component: str) -> Manifest:
    monitor = one(manifests, "ServiceMonitor", f"{RELEASE}-{component}")
    endpoints: list[Manifest] = monitor["spec"]["endpoints"]
    assert len(endpoints) == 1
    return endpoints[0]


def monitor_values(**service_monitor: Any) -> dict[str, Any]:
    return {"serviceMonitor": {"enabled": True, **service_monitor}}


def test_service_monitors_add_the_static_labels_and_set_instance_to_the_node_name() -> None:
    labelled = render(CHART, monitor_values(staticLabels=HYPERPOD_LABELS))
    static = [
        {"targetLabel": name, "replacement": value, "action": "replace"}
        for name, value in sorted(HYPERPOD_LABELS.items())
    ]
    by_node = {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "instance",
        "action": "replace",
    }
    agent = endpoint_of(labelled, "node-agent")
    assert agent["relabelings"] == [by_node, *static]
    assert agent["honorLabels"] is True
    assert endpoint_of(labelled, "cluster")["relabelings"] == static  # not per node

    by_address = render(
        CHART, monitor_values(staticLabels=HYPERPOD_LABELS, instanceLabel="address")
    )
    assert endpoint_of(by_address, "node-agent")["relabelings"] == static
    assert "relabelings" not in endpoint_of(
        render(CHART, monitor_values(instanceLabel="address")), "node-agent"
    )
    # the default is the node name, with no static labels asked for
    assert endpoint_of(render(CHART, monitor_values()), "node-agent")["relabelings"] == [by_node]


def test_static_label_values_that_look_like_yaml_stay_strings() -> None:
    labels = {"cluster_id": "0123", "cluster_name": "true", "region": "us-east-1: a"}
    manifests = render(CHART, monitor_values(staticLabels=labels))
    relabelings = endpoint_of(manifests, "cluster")["relabelings"]
    assert {r["targetLabel"]: r["replacement"] for r in relabelings} == labels
    for manifest in objects(manifests, "ServiceMonitor"):
        check_prometheus_operator_object(manifest)
        operator_v1.ServiceMonitor.model_validate(manifest)


@pytest.mark.parametrize(
    "service_monitor",
    [
        {"staticLabels": {"__name__": "x"}},
        {"staticLabels": {"__address__": "x"}},
        {"staticLabels": {"9bad": "x"}},
        {"staticLabels": {"cluster-id": "x"}},
        {"staticLabels": {"cluster_id": 123}},
        {"instanceLabel": "pod"},
    ],
)
def test_schema_refuses_bad_static_labels_and_instance_modes(
    service_monitor: dict[str, Any],
) -> None:
    chart = helm.Chart.load(CHART)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"serviceMonitor": service_monitor})
    chart.validate_schema(monitor_values(staticLabels={"_private": "x", **HYPERPOD_LABELS}))


def readme_scrape_config() -> Manifest:
    """The plain Prometheus scrape config in the docs' HyperPod page (docs/hyperpod-exporters.md,
    once the README's HyperPod section)."""
    section = HYPERPOD_DOC.read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    [config] = [b for b in blocks if isinstance(b, dict) and "scrape_configs" in b]
    result: Manifest = config
    return result


def as_prometheus_relabel_config(relabeling: Manifest) -> Manifest:
    """A monitoring.coreos.com/v1 RelabelConfig as Prometheus' relabel_config spells it."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(key, key): value for key, value in relabeling.items()}


def service_monitor_job(job: str, endpoint: Manifest, meta: dict[str, str]) -> Manifest:
    """A scrape job with the ServiceMonitor endpoint's relabelings and honorLabels."""
    return {
        "job_name": job,
        "honor_labels": endpoint.get("honorLabels", False),
        "metrics_path": endpoint["path"],
        "scrape_interval": endpoint["interval"],
        "scrape_timeout": endpoint["scrapeTimeout"],
        "static_configs": [{"targets": ["127.0.0.1:9"], "labels": meta}],
        "relabel_configs": [as_prometheus_relabel_config(r) for r in endpoint["relabelings"]],
    }


def pod_target(address: str, component: str, port_name: str) -> Manifest:
    """What kubernetes_sd_configs role pod discovers for one container port of a chart pod."""
    return {
        "targets": [address],
        "labels": {
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "topowatch",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": component,
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_node_name": NODE_NAME,
        },
    }


def with_static_pods(job: Manifest) -> Manifest:
    """The job with kubernetes_sd_configs replaced by the targets it would discover.

    Debian's Prometheus is built without the Kubernetes service discovery (promtool refuses
    kubernetes_sd_configs as an unknown field); the relabeling is the same either way.
    """
    static = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    static["static_configs"] = [
        pod_target("127.0.0.1:9", "node-agent", "metrics"),
        pod_target("127.0.0.1:10", "node-agent", "health"),
        pod_target("127.0.0.1:11", "cluster", "metrics"),
    ]
    return static


def promtool_check(tmp_path: Path, config: Manifest) -> Path:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def relabelled_targets(tmp_path: Path, config: Manifest) -> dict[str, list[dict[str, str]]]:
    """Each job's target labels after relabeling, as a real Prometheus server computes them."""
    path = promtool_check(tmp_path, config)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed")
    port = free_port()
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    with subprocess.Popen(
        [
            prometheus,
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/api/v1/targets", timeout=2
                    ) as response:
                        active = json.load(response)["data"]["activeTargets"]
                except OSError:
                    active = []
                if {t["scrapePool"] for t in active} == jobs:
                    found: dict[str, list[dict[str, str]]] = {job: [] for job in jobs}
                    for target in active:
                        found[target["scrapePool"]].append(target["labels"])
                    return found
                time.sleep(0.25)
            pytest.fail("Prometheus did not discover every job's targets within 30 s")
        finally:
            server.terminate()
            server.wait(timeout=10)


def test_the_readme_scrape_config_keeps_the_agents_and_labels_them_for_hyperpod(
    tmp_path: Path,
) -> None:
    [job] = readme_scrape_config()["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert job["honor_labels"] is True  # per-GPU pod/namespace/container stay the workload's
    relabels = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_kubernetes_pod_node_name"],
        "target_label": "instance",
        "action": "replace",
    } in relabels
    static = {r["target_label"]: r["replacement"] for r in relabels if "source_labels" not in r}
    assert set(static) == {"cluster_id", "cluster_name"}

    targets = relabelled_targets(tmp_path, {"scrape_configs": [with_static_pods(job)]})
    # only the node agent's metrics port is scraped, named by its node and cluster
    assert targets == {job["job_name"]: [{"instance": NODE_NAME, "job": job["job_name"], **static}]}


def test_prometheus_applies_the_service_monitor_relabelings(tmp_path: Path) -> None:
    by_node = render(CHART, monitor_values(staticLabels=HYPERPOD_LABELS))
    by_address = render(
        CHART, monitor_values(staticLabels=HYPERPOD_LABELS, instanceLabel="address")
    )
    meta = {"__meta_kubernetes_pod_node_name": NODE_NAME}
    config = {
        "scrape_configs": [
            service_monitor_job("agent-by-node", endpoint_of(by_node, "node-agent"), meta),
            service_monitor_job("agent-by-address", endpoint_of(by_address, "node-agent"), meta),
            service_monitor_job("cluster", endpoint_of(by_node, "cluster"), meta),
        ]
    }
    assert config["scrape_configs"][0]["honor_labels"] is True
    targets = relabelled_targets(tmp_path, config)
    assert targets == {
        "agent-by-node": [{"instance": NODE_NAME, "job": "agent-by-node", **HYPERPOD_LABELS}],
        "agent-by-address": [
            {"instance": "127.0.0.1:9", "job": "agent-by-address", **HYPERPOD_LABELS}
        ],
        "cluster": [{"instance": "127.0.0.1:9", "job": "cluster", **HYPERPOD_LABELS}],
    }


def test_promtool_refuses_a_malformed_relabeling(tmp_path: Path) -> None:
    """The promtool check above would catch a relabeling Prometheus cannot use."""
    endpoint = endpoint_of(render(CHART, monitor_values(staticLabels=HYPERPOD_LABELS)), "cluster")
    endpoint["relabelings"][0]["action"] = "rename"
    job = service_monitor_job("cluster", endpoint, {})
    with pytest.raises(AssertionError, match="rename"):
        promtool_check(tmp_path, {"scrape_configs": [job]})


# --- dashboards ------------------------------------------------------------------------------


def test_each_dashboard_becomes_a_labelled_config_map(tmp_path: Path) -> None:
    chart = chart_copy(tmp_path)
    (chart / "dashboards").mkdir()
    dashboards = {
        "topowatch-fleet.json": {"uid": "topowatch-fleet", "title": "Fleet", "panels": []},
        "topowatch-node.json": {"uid": "topowatch-node", "title": "Node {{ not helm }}"},
    }
    for name, body in dashboards.items():
        (chart / "dashboards" / name).write_text(json.dumps(body, indent=2))
    manifests = render(chart, {"dashboards": {"annotations": {"grafana_folder": "GPU"}}})
    maps = [
        m for m in objects(manifests, "ConfigMap") if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    assert len(maps) == 2
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPU"}
        kubernetes_validate.validate(config_map, KUBE_VERSION, strict=True)
        ((name, text),) = config_map["data"].items()
        assert json.loads(text) == dashboards[name]
    assert not objects(render(chart, {"dashboards": {"enabled": False}}), "ConfigMap")


def test_chart_dashboards_render_one_config_map_each() -> None:
    carried = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    maps = [
        m
        for m in objects(rendered("default"), "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    assert sorted(name for m in maps for name in m["data"]) == carried
    for config_map in maps:  # the API server refuses ConfigMaps over 1 MiB
        assert sum(len(v.encode()) for v in config_map["data"].values()) < 1024 * 1024
        assert json.loads(next(iter(config_map["data"].values())))["uid"]
    assert len({m["metadata"]["name"] for m in maps}) == len(maps)


# --- chart assets stay in sync with their sources ------------------------------------------


def sync_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sync_chart_assets", REPO / "scripts" / "sync_chart_assets.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_copies_equal_their_sources() -> None:
    assert sync_script().drift(REPO) == []


def test_sync_copies_updates_and_prunes(tmp_path: Path) -> None:
    sync = sync_script()
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "rules").mkdir()
    (tmp_path / "dashboards" / "fleet.json").write_text('{"uid": "fleet"}')
    (tmp_path / "rules" / "topowatch-alerts.yaml").write_text("groups: []\n")
    stale = tmp_path / "charts" / "topowatch" / "dashboards" / "gone.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    assert len(sync.drift(tmp_path)) == 3
    sync.sync(tmp_path)
    assert sync.drift(tmp_path) == []
    assert not stale.exists()
    copied = tmp_path / "charts" / "topowatch" / "dashboards" / "fleet.json"
    assert copied.read_text() == '{"uid": "fleet"}'
    (tmp_path / "dashboards" / "fleet.json").write_text('{"uid": "fleet", "version": 2}')
    assert sync.drift(tmp_path) == [
        "out of date: charts/topowatch/dashboards/fleet.json (from dashboards/fleet.json)"
    ]
    assert sync.main(["--check", "--repo", str(tmp_path)]) == 1


# --- the image ----------------------------------------------------------------------------


def dockerfile_stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(FROM line, [(instruction, arguments)]) per stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append((arguments, []))
        else:
            assert stages, "instruction before the first FROM"
            stages[-1][1].append((instruction.upper(), arguments.strip()))
    return stages


def test_dockerfile_builds_a_wheel_then_installs_only_the_runtime() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    build_from, build = stages[0]
    final_from, final = stages[-1]
    assert " AS " in build_from.upper()
    assert any(i == "RUN" and "pip wheel" in a for i, a in build)
    assert final_from.split()[0] == "python:3.11-slim"
    installs = [a for i, a in final if i == "RUN" and "pip install" in a]
    assert len(installs) == 1 and "--no-index" in installs[0] and "topowatch" in installs[0]
    final_text = " ".join(a for _, a in final)
    for tool in ("gcc", "build-essential", "apt-get install", "make "):
        assert tool not in final_text
    assert not any(i == "COPY" and "exporter" in a for i, a in final), "source tree in final image"


def test_dockerfile_runs_topowatch_as_a_numeric_non_root_user() -> None:
    _, final = dockerfile_stages()[-1]
    users = [a for i, a in final if i == "USER"]
    assert users, "final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0
    entrypoints = [a for i, a in final if i == "ENTRYPOINT"]
    assert [json.loads(a) for a in entrypoints] == [["topowatch"]]


def test_dockerignore_keeps_the_context_to_the_package() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "exporter", "healthcheck"}


def test_the_operator_models_refuse_what_the_crd_refuses() -> None:
    """The generated models enforce the CRD's patterns: a human-style duration is refused."""
    with pytest.raises(ValueError):
        operator_v1.PrometheusRule.model_validate(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PrometheusRule",
                "metadata": {"name": "x"},
                "spec": {
                    "groups": [
                        {
                            "name": "g",
                            "rules": [{"alert": "A", "expr": "up == 0", "for": "5 minutes"}],
                        }
                    ]
                },
            }
        )


# --- more than one cluster replica: leader election ------------------------------------------

# More than one replica needs the history on PostgreSQL (SQLite is single-replica).
HA_VALUES: dict[str, Any] = {
    "cluster": {"replicas": 2},
    "history": {"postgresql": {"existingSecret": "topowatch-history-db"}},
}
LEASES = "coordination.k8s.io"


@cache
def rendered_ha() -> tuple[Manifest, ...]:
    return tuple(render(CHART, HA_VALUES))


def cluster_deployment(manifests: tuple[Manifest, ...]) -> Manifest:
    return one(manifests, "Deployment", "topowatch-cluster")


def test_one_replica_is_recreated_and_elects_nobody() -> None:
    """The default: one replica, Recreate (two overlapping pods would both act), no Lease, no
    budget that would block every drain of its node."""
    manifests = rendered("default")
    deployment = cluster_deployment(manifests)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in args_of(deployment["spec"]["template"]["spec"]) if "leader" in a]
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"PodDisruptionBudget", "Role", "RoleBinding"}


def test_two_replicas_lint_and_pass_strict_kubernetes_validation() -> None:
    report = helm.lint(CHART, HA_VALUES, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    core = [m for m in rendered_ha() if not m["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {m["kind"] for m in core} >= {"PodDisruptionBudget", "Role", "RoleBinding"}
    for manifest in core:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_two_replicas_roll_and_elect_a_leader_on_their_own_lease() -> None:
    from exporter.cluster.leader.election import add_arguments

    deployment = cluster_deployment(rendered_ha())
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    spec = deployment["spec"]["template"]["spec"]
    args = args_of(spec)
    assert "--leader-elect" in args
    assert flag(args, "--leader-elect-namespace") == NAMESPACE
    assert flag(args, "--leader-elect-lease-name") == "topowatch-cluster"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # the flags are the ones the service's Leadership reads
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    start = args.index("--leader-elect")
    parsed = parser.parse_args(args[start : start + 5])
    assert parsed.leader_elect and parsed.leader_elect_namespace == NAMESPACE
    assert parsed.leader_elect_lease_name == "topowatch-cluster"


def test_leader_election_may_write_only_its_own_lease_in_the_release_namespace() -> None:
    manifests = rendered_ha()
    role = one(manifests, "Role", "topowatch-cluster-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert granted(role) == {(LEASES, "leases", verb) for verb in ("get", "update", "create")}
    for rule in role["rules"]:
        if "create" in rule["verbs"]:
            # RBAC cannot limit a create by name: the object does not exist when it is checked
            assert rule["verbs"] == ["create"] and "resourceNames" not in rule
        else:
            assert rule["resourceNames"] == ["topowatch-cluster"]
    binding = one(manifests, "RoleBinding", "topowatch-cluster-leader-election")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "topowatch-cluster-leader-election",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "topowatch-cluster", "namespace": NAMESPACE}
    ]
    # the cluster-wide role is what it was: read-only without remediation
    cluster_role = granted(one(manifests, "ClusterRole", "topowatch-cluster"))
    assert cluster_role == granted(one(rendered("default"), "ClusterRole", "topowatch-cluster"))
    assert not {grant for grant in cluster_role if grant[2] in WRITE_VERBS}


def test_two_replicas_keep_one_through_voluntary_disruptions() -> None:
    manifests = rendered_ha()
    budget = one(manifests, "PodDisruptionBudget", "topowatch-cluster")
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"]["minAvailable"] == 1
    pod_labels = cluster_deployment(manifests)["spec"]["template"]["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert selector == cluster_deployment(manifests)["spec"]["selector"]["matchLabels"]


def test_rbac_off_leaves_out_the_lease_role_too() -> None:
    values = {"cluster": {"replicas": 3}, "rbac": {"create": False}, "history": {"enabled": False}}
    manifests = render(CHART, values)
    assert not {m["kind"] for m in manifests} & {"Role", "RoleBinding"}
    assert "--leader-elect" in args_of(
        cluster_deployment(tuple(manifests))["spec"]["template"]["spec"]
    )


@pytest.mark.parametrize("replicas", [0, "2", 1.5])
def test_schema_refuses_a_replica_count_that_is_not_a_positive_integer(replicas: object) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({"cluster": {"replicas": replicas}})


# --- the cluster service's history store -----------------------------------------------------

HISTORY_DIR = "/var/lib/topowatch"
SQLITE_URL = "sqlite:////var/lib/topowatch/history.db"
HISTORY_FLAGS = (
    "--database-url",
    "--history-retention",
    "--history-max-rows",
    "--history-ephemeral",
)


def cluster_spec(manifests: tuple[Manifest, ...] | list[Manifest]) -> Manifest:
    return dict(pod_specs(tuple(manifests)))["topowatch-cluster"]


def cluster_env(spec: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in spec["containers"][0].get("env", [])}


def sqlite_path(url: str) -> Path:
    """The file of a sqlite:////absolute/path URL (four slashes: an absolute path)."""
    assert url.startswith("sqlite:////"), url
    return Path(url.removeprefix("sqlite:///"))


def validate_all(manifests: tuple[Manifest, ...] | list[Manifest]) -> None:
    for manifest in manifests:
        if not manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_by_default_history_is_sqlite_on_a_kept_claim_the_non_root_pod_can_write() -> None:
    manifests = rendered("default")
    claim = one(manifests, "PersistentVolumeClaim", "topowatch-cluster-history")
    assert claim["metadata"]["namespace"] == NAMESPACE
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "20Gi"}}
    assert "storageClassName" not in claim["spec"]  # the cluster's default StorageClass
    spec = cluster_spec(manifests)
    args = args_of(spec)
    url = flag(args, "--database-url")
    assert url == SQLITE_URL
    # the database file lies on the claim's volume, mounted writable
    mount, volume, name = mounted_file(spec, str(sqlite_path(url)))
    assert name == "history.db" and mount["mountPath"] == HISTORY_DIR
    assert not mount.get("readOnly")
    assert volume["persistentVolumeClaim"] == {"claimName": "topowatch-cluster-history"}
    assert flag(args, "--history-retention") == "90d"
    assert flag(args, "--history-max-rows") == "10000000"  # not 1e+07
    assert "--history-ephemeral" not in args
    assert "TOPOWATCH_DATABASE_URL" not in cluster_env(spec)
    # the kubelet gives the volume to the pod's group: uid 65532 may write it, still non-root
    pod = spec["securityContext"]
    assert pod["fsGroup"] == pod["runAsGroup"] == 65532
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532
    assert container_context(spec)["readOnlyRootFilesystem"] is True
    # the node agent writes no volume and gets no fsGroup
    assert "fsGroup" not in agent_spec(manifests)["securityContext"]
    # one replica, replaced by Recreate: the RWO volume is let go before the new pod mounts it
    assert cluster_deployment(manifests)["spec"]["strategy"] == {"type": "Recreate"}


def test_the_claim_follows_its_values() -> None:
    persistence = {
        "size": "50Gi",
        "storageClass": "gp3",
        "accessModes": ["ReadWriteOncePod"],
        "keepOnUninstall": False,
    }
    manifests = render(CHART, {"history": {"persistence": persistence, "maxRows": 250000000}})
    validate_all(manifests)
    claim = one(manifests, "PersistentVolumeClaim", "topowatch-cluster-history")
    assert "annotations" not in claim["metadata"]
    assert claim["spec"]["storageClassName"] == "gp3"
    assert claim["spec"]["accessModes"] == ["ReadWriteOncePod"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert flag(args_of(cluster_spec(manifests)), "--history-max-rows") == "250000000"
    static = render(CHART, {"history": {"persistence": {"storageClass": "-"}}})
    claim = one(static, "PersistentVolumeClaim", "topowatch-cluster-history")
    assert claim["spec"]["storageClassName"] == ""  # bind a pre-created PersistentVolume


def test_an_existing_claim_is_mounted_and_none_is_created() -> None:
    manifests = render(CHART, {"history": {"persistence": {"existingClaim": "my-history"}}})
    validate_all(manifests)
    assert not objects(manifests, "PersistentVolumeClaim")
    spec = cluster_spec(manifests)
    assert volumes_of(spec)["history"]["persistentVolumeClaim"] == {"claimName": "my-history"}
    assert flag(args_of(spec), "--database-url") == SQLITE_URL
    assert spec["securityContext"]["fsGroup"] == 65532


def test_without_persistence_history_is_an_ephemeral_empty_dir_and_the_notes_warn() -> None:
    manifests = rendered("ephemeral")
    assert not objects(manifests, "PersistentVolumeClaim")
    spec = cluster_spec(manifests)
    args = args_of(spec)
    assert "--history-ephemeral" in args
    mount, volume, _ = mounted_file(spec, str(sqlite_path(flag(args, "--database-url"))))
    assert mount["mountPath"] == HISTORY_DIR
    assert volume == {"name": "history", "emptyDir": {}}
    assert flag(args, "--history-retention") == "90d"
    assert spec["securityContext"]["fsGroup"] == 65532
    warning = notes(EPHEMERAL_VALUES)
    assert "HISTORY IS EPHEMERAL" in warning and "LOST WITH THE POD" in warning
    assert "history.persistence.enabled=false" in warning
    default = notes(None)
    assert "EPHEMERAL" not in default
    assert "topowatch-cluster-history" in default and "helm.sh/resource-policy: keep" in default


def test_postgresql_takes_its_url_from_the_secret_and_needs_no_volume() -> None:
    manifests = rendered("postgresql")
    assert not objects(manifests, "PersistentVolumeClaim")
    spec = cluster_spec(manifests)
    args = args_of(spec)
    assert "--database-url" not in args  # the service falls back on TOPOWATCH_DATABASE_URL
    assert not [a for a in args if "postgresql://" in a or "sqlite:" in a]
    assert "--history-ephemeral" not in args
    assert flag(args, "--history-retention") == "90d"
    assert flag(args, "--history-max-rows") == "10000000"
    assert cluster_env(spec)["TOPOWATCH_DATABASE_URL"] == {
        "name": "TOPOWATCH_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "topowatch-history-db", "key": "database-url"}},
    }
    assert "history" not in volumes_of(spec) and "history" not in mounts_of(spec)
    assert "fsGroup" not in spec["securityContext"]
    assert "PostgreSQL" in notes(POSTGRESQL_VALUES)


@pytest.mark.parametrize(
    "history",
    [{}, {"persistence": {"enabled": False}}, {"persistence": {"existingClaim": "mine"}}],
    ids=["claim", "ephemeral", "existing-claim"],
)
def test_more_than_one_replica_on_sqlite_is_refused(history: dict[str, Any]) -> None:
    values = {"cluster": {"replicas": 2}, "history": history}
    with pytest.raises(helm.HelmError, match=r"cluster\.replicas=2 with history on SQLite") as err:
        render(CHART, values)
    message = str(err.value)
    assert "single replica" in message
    assert "history.postgresql.existingSecret" in message and "history.enabled=false" in message


def test_more_than_one_replica_on_postgresql_rolls() -> None:
    manifests = rendered_ha()
    deployment = cluster_deployment(manifests)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not objects(manifests, "PersistentVolumeClaim")
    env = cluster_env(deployment["spec"]["template"]["spec"])
    assert env["TOPOWATCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "topowatch-history-db",
        "key": "url",
    }
    # history off also lets several replicas run, with nothing of the store
    off = render(CHART, {"cluster": {"replicas": 2}, "history": {"enabled": False}})
    assert cluster_deployment(tuple(off))["spec"]["strategy"]["type"] == "RollingUpdate"


def test_history_disabled_renders_none_of_it() -> None:
    values = {
        "history": {
            "enabled": False,
            "postgresql": {"existingSecret": "ignored"},
            "persistence": {"enabled": False},
        }
    }
    for history_values in ({"history": {"enabled": False}}, values):
        manifests = render(CHART, history_values)
        validate_all(manifests)
        assert not objects(manifests, "PersistentVolumeClaim")
        spec = cluster_spec(manifests)
        args = args_of(spec)
        assert not [a for a in args if a in HISTORY_FLAGS or a.startswith("--history")]
        assert "TOPOWATCH_DATABASE_URL" not in cluster_env(spec)
        assert "history" not in volumes_of(spec) and "history" not in mounts_of(spec)
        assert "fsGroup" not in spec["securityContext"]
        assert cluster_deployment(tuple(manifests))["spec"]["strategy"] == {"type": "Recreate"}
    assert "History: off" in notes({"history": {"enabled": False}})


@pytest.mark.parametrize(
    "history",
    [
        {"retention": "90"},
        {"retention": "90days"},
        {"retention": "1w"},
        {"retention": "-1d"},
        {"retention": "1h30m"},
        {"retention": 90},
        {"maxRows": "1000"},
        {"maxRows": 0},
        {"enabled": "true"},
        {"persistence": {"enable": True}},
        {"persistence": {"size": "20 GB"}},
        {"persistence": {"accessModes": []}},
        {"persistence": {"accessModes": ["ReadOnlyMany"]}},
        {"persistence": {"keepOnUninstall": "yes"}},
        {"postgresql": {"url": "postgresql://u:p@db/x"}},  # the URL belongs in a Secret
        {"postgresql": {"key": ""}},
        {"sqlite": {}},
    ],
)
def test_schema_refuses_history_values_of_the_wrong_shape(history: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({"history": history})


@pytest.mark.parametrize("retention", ["90d", "36h", "1.5d", "30m", "3600s"])
def test_schema_accepts_the_retentions_the_service_takes(retention: str) -> None:
    helm.Chart.load(CHART).validate_schema({"history": {"retention": retention}})
    args = args_of(cluster_spec(render(CHART, {"history": {"retention": retention}})))
    assert flag(args, "--history-retention") == retention
