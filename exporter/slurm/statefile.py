"""The Slurm controller's memory of what it did: one JSON file, replaced atomically.

On Kubernetes the remediation state lives in a Node annotation; a Slurm node has no such place
(its Reason is one line and belongs to whoever drained it), so the head node keeps a file. Each
write goes to a temporary file in the same directory, is fsynced, and renamed over the old one
(rename is atomic on POSIX), then the directory is fsynced: a crash leaves the old file or the new
one, never half of either. A file that cannot be read is never overwritten: the controller
refuses to act until a person looks (it may hold the only record of an action under way).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporter.core.atomicfile import atomic_write as write_atomically
from healthcheck.remediation.state import RemediationState, state_document, state_from_document

VERSION = 1


class StateFileError(RuntimeError):
    """The state file exists but cannot be trusted; the message says why and where."""


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._states: dict[str, RemediationState] = {}
        self.problem: str | None = None  # set by load(): writes are refused while set

    def load(self) -> dict[str, RemediationState]:
        """The states on disk ({} when there is no file yet). StateFileError when the file
        cannot be read, is not ours, or comes from a newer version; it is left untouched."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc.strerror}"
            raise StateFileError(self.problem) from exc
        try:
            states = _parse(text)
        except ValueError as exc:
            self.problem = f"{self.path}: {exc}; fix or move it away, then restart"
            raise StateFileError(self.problem) from exc
        with self._lock:
            self._states = dict(states)
        return states

    def write_state(self, node: str, state: RemediationState) -> None:
        self.write_states([(node, state)])

    def write_states(self, items: Sequence[tuple[str, RemediationState]]) -> None:
        """Several nodes in one atomic replacement: all of them on disk, or none."""
        with self._lock:
            if self.problem is not None:
                raise StateFileError(f"state file not writable: {self.problem}")
            states = {**self._states, **dict(items)}
            self._write(states)
            self._states = states

    def drop(self, node: str) -> None:
        with self._lock:
            if self.problem is not None or node not in self._states:
                return
            states = {n: s for n, s in self._states.items() if n != node}
            self._write(states)
            self._states = states

    def _write(self, states: dict[str, RemediationState]) -> None:
        document = {
            "version": VERSION,
            "nodes": {name: state_document(s) for name, s in sorted(states.items())},
        }
        atomic_write(self.path, json.dumps(document, indent=1, sort_keys=True))


def atomic_write(path: Path, text: str, mode: int = 0o640) -> None:
    """Replace `path` with `text`, durably (exporter/core/atomicfile.py: temp file in the same
    directory, fsync, rename, fsync the directory). Readers (Prometheus watching a file_sd file,
    a restarted controller) see the old content or the new, never a torn one."""
    write_atomically(path, text, mode=mode, durable=True)


def _parse(text: str) -> dict[str, RemediationState]:
    try:
        document: Any = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), dict):
        raise ValueError("not a topowatch state file (no `nodes` object)")
    version = document.get("version")
    if version != VERSION:
        raise ValueError(f"version {version!r}; this topowatch reads version {VERSION}")
    states: dict[str, RemediationState] = {}
    for name, raw in document["nodes"].items():
        if not isinstance(raw, dict):
            raise ValueError(f"node {name!r}: not a JSON object")
        try:
            states[name] = state_from_document(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"node {name!r}: {exc}") from exc
    return states
