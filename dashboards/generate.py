"""Write dashboards/*.json from dashboards/boards.py (`python dashboards/generate.py`).

The JSON is committed so Grafana provisioning and the Helm chart need no Python; a test
regenerates it and fails when the two differ. `--check` does the same from the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `dashboards` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards.boards import DASHBOARDS

OUT = Path(__file__).resolve().parent


def as_json(builder_name: str) -> dict[str, Any]:
    """One dashboard as Grafana's JSON model, with stable panel ids and query refIds (the SDK
    leaves both unset, and Grafana needs them unique)."""
    model: dict[str, Any] = json.loads(
        json.dumps(DASHBOARDS[builder_name]().build(), cls=JSONEncoder)
    )
    for number, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = number
        for index, target in enumerate(panel.get("targets", [])):
            target["refId"] = chr(ord("A") + index)
    return model


def render(name: str) -> str:
    return json.dumps(as_json(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    stale = []
    for name in DASHBOARDS:
        path = OUT / f"{name}.json"
        text = render(name)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale: {', '.join(stale)} (run python dashboards/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
