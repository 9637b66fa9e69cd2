"""`topowatch slurm-controller`: the Slurm head node's service, which polls the node agents'
health, remediates through scontrol and writes Prometheus file_sd targets.

Its parser is built on every `topowatch` invocation, so the service is imported only inside
`run_slurm_controller`. `topowatch explain --slurm` lives apart, in `exporter.cli.slurm_explain`:
it is a different command (explain), and it imports the Slurm placement code at module level,
which this parser-building module must not.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["add_slurm_parser", "run_slurm_controller"]


def add_slurm_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `slurm-controller` sub-command, run by `run_slurm_controller`."""
    slurm = sub.add_parser(
        "slurm-controller",
        help="on a Slurm head node: poll node agents, remediate through scontrol, file_sd",
        description="Reads nodes from slurmctld, polls each node agent's /api/v1/health, applies "
        "the remediation policy (observe by default) and acts with scontrol; writes Prometheus "
        "file_sd targets and Slurm job placement metrics.",
    )
    slurm.add_argument(
        "--config",
        type=Path,
        default=Path("/etc/topowatch/slurm-controller.yaml"),
        metavar="FILE",
        help="settings (YAML; default /etc/topowatch/slurm-controller.yaml)",
    )
    slurm.add_argument("--once", action="store_true", help="one cycle, then exit")
    slurm.set_defaults(func=run_slurm_controller)


def run_slurm_controller(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT (one cycle with --once); exit 2, with the reason on
    stderr, for settings it cannot use."""
    import asyncio
    import signal

    from exporter.slurm.service import build_service, serve
    from exporter.slurm.settings import SettingsError, load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        service = build_service(load_settings(args.config))
    except (SettingsError, ValueError) as exc:
        print(f"topowatch slurm-controller: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(service, stop, once=args.once)

    asyncio.run(run())
    return 0
