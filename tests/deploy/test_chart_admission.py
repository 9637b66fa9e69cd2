"""The chart's admission check (issue 30): off by default; on, an AdmissionCheck for our
controller (valid against Kueue's CRD), a --config the service accepts, RBAC that reads in
observe mode and patches only workloads/status and admissionchecks/status in enforce mode, and
no ClusterQueue touched."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from exporter.cluster.admission.settings import settings_from_mapping
from tests.crds import assert_valid_kueue
from tests.deploy.test_chart import (
    CHART,
    KUBE_VERSION,
    WRITE_VERBS,
    args_of,
    flag,
    granted,
    one,
    pod_specs,
    render,
    rendered,
)


@cache
def with_admission(
    mode: str, version: str = "kueue.x-k8s.io/v1beta1", fail_open: int = 90
) -> list[dict[str, Any]]:
    values = {"enabled": True, "mode": mode, "apiVersion": version, "failOpenSeconds": fail_open}
    return render(CHART, {"admission": values})


def test_off_by_default() -> None:
    manifests = rendered("default")
    assert not [m for m in manifests if m["kind"] == "AdmissionCheck"]
    assert "--config" not in args_of(dict(pod_specs(manifests))["topowatch-cluster"])
    role = granted(one(manifests, "ClusterRole", "topowatch-cluster"))
    assert not {g for g in role if g[1].startswith("admissionchecks") or g[1].endswith("/status")}


@pytest.mark.parametrize("version", ["kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2"])
def test_admission_check_object_and_config(version: str) -> None:
    manifests = with_admission("enforce", version)
    check = one(manifests, "AdmissionCheck", "topowatch-node-health")
    assert check["apiVersion"] == version
    assert check["spec"] == {"controllerName": "topowatch.io/node-health"}
    assert_valid_kueue(check)
    assert not [m for m in manifests if m["kind"] == "ClusterQueue"]  # the admin's step
    for manifest in manifests:
        if manifest["apiVersion"].startswith(("kueue.x-k8s.io/", "monitoring.coreos.com/")):
            continue
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    spec = dict(pod_specs(tuple(manifests)))["topowatch-cluster"]
    path = Path(flag(args_of(spec), "--config"))
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert str(path.parent) == mounts["config"]
    config_map = one(manifests, "ConfigMap", volumes["config"]["configMap"]["name"])
    settings = settings_from_mapping(yaml.safe_load(config_map["data"][path.name]))
    assert settings.enabled and settings.mode == "enforce"
    assert settings.checks == ("topowatch-node-health",)
    assert settings.fail_open_seconds == 90.0 and not settings.reject


@pytest.mark.parametrize(
    ("mode", "writes"),
    [
        ("observe", set()),
        (
            "enforce",
            {
                ("kueue.x-k8s.io", "workloads/status", "patch"),
                ("kueue.x-k8s.io", "admissionchecks/status", "patch"),
            },
        ),
    ],
)
def test_rbac_reads_in_observe_and_patches_only_status_in_enforce(
    mode: str, writes: set[tuple[str, str, str]]
) -> None:
    role = granted(one(with_admission(mode), "ClusterRole", "topowatch-cluster"))
    assert ("kueue.x-k8s.io", "admissionchecks", "list") in role
    assert {g for g in role if g[2] in WRITE_VERBS} == writes
    assert ("kueue.x-k8s.io", "workloads", "patch") not in role  # never the spec


def test_schema_refuses_bad_admission_values() -> None:
    from helm_python import HelmError  # type: ignore[import-untyped]

    with pytest.raises(HelmError):
        with_admission("act")
