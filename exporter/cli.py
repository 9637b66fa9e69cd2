"""The one `topowatch` command. Subcommands arrive with the issues that build them."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from exporter.node.poller import COMPAT_MODES, NodeSources, Poller
from exporter.node.serving import NodeAgent, serve
from exporter.sim.faults import FaultSpecError, parse_faults
from exporter.sim.profiles import PROFILES, get_profile

log = logging.getLogger("topowatch")

DEFAULT_NODE_PORT = 9402
ONCE_SETTLE_SECONDS = 1.0


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_compat(value: str) -> frozenset[str]:
    modes = frozenset(m.strip() for m in value.split(",") if m.strip())
    unknown = modes - COMPAT_MODES
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown compat mode(s) {', '.join(sorted(unknown))};"
            f" choose from {', '.join(sorted(COMPAT_MODES))}"
        )
    return modes


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topowatch", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    node = sub.add_parser(
        "node",
        help="the node agent: GPU, NVLink, EFA, NUMA and topology metrics",
        description="Poll NVML, sysfs, the kubelet and the node's labels; serve /metrics.",
    )
    node.add_argument(
        "--simulate", metavar="PROFILE", help=f"simulated hardware: {', '.join(sorted(PROFILES))}"
    )
    node.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault into the simulation (repeatable), e.g. xid=79@gpu3",
    )
    node.add_argument(
        "--once",
        action="store_true",
        help="poll (twice, 1 s apart, so rates and events settle), print the exposition, exit",
    )
    node.add_argument(
        "--listen", type=parse_listen, default=("0.0.0.0", DEFAULT_NODE_PORT), metavar="HOST:PORT"
    )
    node.add_argument(
        "--interval", type=float, default=5.0, metavar="S", help="poll interval in seconds"
    )
    node.add_argument(
        "--compat",
        type=parse_compat,
        default=frozenset(),
        metavar="dcgm,efa",
        help="also emit dcgm-exporter and/or AWS EFA exporter names",
    )
    node.add_argument("--node-name", default=None, help="default: $NODE_NAME, else the hostname")
    node.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    node.add_argument("--proc-root", type=Path, default=Path("/proc"))
    node.add_argument(
        "--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    node.add_argument(
        "--pod-resource",
        action="append",
        default=None,
        metavar="NAME",
        help="device-plugin resource holding GPUs (repeatable; default nvidia.com/gpu)",
    )
    node.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="do not read the Node object or the kubelet (bare-metal or Slurm nodes)",
    )
    node.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    node.add_argument(
        "--sim-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the simulation writes its sysfs/proc tree (default: a temp dir)",
    )
    node.set_defaults(func=run_node)
    return parser


def real_sources(args: argparse.Namespace, node_name: str) -> NodeSources:
    from exporter.sources.kube import StaticNodeLabels, node_labels_source
    from exporter.sources.nvml import NvmlGpuSource
    from exporter.sources.podresources import KubeletPodResources

    gpu = NvmlGpuSource()
    gpu.start()
    if args.no_kubernetes:
        return NodeSources(
            gpu=gpu,
            labels=StaticNodeLabels({}),
            sysfs_root=args.sysfs_root,
            proc_root=args.proc_root,
        )
    labels = node_labels_source(node_name)
    pods = KubeletPodResources(
        args.pod_resources_socket, tuple(args.pod_resource or ("nvidia.com/gpu",))
    )
    return NodeSources(
        gpu=gpu, labels=labels, pods=pods, sysfs_root=args.sysfs_root, proc_root=args.proc_root
    )


def run_node(args: argparse.Namespace) -> int:
    node_name = args.node_name or default_node_name()
    sim = None
    if args.simulate:
        from exporter.sim.node import SimulatedNode

        try:
            sim = SimulatedNode(
                get_profile(args.simulate),
                parse_faults(args.fault),
                root=args.sim_root,
                seed=args.seed,
            )
        except (ValueError, FaultSpecError) as e:
            print(f"topowatch node: {e}", file=sys.stderr)
            return 2
        sources = sim.sources()
        log.info("simulating %s in %s", sim.profile.instance_type, sim.root)
    elif args.fault:
        print("topowatch node: --fault needs --simulate", file=sys.stderr)
        return 2
    else:
        sources = real_sources(args, node_name)
    poller = Poller(node_name, sources, compat=args.compat)
    agent = NodeAgent(poller, interval=args.interval)
    try:
        if args.once:
            # Two polls: GPM ratios and rates need two samples, and XIDs need the event
            # waiter registered, which happens once the first poll has enumerated the GPUs.
            agent.poll_once()
            time.sleep(ONCE_SETTLE_SECONDS)
            agent.poll_once()
            sys.stdout.buffer.write(agent.current.text)
            return 0
        snapshot = agent.poll_once()
        if not snapshot.gpu.available:
            log.warning(
                "no GPU metrics: %s. Serving the other collectors; use --simulate PROFILE to try "
                "topowatch without a GPU.",
                snapshot.gpu.error,
            )
        host, port = args.listen
        serve(agent, host, port)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        sources.close()
        if sim is not None:
            sim.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
