"""Regenerate exporter/core/data/xid-catalog.csv from the shared reference catalog.

Keeps what the agent needs as label values: the XID, a short name (the first symbolic name,
without the parenthesised description), FATAL/NONFATAL, and the action bucket (the first word
of NVIDIA's recommended action, e.g. RESET_GPU, RESTART_BM, WORKFLOW_XID_48). The full text
stays in the reference file.

    python scripts/import_xid_catalog.py ../shared/reference/nvidia/xid-catalog.csv
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "exporter" / "data" / "xid-catalog.csv"


def short_name(name: str) -> str:
    return re.split(r"[ (/]", name.strip(), maxsplit=1)[0]


def action_bucket(action: str) -> str:
    return re.split(r"[;: ]", action.strip(), maxsplit=1)[0]


def main(source: str) -> None:
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    with OUT.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["xid", "name", "severity", "action"])
        for r in rows:
            w.writerow(
                [
                    int(r["xid"]),
                    short_name(r["name"]),
                    r["severity"],
                    action_bucket(r["recommended_action"]),
                ]
            )


if __name__ == "__main__":
    main(sys.argv[1])
