"""Child processes that never outlive the benchmark that started them.

    with child([...], stdout=subprocess.DEVNULL) as proc:
        ...

A child started here is stopped (SIGTERM, then SIGKILL after `stop_timeout` s) when the `with`
block ends, normally or by an exception: KeyboardInterrupt on Ctrl-C, and SystemExit on SIGTERM
once `exit_on_sigterm()` has been called. If the benchmark is killed outright (SIGKILL, the OOM
killer, a CI job's timeout), no Python code runs at all; for that the kernel sends each child
SIGTERM when the benchmark dies (Linux PR_SET_PDEATHSIG, set in the child before it execs).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _find_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once here in the parent: the child, between fork and exec,
    should only make the call (see _die_with_parent)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl  # libc's, in Python
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _find_prctl()


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec_fn (run in the child after fork, before exec) asking the kernel to send the
    child SIGTERM when the benchmark dies; None where there is no prctl (not Linux).

    Why: terminate() in a `finally` runs only while the benchmark is alive to run it. Killed
    with SIGKILL, the benchmark runs nothing, and its children, re-parented to init, would keep
    running, holding their ports and CPU, skewing the next run's numbers. PR_SET_PDEATHSIG
    survives exec (not into setuid programs). It fires when the *thread* that started the
    child exits, not only the process: start children from the main thread, or from a thread
    that outlives them.
    """
    prctl = _PRCTL
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the benchmark died before prctl took effect
            os._exit(1)

    return preexec


def start(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Popen(args, **popen) for a child that gets SIGTERM when this process dies."""
    return subprocess.Popen(list(args), preexec_fn=_die_with_parent(os.getpid()), **popen)


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout` s, then SIGKILL; returns once the child is reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def child(
    args: Sequence[str], stop_timeout: float = 10.0, **popen: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a child (see `start`) and stop it (see `stop`) however the block ends."""
    proc = start(args, **popen)
    try:
        yield proc
    finally:
        stop(proc, stop_timeout)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit(143) in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so that `with` and `finally` blocks run and stop the children. A second
    SIGTERM is let pass while they do, so the cleanup is not itself cut short (SIGKILL still
    ends everything, children included). Call from the main thread."""
    stopping = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:  # a handler, not SIG_IGN: an ignored signal would stay ignored in children
            return
        stopping = True
        print("benchmark: SIGTERM, cleaning up", file=sys.stderr)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
