"""The cluster model's event rate and /metrics render against an older commit, in the same run.

A figure like "events/s fell to 0.69x of commit c611831" only means something measured on one
machine at one time: on a shared 2-core machine the wall-clock rate of one run moves by 30 %
with the neighbours' load. So this script checks the older commit out into a temporary
worktree, then runs the same driver against each tree in alternation (base, head, base,
head, ...), each in a fresh interpreter, and times with the process's own CPU clock, which
a busy neighbour disturbs far less than the wall clock. It prints each round and the median
ratio head/base; it never passes or fails.

The driver uses only what both trees have (`benchmarks/cluster_model.py`'s synthetic cluster,
`ClusterModel.apply`, the renderer and encoder it imports, wherever each tree keeps them), so
both sides do the same work.

    .venv/bin/python benchmarks/side_by_side.py [--base c611831] [--rounds 3] [--nodes 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in the tree under test (cwd), with that tree first on sys.path.
DRIVER = r"""
import gc, importlib.util, json, sys, time
sys.path.insert(0, ".")
spec = importlib.util.spec_from_file_location("cm", "benchmarks/cluster_model.py")
cm = importlib.util.module_from_spec(spec); spec.loader.exec_module(cm)
nodes, events = int(sys.argv[1]), int(sys.argv[2])
shape = cm.SyntheticShape(nodes=nodes, workloads=nodes * 5, pods=nodes * 25)
objects = cm.build(shape)
model, _ = cm.sync(objects)
stream = cm.event_stream(objects, events)
gc.collect(); gc.freeze()
rates = []
for part in (stream[0::3], stream[1::3], stream[2::3]):
    t = time.process_time()
    for kind, event_type, obj in part:
        model.apply(kind, event_type, obj, cm.NOW)
    rates.append(len(part) / (time.process_time() - t))
renders = []
for _ in range(3):
    t = time.process_time()
    cm.encode_text(cm.metrics.render(model))
    renders.append(time.process_time() - t)
print(json.dumps({"events_per_s": max(rates), "render_s": min(renders)}))
"""


def run(tree: Path, nodes: int, events: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(nodes), str(events)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"the driver failed in {tree}:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="c611831", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--events", type=int, default=60_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="topowatch-base-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.base],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            ratios, render_ratios = [], []
            for i in range(args.rounds):
                old = run(base, args.nodes, args.events)
                new = run(ROOT, args.nodes, args.events)
                ratios.append(new["events_per_s"] / old["events_per_s"])
                render_ratios.append(new["render_s"] / old["render_s"])
                print(
                    f"round {i + 1}: events/s {args.base} {old['events_per_s']:,.0f}, "
                    f"this tree {new['events_per_s']:,.0f} ({ratios[-1]:.2f}x); /metrics "
                    f"{old['render_s'] * 1000:.0f} ms vs {new['render_s'] * 1000:.0f} ms"
                )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False
            )
    print(
        f"at {args.nodes:,} nodes, CPU-clock: events/s {statistics.median(ratios):.2f}x of "
        f"{args.base} (median of {args.rounds}; target >= 1.0x), /metrics render "
        f"{statistics.median(render_ratios):.2f}x the time"
    )


if __name__ == "__main__":
    main()
