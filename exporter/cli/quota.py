"""The `topowatch quota` arguments, apart from the command that runs them.

Every `topowatch` invocation builds the whole parser, the node agent's included; the advisor it
runs needs the cluster model. Keeping the arguments here lets the node agent, on every GPU node,
parse its command line without loading the cluster service (tests/test_architecture.py checks).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_quota_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    quota = sub.add_parser(
        "quota",
        help="topology-aware quota advice for Kueue / HyperPod task governance",
        description="Quota advice from what the cluster did.",
    )
    actions = quota.add_subparsers(dest="quota_command", required=True)
    adv = actions.add_parser(
        "advise",
        help="recommend nominal quota, borrowing/lending limits and topology changes",
        description=(
            "Print quota recommendations, or emit them as SageMaker UpdateComputeQuota requests "
            "(--emit hyperpod) or ClusterQueue merge patches (--emit kueue). Nothing is "
            "applied without --apply."
        ),
    )
    source = adv.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="dump",
        type=Path,
        metavar="DUMP.yaml",
        help="kubectl get nodes,pods,workloads,clusterqueues,localqueues,events -A -o yaml",
    )
    source.add_argument("--server", metavar="URL", help="a running `topowatch cluster`")
    adv.add_argument("--emit", choices=("hyperpod", "kueue"), help="write changes as JSON")
    adv.add_argument(
        "--quota-ids",
        type=Path,
        metavar="FILE",
        help="HyperPod compute quota ids: `aws sagemaker list-compute-quotas` output, or "
        "team: {ComputeQuotaId, TargetVersion} (without it, --apply looks them up)",
    )
    adv.add_argument("--cluster-arn", help="HyperPod cluster whose compute quotas to look up")
    adv.add_argument("--region", help="AWS region for --apply (default: the AWS config's)")
    adv.add_argument(
        "--apply", action="store_true", help="call SageMaker UpdateComputeQuota (asks first)"
    )
    adv.add_argument("--yes", action="store_true", help="apply without asking")
    adv.add_argument("--json", action="store_true", help="recommendations as JSON")
    adv.set_defaults(func=_run_quota_advise)


def _run_quota_advise(args: argparse.Namespace) -> int:
    from exporter.cli.quota_advise import run_quota_advise

    return run_quota_advise(args)
