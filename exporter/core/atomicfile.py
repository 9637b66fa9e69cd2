"""Replace a small file atomically: the one way every state file of ours is written.

A temporary file in the target's directory (so the rename never crosses a filesystem) gets the
new content and is renamed over the target; rename(2) is atomic on POSIX, so a reader, or an agent
restarted after a crash, sees the old content or the new, never half of either. A failed write
removes its temporary file and raises; the target is untouched.

`durable=True` also fsyncs the file before the rename and the directory after it, so the new
content survives a power loss too (the Slurm controller's record of actions under way, a file_sd
target list). Without it the content has to survive only a restart of the process, which the page
cache does: the node agent's kernel-log cursor and held XIDs, written up to four times a second,
are void after a power loss anyway (the node boots with a new boot id).

Used by exporter/slurm/statefile.py, exporter/sources/kmsg.py and healthcheck/detection/xid_state.py
(issue 28 asked for one helper where there were three).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o640, durable: bool = True) -> None:
    """Replace `path` with `data` (text is written as UTF-8). The directory must exist unless
    `durable`, which creates it (the Slurm controller's state directory on first start)."""
    if durable:
        path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
