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
    .venv/bin/python benchmarks/side_by_side.py --instructions --events 3000   # valgrind
    .venv/bin/python benchmarks/side_by_side.py --interleaved 30 [--kind Pod]

With --instructions the loop runs under valgrind's callgrind and the figure is instructions per
event, which the neighbours' load does not move (the CPU clock still moves by 20-30 % here).
With --interleaved both models are built once and timed slice by slice in turn: the pairs'
ratios spread far less than whole runs (one kind's events alone with --kind), which is how to
see whether fewer instructions also mean less time on this machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in the tree under test (cwd), with that tree first on sys.path.
# Every driver begins here: the tree's own cluster_model.py builds the synthetic cluster of
# argv[1] nodes and the stream of argv[2] events; argv[3], where there is one, is the driver's.
BUILD = r"""
import gc, importlib.util, json, os, sys, time
sys.path.insert(0, ".")
spec = importlib.util.spec_from_file_location("cm", "benchmarks/cluster_model.py")
cm = importlib.util.module_from_spec(spec); spec.loader.exec_module(cm)
nodes, events = int(sys.argv[1]), int(sys.argv[2])
shape = cm.SyntheticShape(nodes=nodes, workloads=nodes * 5, pods=nodes * 25)
objects = cm.build(shape)
model, _ = cm.sync(objects)
stream = cm.event_stream(objects, events)
"""

DRIVER = (
    BUILD
    + r"""
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
)


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


# The same event loop, counted in instructions under valgrind's callgrind (--instructions): the
# driver signals through files when the model is built and when the loop is done, and the
# parent turns callgrind's instrumentation on and off around the loop with callgrind_control.
# An instruction count does not move with the neighbours' load, so one round says it all.
COUNT_DRIVER = (
    BUILD
    + r"""
signal = sys.argv[3]
gc.collect(); gc.freeze()
open(signal + ".ready", "w").close()
while not os.path.exists(signal + ".go"):
    time.sleep(0.2)
for kind, event_type, obj in stream:
    model.apply(kind, event_type, obj, cm.NOW)
open(signal + ".done", "w").close()
while not os.path.exists(signal + ".stop"):
    time.sleep(0.2)
"""
)


def count(tree: Path, nodes: int, events: int, work: Path) -> float:
    """Instructions per event of the driver's event loop in `tree` (valgrind's callgrind)."""
    signal, out = work / f"signal-{tree.name}", work / f"callgrind-{tree.name}.out"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            COUNT_DRIVER,
            str(nodes),
            str(events),
            str(signal),
        ],
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def wait_for(suffix: str) -> None:
        while not Path(str(signal) + suffix).exists():
            if proc.poll() is not None:
                raise SystemExit(f"the counting driver stopped early in {tree}")
            time.sleep(0.2)

    def control(state: str) -> None:
        subprocess.run(
            ["callgrind_control", "-i", state, str(proc.pid)], check=True, capture_output=True
        )

    wait_for(".ready")
    control("on")
    Path(str(signal) + ".go").touch()
    wait_for(".done")
    control("off")
    Path(str(signal) + ".stop").touch()
    proc.wait()
    for line in out.read_text().splitlines():
        if line.startswith("totals:"):  # the whole run's ("summary:" is the last dump's)
            return int(line.split()[1]) / events
    raise SystemExit(f"no instruction total in {out}")


# Both trees' models built once, in two long-lived drivers, then fed the same stream in short
# slices taken in turn (which goes first alternates): a neighbour's burst lands on both sides of
# a pair, so the per-pair ratios spread far less than whole runs do (--interleaved).
SLICE_DRIVER = (
    BUILD
    + r"""
kinds = set(filter(None, sys.argv[3].split(",")))
if kinds:
    stream = [e for e in stream if e[0] in kinds]
gc.collect(); gc.freeze()
print("ready", len(stream), flush=True)
at = 0
for line in sys.stdin:
    part = stream[at : at + int(line)]
    at += len(part)
    t = time.process_time()
    for kind_, event_type, obj in part:
        model.apply(kind_, event_type, obj, cm.NOW)
    print((time.process_time() - t) / max(1, len(part)), flush=True)
"""
)


def interleaved(
    trees: dict[str, Path], nodes: int, events: int, pairs: int, kind: str
) -> tuple[list[float], dict[str, list[float]], int]:
    """Seconds per event of each tree's slices, `pairs` slices each, taken in turn; and the
    ratio of events/s (this tree over the base) of each pair. Returns the slice size too."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", SLICE_DRIVER, str(nodes), str(events), kind],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, tree in trees.items()
    }
    try:
        lengths = set()
        for name, proc in procs.items():
            assert proc.stdout is not None
            word, _, length = proc.stdout.readline().partition(" ")
            if word != "ready":
                raise SystemExit(f"the slice driver failed in {trees[name]}")
            lengths.add(int(length))
        size = min(lengths) // pairs  # (one kind's events: a share of the stream)
        costs: dict[str, list[float]] = {name: [] for name in trees}
        ratios = []
        names = list(trees)
        for i in range(pairs):
            for name in names if i % 2 == 0 else names[::-1]:
                proc = procs[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{size}\n")
                proc.stdin.flush()
                costs[name].append(float(proc.stdout.readline()))
            ratios.append(costs["base"][-1] / costs["head"][-1])
        return ratios, costs, size
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="c611831", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per event under valgrind's callgrind instead (one round, "
        "--events 3000 is plenty; needs valgrind)",
    )
    parser.add_argument(
        "--interleaved",
        type=int,
        metavar="PAIRS",
        help="build both models once and time PAIRS slices of the stream each, in turn, on the "
        "CPU clock (30 is plenty); with --kind, one kind's events only",
    )
    parser.add_argument(
        "--kind", default="", help="with --interleaved: Pod, Workload or Node, or a comma list"
    )
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
            if args.instructions:
                if shutil.which("valgrind") is None:
                    raise SystemExit("--instructions needs valgrind (callgrind) on PATH")
                old_count = count(base, args.nodes, args.events, Path(tmp))
                new_count = count(ROOT, args.nodes, args.events, Path(tmp))
                print(
                    f"at {args.nodes:,} nodes, {args.events:,} events: {old_count:,.0f} "
                    f"instructions per event at {args.base}, {new_count:,.0f} in this tree: "
                    f"events/s {old_count / new_count:.2f}x of {args.base} (target >= 1.0x)"
                )
                return
            if args.interleaved:
                pair_ratios, costs, size = interleaved(
                    {"base": base, "head": ROOT},
                    args.nodes,
                    args.events,
                    args.interleaved,
                    args.kind,
                )
                quartiles = statistics.quantiles(pair_ratios, n=4)
                what = f"{args.kind} events" if args.kind else "events"
                print(
                    f"at {args.nodes:,} nodes, {args.interleaved} interleaved pairs of "
                    f"{size:,} {what}: "
                    f"{statistics.median(costs['base']) * 1e6:.1f} us per event at {args.base}, "
                    f"{statistics.median(costs['head']) * 1e6:.1f} us here: events/s "
                    f"{statistics.median(pair_ratios):.2f}x of {args.base} (quartiles "
                    f"{quartiles[0]:.2f}-{quartiles[2]:.2f}; target >= 1.0x)"
                )
                return
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
