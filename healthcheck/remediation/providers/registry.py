"""Providers from the `providers:` list of the remediation config (YAML), by name.

Each entry is a name (`hyperpod`) or a mapping with `name` and that provider's settings. A bad
entry raises ConfigError at startup, with the entry it is about: failing loud before acting is
the safe answer to a config nobody can read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from healthcheck.remediation.providers.base import Provider

NAMES = ("hyperpod", "sagemaker-api", "slurm", "kubernetes", "webhook")


class ConfigError(ValueError):
    pass


def build_providers(specs: Any, core_v1: Any | None) -> list[Provider]:
    """`core_v1` (a kubernetes CoreV1Api) is needed by hyperpod and kubernetes only."""
    if specs is None:
        return []
    if not isinstance(specs, Sequence) or isinstance(specs, str):
        raise ConfigError("providers must be a list")
    providers: list[Provider] = []
    for index, spec in enumerate(specs):
        settings: Mapping[str, Any] = {"name": spec} if isinstance(spec, str) else spec
        if not isinstance(settings, Mapping) or settings.get("name") not in NAMES:
            raise ConfigError(f"providers[{index}]: expected one of {', '.join(NAMES)}: {spec!r}")
        try:
            providers.append(_build(settings, core_v1))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"providers[{index}] ({settings['name']}): {exc}") from exc
    return providers


def _build(settings: Mapping[str, Any], core_v1: Any | None) -> Provider:
    name = settings["name"]
    if name in ("hyperpod", "kubernetes") and core_v1 is None:
        raise ValueError("needs the Kubernetes API")
    if name == "hyperpod":
        from healthcheck.remediation.providers.hyperpod import HyperPodLabeler

        return HyperPodLabeler(core_v1)
    if name == "kubernetes":
        from healthcheck.remediation.providers.kubernetes import Cordoner

        return Cordoner(core_v1)
    if name == "sagemaker-api":
        import boto3

        from healthcheck.remediation.providers.sagemaker import (
            DEFAULT_DEEP_CHECKS,
            INSTANCE_GROUP_LABEL,
            SageMakerNodes,
        )

        cluster = settings["cluster"]
        if not isinstance(cluster, str) or not cluster:
            raise ValueError("cluster (the HyperPod cluster name or ARN) is required")
        client = boto3.client("sagemaker", region_name=settings.get("region"))
        checks = settings.get("deep_checks", list(DEFAULT_DEEP_CHECKS))
        if not isinstance(checks, list):
            raise ValueError("deep_checks must be a list (InstanceStress, InstanceConnectivity)")
        return SageMakerNodes(
            client,
            cluster,
            max_attempts=int(settings.get("max_attempts", 5)),
            deep_checks=checks,
            instance_group_label=str(settings.get("instance_group_label", INSTANCE_GROUP_LABEL)),
        )
    if name == "slurm":
        from healthcheck.remediation.providers.slurm import SlurmNodes

        return SlurmNodes(
            scontrol=str(settings.get("scontrol", "scontrol")),
            timeout_s=float(settings.get("timeout_seconds", 15)),
            name_label=settings.get("node_name_label"),
        )
    from healthcheck.remediation.providers.webhook import WebhookNotifier

    return WebhookNotifier(
        str(settings["url"]), timeout_s=float(settings.get("timeout_seconds", 5))
    )
