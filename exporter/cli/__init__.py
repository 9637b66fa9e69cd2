"""topowatch: GPU-cluster observability. The node agent, the cluster service, the Slurm
controller, and the tools that explain placement, map the topology and advise quota.

This package is the one `topowatch` command, one module per command family:

- `common`: what several sub-commands share (ports, HOST:PORT parsing, logging setup);
- `node`: `topowatch node`, the agent on every GPU node: options, --config file, wiring;
- `cluster`: `topowatch cluster` (the Kueue-side service) and `topowatch explain`;
- `slurm_explain`: `topowatch explain --slurm`, a job's placement from squeue and sinfo;
- `demo`: `topowatch demo`, the whole system on the simulation;
- `slurm`: `topowatch slurm-controller`, the service on a Slurm head node;
- `topology`: `topowatch topology from-ec2|check|live`;
- `quota` and `quota_advise`: `topowatch quota advise`, its parser and what runs it.

Every invocation builds the whole parser, the node agent's included, so the modules that build
parsers import the heavy parts (the cluster service, the simulation, aiohttp, kubernetes,
boto3) only inside the functions that run a sub-command (tests/test_architecture.py checks).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from exporter.cli.cluster import add_cluster_parsers
from exporter.cli.common import configure_logging
from exporter.cli.demo import add_demo_parser
from exporter.cli.node import add_node_parser
from exporter.cli.quota import add_quota_parser
from exporter.cli.slurm import add_slurm_parser
from exporter.cli.topology import add_topology_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole `topowatch` parser; each sub-command sets `func`, the function that runs it."""
    parser = argparse.ArgumentParser(
        prog="topowatch", description=(__doc__ or "").partition("\n\n")[0]
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    add_node_parser(sub)
    add_cluster_parsers(sub)
    add_demo_parser(sub)
    add_slurm_parser(sub)
    add_topology_parser(sub)
    add_quota_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script `topowatch`: parse, set up logging, run the sub-command; its return
    value is the exit status."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    return int(args.func(args))
