"""The `admission:` settings (validated with errors naming the key) and the parsers of both
Kueue API versions: AdmissionCheck, ClusterQueue check lists (v1beta1 `admissionChecks`,
v1beta2 `admissionChecksStrategy` with onFlavors), Workload check entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.cluster.admission.parse import (
    parse_admission_check,
    parse_check_strategy,
    parse_workload_checks,
)
from exporter.cluster.admission.settings import (
    AdmissionSettings,
    AdmissionSettingsError,
    settings_from_mapping,
)
from exporter.cluster.run import RemediationConfigError, read_cluster_config
from exporter.sim import synthetic as s
from tests.cluster.admission.world import CHECK, OTHER, admission_check, entry, workload
from tests.crds import assert_valid_kueue


def test_defaults_off_and_observe() -> None:
    assert settings_from_mapping({}) == AdmissionSettings()
    assert settings_from_mapping(None).enabled is False
    on = settings_from_mapping(
        {
            "admission": {
                "enabled": True,
                "mode": "enforce",
                "checks": ["topowatch-node-health"],
                "fail_open_seconds": 30,
                "reject": True,
            }
        }
    )
    assert on == AdmissionSettings(True, "enforce", ("topowatch-node-health",), 30.0, True)
    assert on.writes and not AdmissionSettings(enabled=True).writes


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"mode": "act"}, "admission.mode: expected observe or enforce, got 'act'"),
        ({"enabled": "yes"}, "admission.enabled: expected true or false"),
        ({"fail_open_seconds": -1}, "admission.fail_open_seconds: must be at least 0"),
        ({"fail_open_seconds": "2m"}, "admission.fail_open_seconds: expected a number"),
        ({"checks": "topowatch-node-health"}, "admission.checks: expected a list"),
        ({"fail_open": 30}, "admission: unknown key(s) fail_open"),
    ],
)
def test_bad_settings_name_the_key(section: dict[str, object], says: str) -> None:
    with pytest.raises(AdmissionSettingsError, match="^" + re.escape(says)):
        settings_from_mapping({"admission": section})


def test_config_file(tmp_path: Path) -> None:
    good = tmp_path / "cluster.yaml"
    good.write_text("admission:\n  enabled: true\n  mode: enforce\n")
    assert read_cluster_config(good).writes
    typo = tmp_path / "typo.yaml"
    typo.write_text("admision:\n  enabled: true\n")
    with pytest.raises(RemediationConfigError, match="unknown section"):
        read_cluster_config(typo)


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_admission_check_both_versions(version: str) -> None:
    info = parse_admission_check(admission_check(version=version, active=True))
    assert info is not None
    assert (info.name, info.controller_name, info.active) == (
        CHECK,
        "topowatch.io/node-health",
        True,
    )
    assert info.problems == ()
    bad = admission_check(
        version=version, parameters={"apiGroup": "x.io", "kind": "Cfg", "name": "a"}
    )
    parsed = parse_admission_check(bad)
    assert parsed is not None
    assert parsed.problems == (
        f"AdmissionCheck {CHECK}: spec.parameters names x.io/Cfg a, but "
        "topowatch.io/node-health takes none; ignored",
    )


def test_cluster_queue_check_lists() -> None:
    """v1beta1 lists plain names (every flavor); the strategy's onFlavors limits a check, an
    empty onFlavors means every flavor (pkg/util/admissioncheck NewAdmissionChecks)."""
    v1beta1 = s.cluster_queue("cq", 8)
    v1beta1["apiVersion"] = "kueue.x-k8s.io/v1beta1"
    v1beta1["spec"].pop("cohortName", None)
    v1beta1["spec"]["admissionChecks"] = [CHECK]
    problems: list[str] = []
    assert parse_check_strategy(v1beta1, problems) == ("cq", {CHECK: None})
    v1beta2 = s.cluster_queue("cq", 8)
    v1beta2["spec"]["admissionChecksStrategy"] = {
        "admissionChecks": [{"name": CHECK, "onFlavors": ["a", "b"]}, {"name": OTHER}]
    }
    assert_valid_kueue(v1beta2)
    assert parse_check_strategy(v1beta2, problems) == (
        "cq",
        {CHECK: frozenset({"a", "b"}), OTHER: None},
    )
    assert problems == []


@pytest.mark.parametrize("v1beta1", [True, False])
def test_workload_entries(v1beta1: bool) -> None:
    raw = workload(
        entries=[entry(CHECK, "Pending"), entry(OTHER, "Ready", message="ok")], v1beta1=v1beta1
    )
    checks = parse_workload_checks(raw)
    assert checks is not None
    assert [(e.name, e.state, e.message) for e in checks.entries] == [
        (CHECK, "Pending", ""),
        (OTHER, "Ready", "ok"),
    ]
    assert checks.resource_version == "5"
    assert checks.raw_entries == tuple(raw["status"]["admissionChecks"])
    odd = workload(entries=[entry(CHECK, "Pending")])
    odd["status"]["admissionChecks"][0]["state"] = "Maybe"
    parsed = parse_workload_checks(odd)
    assert parsed is not None and parsed.entries[0].state == ""
    assert parsed.problems == ("status.admissionChecks[0] (topowatch-node-health): state 'Maybe'",)
