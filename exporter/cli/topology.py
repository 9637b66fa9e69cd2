"""`topowatch topology from-ec2|check|live`: argument wiring and exit codes.

Exit codes: 0 done; 1 the output is not usable as is (topology/block rule violations) or, for
`check`, topology.conf has drifted; 2 the input could not be used (bad file, bad flags, AWS
refused), always with a one-line reason on stderr and never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.topology.drift import SlurmTopologyError, compare, parse_topology_conf
from exporter.topology.ec2 import (
    Topology,
    TopologyInputError,
    instances_from_pages,
    load_name_map,
    load_pages,
    named_topology,
)
from exporter.topology.writers import FORMATS, render

if TYPE_CHECKING:  # boto3 adds ~24 MiB of RSS: only the `topology` commands load it
    from exporter.sources.aws import ClusterNode

__all__ = [
    "add_topology_parser",
    "live_mermaid",
    "load_topology",
    "run_check",
    "run_from_ec2",
    "run_live",
]


def _split_list(value: str) -> list[str]:
    return [item for item in value.replace(",", " ").split() if item]


def _block_sizes(value: str) -> list[int]:
    try:
        return [int(item) for item in _split_list(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 16,32, got {value!r}") from None


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("topology source (one of)")
    source.add_argument(
        "--input", type=Path, metavar="FILE", help="saved DescribeInstanceTopology JSON (pages)"
    )
    source.add_argument(
        "--instance-ids", type=_split_list, metavar="IDS", help="live call for these instances"
    )
    source.add_argument(
        "--group-names", type=_split_list, metavar="NAMES", help="live call: placement groups"
    )
    source.add_argument(
        "--cluster", metavar="NAME", help="HyperPod cluster: its nodes from SageMaker"
    )
    parser.add_argument("--region", default=None, help="AWS region (default: your AWS config)")
    parser.add_argument("--profile", default=None, help="AWS profile")
    names = parser.add_mutually_exclusive_group()
    names.add_argument(
        "--names",
        choices=("instance-id", "hyperpod"),
        default="instance-id",
        help="node names: instance ids, or HyperPod's ip-A-B-C-D (needs --cluster)",
    )
    names.add_argument(
        "--name-map",
        type=Path,
        metavar="FILE",
        help="instance id -> node name: a JSON object or 'INSTANCE-ID NAME' lines",
    )


def add_topology_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topology = sub.add_parser(
        "topology",
        help="network topology: from EC2 (Slurm, labels, maps) or the live cluster service",
        description="Build or check topology files from EC2 DescribeInstanceTopology.",
    )
    actions = topology.add_subparsers(dest="topology_command", required=True)
    from_ec2 = actions.add_parser(
        "from-ec2",
        help="write a topology in one of several formats",
        description="Read EC2's network topology (saved or live) and write it out.",
    )
    _add_source_arguments(from_ec2)
    from_ec2.add_argument("--format", choices=FORMATS, default="slurm-tree")
    from_ec2.add_argument(
        "--block-sizes",
        type=_block_sizes,
        default=None,
        metavar="N,M",
        help="slurm-block: BlockSizes (default: the smallest block)",
    )
    from_ec2.set_defaults(func=run_from_ec2)
    check = actions.add_parser(
        "check",
        help="compare a topology.conf with EC2: exit 1 on drift",
        description="Report nodes missing from, moved within, or stale in a topology.conf.",
    )
    check.add_argument("--slurm", type=Path, required=True, metavar="topology.conf")
    _add_source_arguments(check)
    check.set_defaults(func=run_check)
    live = actions.add_parser(
        "live",
        help="the live cluster's topology, with free GPUs, from a running cluster service",
        description="Read /api/v1/topology from `topowatch cluster` and print it.",
    )
    live.add_argument("--server", required=True, metavar="URL", help="cluster service base URL")
    live.add_argument("--format", choices=("mermaid", "json"), default="mermaid")
    live.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    live.set_defaults(func=run_live)


def load_topology(args: argparse.Namespace) -> Topology:
    """The topology and node names the flags ask for. Raises TopologyInputError, AWS errors."""
    from exporter.sources import aws

    cluster_nodes: list[ClusterNode] | None = None

    def nodes_of_cluster() -> list[ClusterNode]:
        nonlocal cluster_nodes
        if cluster_nodes is None:
            client = aws.sagemaker_client(args.region, args.profile)
            cluster_nodes = aws.hyperpod_nodes(client, args.cluster)
        return cluster_nodes

    if args.names == "hyperpod" and not args.cluster:
        raise TopologyInputError("--names hyperpod needs --cluster NAME")
    if args.input is not None:
        if args.instance_ids or args.group_names:
            raise TopologyInputError("give --input or --instance-ids/--group-names, not both")
        pages = load_pages(args.input)
    elif args.instance_ids or args.group_names or args.cluster:
        ids = list(args.instance_ids or [])
        if args.cluster and not ids and not args.group_names:
            ids = [node.instance_id for node in nodes_of_cluster()]
            if not ids:
                raise TopologyInputError(f"cluster {args.cluster} has no nodes")
        client = aws.ec2_client(args.region, args.profile)
        pages = list(aws.describe_instance_topology(client, ids, args.group_names or ()))
    else:
        raise TopologyInputError("give --input FILE, --instance-ids, --group-names or --cluster")
    instances = instances_from_pages(pages)
    names: dict[str, str] = {}
    if args.name_map is not None:
        names = load_name_map(args.name_map)
    elif args.names == "hyperpod":
        names = {node.instance_id: node.name for node in nodes_of_cluster() if node.name}
    return named_topology(instances, names)


def _guarded(command: str, body: Callable[[], int]) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return body()
    except (TopologyInputError, SlurmTopologyError) as e:
        print(f"topowatch topology {command}: {e}", file=sys.stderr)
    except (ClientError, BotoCoreError) as e:
        print(f"topowatch topology {command}: AWS call failed: {e}", file=sys.stderr)
    return 2


def run_from_ec2(args: argparse.Namespace) -> int:
    def body() -> int:
        rendered = render(load_topology(args), args.format, args.block_sizes)
        sys.stdout.write(rendered.text)
        for note in rendered.notes:
            print(f"note: {note}", file=sys.stderr)
        for error in rendered.errors:
            print(f"error: {error}", file=sys.stderr)
        return 1 if rendered.errors else 0

    return _guarded("from-ec2", body)


def run_check(args: argparse.Namespace) -> int:
    def body() -> int:
        try:
            text = args.slurm.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TopologyInputError(f"cannot read {args.slurm}: {e}") from None
        conf = parse_topology_conf(text)
        drift = compare(conf, load_topology(args))
        sys.stdout.write(drift.report())
        return 0 if drift.clean else 1

    return _guarded("check", body)


def run_live(args: argparse.Namespace) -> int:
    url = args.server.rstrip("/") + "/api/v1/topology"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            view = json.loads(response.read())
        if not isinstance(view, dict) or not isinstance(view.get("tree"), list):
            raise ValueError("the answer has no topology tree")
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        print(f"topowatch topology live: cannot read {url}: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        sys.stdout.write(json.dumps(view, indent=2) + "\n")
    else:
        sys.stdout.write(live_mermaid(view))
    return 0


def live_mermaid(view: dict[str, Any]) -> str:
    """`flowchart TD` of the service's tree: each layer's domains down to nodes, free GPUs on
    every box; nodes that take no new pods are drawn in red. Ids are generated, labels real."""
    lines = ["flowchart TD", "  classDef unschedulable fill:#fee2e2,stroke:#dc2626"]
    count = 0

    def walk(entry: dict[str, Any], parent: str | None) -> None:
        nonlocal count
        ident = f"d{count}"
        count += 1
        level, domain = str(entry.get("level", "")), str(entry.get("domain", ""))
        free, allocatable = entry.get("free", 0), entry.get("allocatable", 0)
        title = domain if level == "node" else f"{level}<br/>{domain}"
        label = f"{title}<br/>{free}/{allocatable} GPUs free".replace('"', "#quot;")
        style = ":::unschedulable" if level == "node" and entry.get("unschedulable") else ""
        lines.append(f'  {ident}["{label}"]{style}')
        if parent is not None:
            lines.append(f"  {parent} --> {ident}")
        for child in entry.get("children") or []:
            if isinstance(child, dict):
                walk(child, ident)

    for root in view.get("tree") or []:
        if isinstance(root, dict):
            walk(root, None)
    return "\n".join(lines) + "\n"
