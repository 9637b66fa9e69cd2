"""Live AWS calls: EC2 DescribeInstanceTopology and the HyperPod node list of SageMaker.

The only I/O of `topowatch topology`: everything returned here is plain data (response pages,
ClusterNode records) for the pure parsers and writers. Throttling is left to botocore's own
retry machinery (standard mode, RETRY_ATTEMPTS tries with jittered backoff), which honours the
service's throttling codes better than a loop of ours would.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_sagemaker import SageMakerClient

__all__ = [
    "MAX_IDS_PER_CALL",
    "RETRY_ATTEMPTS",
    "ClusterNode",
    "describe_instance_topology",
    "ec2_client",
    "hyperpod_node_name",
    "hyperpod_nodes",
    "retry_config",
    "sagemaker_client",
]

MAX_IDS_PER_CALL = 100  # DescribeInstanceTopology: at most 100 instance ids / group names
RETRY_ATTEMPTS = 10


def retry_config(attempts: int = RETRY_ATTEMPTS) -> Config:
    return Config(retries={"mode": "standard", "max_attempts": attempts})


def ec2_client(region: str | None = None, profile: str | None = None) -> EC2Client:
    session = boto3.session.Session(profile_name=profile, region_name=region)
    return session.client("ec2", config=retry_config())


def sagemaker_client(region: str | None = None, profile: str | None = None) -> SageMakerClient:
    session = boto3.session.Session(profile_name=profile, region_name=region)
    return session.client("sagemaker", config=retry_config())


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def describe_instance_topology(
    ec2: EC2Client, instance_ids: Sequence[str] = (), group_names: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Every response page, for the given instances and/or placement groups (all when none).

    Ids and group names go in batches of MAX_IDS_PER_CALL, each batch followed through its
    NextToken pages. MaxResults may only be sent without instance ids, as the API requires.
    """
    id_batches: list[list[str]] = list(
        _chunks(list(dict.fromkeys(instance_ids)), MAX_IDS_PER_CALL)
    ) or [[]]
    group_batches: list[list[str]] = list(
        _chunks(list(dict.fromkeys(group_names)), MAX_IDS_PER_CALL)
    ) or [[]]
    pages: list[dict[str, Any]] = []
    for ids in id_batches:
        for groups in group_batches:
            request: dict[str, Any] = {}
            if ids:
                request["InstanceIds"] = ids
            else:
                request["MaxResults"] = MAX_IDS_PER_CALL
            if groups:
                request["GroupNames"] = groups
            while True:
                response = dict(ec2.describe_instance_topology(**request))
                response.pop("ResponseMetadata", None)
                token = response.pop("NextToken", None)
                pages.append(response)
                if not token:
                    break
                request["NextToken"] = token
    return pages


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A HyperPod node: its instance id and the host name HyperPod gives it ("" if unknown)."""

    instance_id: str
    name: str
    instance_group: str
    status: str


def hyperpod_node_name(dns_hostname: str, private_ip: str) -> str:
    """HyperPod's node name (ip-10-1-2-3) from the private DNS name, else from the IP."""
    if dns_hostname:
        return dns_hostname.split(".", 1)[0]
    try:
        address = ipaddress.IPv4Address(private_ip)
    except ValueError:
        return ""
    return "ip-" + str(address).replace(".", "-")


def hyperpod_nodes(sagemaker: SageMakerClient, cluster: str) -> list[ClusterNode]:
    """The cluster's nodes (ListClusterNodes, all pages), named from the host name it reports.

    Older API versions leave PrivateDnsHostname out of the list; those nodes are described one
    by one (DescribeClusterNode), which also gives the IP when no DNS name is set.
    """
    nodes: list[ClusterNode] = []
    request: dict[str, Any] = {"ClusterName": cluster, "MaxResults": 100}
    while True:
        response = sagemaker.list_cluster_nodes(**request)
        for summary in response.get("ClusterNodeSummaries", []):
            instance_id = summary.get("InstanceId", "")
            if not instance_id:
                continue
            name = hyperpod_node_name(summary.get("PrivateDnsHostname", ""), "")
            if not name:
                details = sagemaker.describe_cluster_node(
                    ClusterName=cluster, NodeId=instance_id
                ).get("NodeDetails", {})
                name = hyperpod_node_name(
                    details.get("PrivateDnsHostname", ""), details.get("PrivatePrimaryIp", "")
                )
            nodes.append(
                ClusterNode(
                    instance_id=instance_id,
                    name=name,
                    instance_group=summary.get("InstanceGroupName", ""),
                    status=summary.get("InstanceStatus", {}).get("Status", ""),
                )
            )
        token = response.get("NextToken")
        if not token:
            return nodes
        request["NextToken"] = token
