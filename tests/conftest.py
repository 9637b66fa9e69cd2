"""Shared fixtures: real promtool, simulated nodes, pollers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from exporter.node.poller import Poller
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile

# The shared reference data sits beside the checkout (../shared), in CI as in development.
REFERENCE = Path(
    os.environ.get(
        "TOPOWATCH_REFERENCE", Path(__file__).resolve().parents[2] / "shared" / "reference"
    )
)


def reference(relative: str) -> Path:
    path = REFERENCE / relative
    if not path.exists():
        pytest.fail(
            f"reference data {path} missing:"
            " check out shared/ beside the repo or set TOPOWATCH_REFERENCE"
        )
    return path


def promtool_lint(exposition: bytes) -> str:
    """Run the real `promtool check metrics`; return its complaints ('' when clean)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    proc = subprocess.run(
        [binary, "check", "metrics"], input=exposition, capture_output=True, timeout=60
    )
    complaints = (proc.stdout + proc.stderr).decode().strip()
    if proc.returncode != 0 and not complaints:
        complaints = f"promtool exited {proc.returncode}"
    return complaints


class SimHarness:
    """A simulated node and a poller over it, with simulated time stepping by `interval`."""

    def __init__(
        self, profile: str, faults: tuple[str, ...], tmp: Path, compat: frozenset[str]
    ) -> None:
        self.node = SimulatedNode(
            get_profile(profile), parse_faults(faults), root=tmp, start=1_750_000_000.0
        )
        self.sources = self.node.sources()
        self.now = 1_750_000_000.0
        self.poller = Poller("sim-node-1", self.sources, compat=compat, clock=lambda: self.now)

    def poll(self, step: float = 5.0):  # type: ignore[no-untyped-def]
        self.now += step
        return self.poller.poll()

    def close(self) -> None:
        self.sources.close()
        self.node.close()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[object]:
    made: list[SimHarness] = []

    def make(
        profile: str = "p5.48xlarge", *faults: str, compat: frozenset[str] = frozenset()
    ) -> SimHarness:
        h = SimHarness(profile, faults, tmp_path / f"sim{len(made)}", compat)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def executed_lines(func: Callable[[], object]) -> int:
    """How many Python lines `func` runs, in every function it calls: a measure of its work
    that, unlike a timing, does not depend on how busy the machine is."""
    count = 0

    def line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return line

    def call(frame: FrameType, event: str, arg: object) -> Any:
        return line

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        func()
    finally:
        sys.settrace(previous)
    return count
