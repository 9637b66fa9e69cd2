"""The history flags of `topowatch cluster`, apart from the store (see
exporter/cluster/leader/args.py for why the parser's modules import nothing heavy: the node agent
builds the same parser)."""

from __future__ import annotations

import argparse
import re
from datetime import datetime

DATABASE_URL_ENV = "TOPOWATCH_DATABASE_URL"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(value: str) -> float | None:
    """`90d`, `36h`, `15m`, `30s` as seconds; None when `value` is not such a duration."""
    match = _DURATION.match(value.strip())
    return None if match is None else float(match.group(1)) * _UNITS[match.group(2)]


def parse_since(value: str | None, now: float) -> float:
    """`since` as Unix seconds, RFC 3339, or a duration back from now (`90s`, `15m`, `30d`)."""
    if not value:
        return 0.0
    back = seconds(value)
    if back is not None:
        return now - back
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise ValueError(
            f"since={value!r}: expected Unix seconds, RFC 3339, or a duration like 15m"
        ) from exc


def duration(value: str) -> float:
    """A positive duration (argparse type)."""
    found = seconds(value)
    if found is None or found <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a duration like 90d, 36h or 15m")
    return found


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive whole number")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "history (preemptions, finished workloads, scale events, remediation audit)"
    )
    group.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="sqlite:////var/lib/topowatch/history.db or postgresql://user@host:5432/db"
        f" (default: ${DATABASE_URL_ENV}; neither: history lives only in memory)",
    )
    group.add_argument(
        "--history-retention",
        metavar="DURATION",
        type=duration,
        default=duration("90d"),
        help="delete history older than this (default 90d)",
    )
    group.add_argument(
        "--history-max-rows",
        metavar="N",
        type=positive,
        default=10_000_000,
        help="keep at most N rows of each kind, the newest (default 10,000,000)",
    )
    group.add_argument(
        "--history-queue-rows",
        metavar="N",
        type=positive,
        default=100_000,
        help="rows held while the database is unavailable; past it the oldest are dropped",
    )
    group.add_argument(
        "--history-ephemeral",
        action="store_true",
        help="the SQLite file's volume does not outlive the pod: warn, and export it",
    )
