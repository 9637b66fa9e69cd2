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
import errno
import sys
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
    try:
        return int(args.func(args))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        # One line a person can act on, not a traceback through asyncio or socketserver.
        print(f"topowatch {args.command}: {port_taken(exc, args)}", file=sys.stderr)
        return 2


# Which options move each command's listening sockets.
_PORT_OPTIONS = {
    "demo": "--listen HOST:PORT (the cluster service), --node-port-base PORT (the node agents;"
    " 0 picks free ports) or --prometheus-port PORT (0: no Prometheus)",
    "slurm-controller": "--listen HOST:PORT",
}


def port_taken(exc: OSError, args: argparse.Namespace) -> str:
    """ "address already in use", with the address (asyncio names it; socketserver does not,
    so a command with one socket names its --listen), and the options that choose another."""
    what = str(exc).removeprefix(f"[Errno {exc.errno}] ")
    if "address" not in what and args.command not in _PORT_OPTIONS:
        host, port = args.listen
        what = f"cannot listen on {host}:{port}: {what.lower()}"
    options = _PORT_OPTIONS.get(args.command, "--listen HOST:PORT")
    return f"{what}: another process holds the port; choose another with {options}"
