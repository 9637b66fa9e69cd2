"""`topowatch demo`: the whole system on the simulation in one process tree, for trying
topowatch without a cluster.

Its parser is built on every `topowatch` invocation, so the simulation it runs is imported only
inside `run_demo`: a node agent on real hardware never loads it.
"""

from __future__ import annotations

import argparse
import sys

from exporter.cli.common import DEFAULT_CLUSTER_PORT, parse_listen

__all__ = ["add_demo_parser", "run_demo"]


def add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `demo` sub-command, run by `run_demo`."""
    demo = sub.add_parser(
        "demo",
        help="the whole system on the simulation, one command",
        description="Simulated cluster + API server, a node agent per node, the cluster service.",
    )
    demo.add_argument(
        "--listen",
        type=parse_listen,
        default=("127.0.0.1", DEFAULT_CLUSTER_PORT),
        metavar="HOST:PORT",
    )
    demo.add_argument(
        "--node-port-base",
        type=int,
        default=9410,
        metavar="PORT",
        help="first node agent port (one per node); 0 picks free ports",
    )
    demo.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a node fault (repeatable), e.g. node=NAME:xid=79@gpu3",
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S s")
    demo.add_argument("--no-node-agents", action="store_true", help="only the cluster side")
    demo.add_argument(
        "--remediate",
        action="store_true",
        help="let the controller act on the simulated nodes (HyperPod labels); default observe",
    )
    demo.add_argument(
        "--no-admission-check",
        action="store_true",
        help="no topowatch-node-health AdmissionCheck (default: listed and enforced)",
    )
    demo.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="run Prometheus on 127.0.0.1:PORT scraping the demo (if installed); 0 disables",
    )
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo until --duration or Ctrl-C; exit 2 for a fault spec or setting it rejects."""
    from exporter.sim.demo import run_demo as demo
    from exporter.sim.faults import FaultSpecError, parse_faults

    host, port = args.listen
    try:
        faults = parse_faults(args.fault)
        return demo(
            host,
            port,
            args.node_port_base,
            faults,
            args.seed,
            args.duration,
            with_agents=not args.no_node_agents,
            remediate=args.remediate,
            prometheus_port=args.prometheus_port,
            admission_check=not args.no_admission_check,
        )
    except (ValueError, FaultSpecError) as e:
        print(f"topowatch demo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
