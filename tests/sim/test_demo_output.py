"""What `topowatch demo` prints and serves in its first seconds (issue 31): the node names, two
ready-made commands that restart it with a fault (the CLI by its full path, this run's ports
kept), an explain line by the same full path, and pages with something on them at once: the
simulation has run for ten minutes before serving, so preemptions are already recorded."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shlex
import sys
import threading
import time
import urllib.request
from pathlib import Path

from exporter.sim.cluster import default_shape
from exporter.sim.demo import (
    cli_command,
    fault_commands,
    node_summary,
    restart_args,
    run_demo,
)
from exporter.sim.faults import parse_fault
from exporter.sim.hyperpod_layout import build_nodes
from tests.conftest import free_port

STARTUP_S = 120.0  # the simulation, 34 agents and the first informer sync, on a loaded machine


def test_the_cli_is_named_by_a_full_path_that_runs(tmp_path: Path) -> None:
    script = tmp_path / "topowatch"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert cli_command(str(script)) == [str(script)]
    found = cli_command("/no/such/place/python")
    assert Path(found[0]).is_absolute() and Path(found[0]).exists()
    if len(found) == 1:  # the installed script (PATH or beside this interpreter)
        assert Path(found[0]).name == "topowatch" and os.access(found[0], os.X_OK)
    else:
        assert found == [sys.executable, "-m", "exporter.cli"]


def test_restart_args_keep_this_runs_options_and_drop_the_ones_a_fault_line_sets() -> None:
    argv = [
        "--log-level",
        "INFO",
        "demo",
        "--listen",
        "127.0.0.1:9999",
        "--fault",
        "node=a:xid=79@gpu3",
        "--fault=node=b:rootfs-ro",
        "--remediate",
        "--duration",
        "30",
        "--seed",
        "3",
    ]
    assert restart_args(argv, 3) == [
        "--log-level",
        "INFO",
        "demo",
        "--listen",
        "127.0.0.1:9999",
        "--seed",
        "3",
    ]
    assert restart_args(["-q", "tests/"], 0) == ["demo"]  # not started as `topowatch demo`
    assert restart_args([], 7) == ["demo", "--seed", "7"]


def test_two_fault_commands_on_two_real_nodes_that_parse_back() -> None:
    nodes = build_nodes(default_shape(), random.Random(0))
    busy = [nodes[5].name, nodes[9].name]
    lines = fault_commands(["/opt/venv/bin/topowatch"], ["demo"], nodes, busy)
    assert len(lines) == 2
    specs = []
    for line in lines:
        words = shlex.split(line)
        assert words[:3] == ["/opt/venv/bin/topowatch", "demo", "--remediate"]
        assert words[3] == "--fault"
        specs.append(parse_fault(words[4]))
    assert [f.node for f in specs] == busy  # where the work is
    assert [(f.kind, f.xid, f.gpu) for f in specs] == [("xid", 79, 3), ("remap-failure", None, 1)]
    assert fault_commands(["t"], ["demo"], [], []) == []
    summary = node_summary(nodes)
    assert len(summary) == 2 and all("in all)" in line for line in summary)
    assert nodes[0].name in "".join(summary)


def test_the_demo_prints_nodes_and_commands_and_serves_history_at_once() -> None:
    out = io.StringIO()
    until = threading.Event()
    port = free_port()
    result: list[int] = []
    args = ["demo", "--listen", f"127.0.0.1:{port}", "--prometheus-port", "0"]

    def run() -> None:
        result.append(
            run_demo(
                "127.0.0.1", port, 0, (), 0, None, out=out, prometheus_port=0, argv=args,
                until=until,
            )
        )  # fmt: skip

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = began + STARTUP_S
        while "Ctrl-C stops everything." not in out.getvalue():
            assert thread.is_alive() and time.monotonic() < deadline, out.getvalue()
            time.sleep(0.1)
        ready_s = time.monotonic() - began
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/preemptions") as response:
            preemptions = json.loads(response.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/goodput") as response:
            goodput = json.loads(response.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/admission") as response:
            admission = json.loads(response.read())
    finally:
        until.set()
        thread.join(30)
    printed = out.getvalue()
    print(f"demo ready in {ready_s:.1f} s\n{printed}")
    assert result == [0]
    assert "10 minutes of history" in printed
    # the preemption page has the simulation's past in its first second
    assert len(preemptions) >= 3
    assert goodput["cluster"]["jobs"] > 0
    # node names, every instance type
    assert (
        "ml.p5.48xlarge: hyperpod-i-" in printed and "ml.p6e-gb200.36xlarge: hyperpod-i-" in printed
    )
    # the explain line and the two fault lines run the CLI by its full path
    cli = shlex.join(cli_command())
    (explain,) = re.findall(r"  try: +(.*)", printed)
    assert explain.startswith(f"{cli} explain --server http://127.0.0.1:{port} ")
    faults = re.findall(r"^    (.*--remediate --fault .*)$", printed, re.M)
    assert len(faults) == 2
    # the admission check: listed by the simulated ClusterQueues, enforced by the service, and
    # a third command that faults an idle node with remediation observing, to see it steer
    assert "admission check:  topowatch-node-health, enforce" in printed
    assert (admission["enabled"], admission["mode"]) == (True, "enforce")
    [steer] = re.findall(r"^    (.*--fault .*)$", printed.split("admission check steers")[1], re.M)
    steer_words = shlex.split(steer)
    assert "--remediate" not in steer_words and steer_words[len(cli_command()) :][:-2] == args
    nodes = set()
    for line in faults:
        words = shlex.split(line)
        assert Path(words[0]).is_absolute()
        assert words[len(cli_command()) :][:-2] == [*args, "--remediate"]  # this run's ports
        fault = parse_fault(words[-1])
        assert fault.node is not None and fault.node.startswith("hyperpod-i-")
        nodes.add(fault.node)
    assert len(nodes) == 2
    assert parse_fault(steer_words[-1]).node not in nodes  # idle, not the busy ones
