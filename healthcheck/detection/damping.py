"""Flap damping: a finding becomes actionable once it held in K of the last N polls.

One bad reading (a counter read mid-reset, a link retraining) must not take a node out; a
fault that keeps showing must, within K polls. Fatal events are facts, not readings, and bypass
the window (severity `fatal`): an XID whose catalog entry is FATAL and asks for a reset or more,
a kernel log line the pattern table marks fatal (a GPU fallen off the bus, UVM's global fatal
error, a failed EFA reset, a GPU the driver could not initialise), an EFA admin command that
never completed. A finding that recommends no action is never actionable, whatever its window
says.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import replace

from exporter.core.findings import Finding
from healthcheck.detection.config import HealthConfig

Key = tuple[str, str]


class Damper:
    """Per (check, component) windows of the last N polls. Not thread-safe: one poller."""

    def __init__(self, config: HealthConfig) -> None:
        self._config = config
        self._windows: dict[Key, deque[bool]] = {}

    def update(self, findings: Iterable[Finding]) -> list[Finding]:
        """Record one poll's findings; return them with `actionable` decided."""
        present: dict[Key, list[Finding]] = {}
        for f in findings:
            present.setdefault(f.key, []).append(f)
        for key in set(self._windows) | set(present):
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = deque(maxlen=self._config.damping_for(key[0]).n)
            window.append(key in present)
            if not any(window):
                del self._windows[key]  # quiet for N polls: forget it (bounds the memory)
        out = []
        for key, group in present.items():
            held = sum(self._windows[key]) >= self._config.damping_for(key[0]).k
            for f in group:
                fatal = f.severity == "fatal"
                out.append(replace(f, actionable=f.action != "none" and (held or fatal)))
        return out

    def held(self, check: str, component: str) -> int:
        """How many of the last N polls had this finding (for tests and debugging)."""
        return sum(self._windows.get((check, component), ()))
