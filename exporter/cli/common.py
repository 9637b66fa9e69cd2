"""What more than one `topowatch` sub-command shares: the default ports, HOST:PORT parsing, the
command's logger and its logging setup.

Every invocation imports this module while building the parser, so it imports nothing beyond
the standard library: the node agent on each GPU node pays for nothing here it does not use.
"""

from __future__ import annotations

import argparse
import logging

__all__ = [
    "DEFAULT_CLUSTER_PORT",
    "DEFAULT_NODE_PORT",
    "configure_logging",
    "log",
    "parse_listen",
]

# One logger for what the command itself says, so its lines read `topowatch: ...` whichever
# sub-command module wrote them.
log = logging.getLogger("topowatch")

DEFAULT_NODE_PORT = 9402
DEFAULT_CLUSTER_PORT = 9403


def parse_listen(value: str) -> tuple[str, int]:
    """`--listen HOST:PORT` as (host, port); an empty host (`:9402`) listens on every address,
    and brackets around an IPv6 host are dropped, as a URL writes them."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def configure_logging(level: str) -> None:
    """Root logging at `--log-level` (an unknown name falls back to INFO rather than failing the
    command), before any sub-command runs."""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
