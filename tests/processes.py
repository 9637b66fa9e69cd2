"""The processes a test run starts, read from /proc: who started each one, and how to stop it.

Why this exists: a CI run once left two `slurmstepd` processes (Slurm's per-job step daemons)
alive twenty minutes after pytest had exited. slurmd double-forks them, so they are re-parented
away from the test that caused them, and nothing noticed. The guard in tests/conftest.py uses
this module to find every process a test, a fixture or the session started and left running,
to kill it, and to fail whoever left it.

How a process is known to be this session's, without psutil (not a dependency):

- pytest marks itself a child subreaper (PR_SET_CHILD_SUBREAPER), so an orphan of anything it
  started (a daemon that double-forks, a job step whose slurmd was stopped) is re-parented to
  pytest instead of PID 1: it stays in pytest's tree, and ancestry alone says it is ours.
- Every child inherits `TOPOWATCH_TEST_SESSION=<unique value>` from pytest's environment; a
  process outside pytest's tree carrying that value (re-parented to PID 1 or to some other
  subreaper, where prctl was refused) is ours too. Ancestry or the marker is required: on a
  shared host PID 1 adopts other users' processes all the time, and a start time alone would
  make the guard kill them.

Who started it: the `Ledger` keeps a stack of windows (the session; a test from its setup to its
teardown; a module- or session-scoped fixture's setup inside it). A new process belongs to its
parent's owner when its parent is ours (a PostgreSQL backend belongs to the fixture that started
the postmaster), otherwise to the innermost window open when it started, compared by the start
time in /proc/PID/stat (clock ticks since boot). A harness that restarts a long-lived server on
behalf of its fixture while a test runs says so with `attributed_to(owner)`.

A process is identified by (pid, start time), so a recycled PID is never mistaken for it and
never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MARKER_ENV = "TOPOWATCH_TEST_SESSION"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PF_KTHREAD = 0x00200000  # <linux/sched.h>: kernel threads are never anyone's leak

TERM_GRACE_S = 3.0  # SIGTERM, then this long before SIGKILL
KILL_WAIT_S = 3.0  # after SIGKILL, how long to wait before calling a process unkillable
SETTLE_S = 2.0  # a process already exiting (terminated, not yet waited for) is not a leak

Key = tuple[int, int]  # pid, start time in clock ticks since boot: unique across PID reuse


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat showed it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int  # clock ticks since boot
    comm: str

    @property
    def key(self) -> Key:
        return (self.pid, self.start)

    @property
    def running(self) -> bool:
        """Not a zombie: a zombie has exited, only its exit status waits to be collected."""
        return self.state not in ("Z", "X", "x")


def read_stat(pid: int) -> Proc | None:
    """The process `pid` now; None once it is gone (or for a kernel thread)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
    left, right = data.find(b"("), data.rfind(b")")
    if left < 0 or right < 0:
        return None
    fields = data[right + 2 :].split()
    if int(fields[6]) & PF_KTHREAD:
        return None
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        state=fields[0].decode(),
        start=int(fields[19]),
        comm=data[left + 1 : right].decode(errors="replace"),
    )


def scan() -> dict[int, Proc]:
    """Every process on the host (kernel threads left out), by pid."""
    table: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := read_stat(int(name))) is not None:
            table[proc.pid] = proc
    return table


def tree(root: int) -> dict[int, Proc] | None:
    """`root` and its descendants only, read down through /proc/PID/task/TID/children: a few
    reads where `scan` reads every process on the host. None where the kernel lacks those files
    (CONFIG_PROC_CHILDREN) or `root` is gone."""
    table: dict[int, Proc] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        proc = read_stat(pid)
        if proc is None:
            if pid == root:
                return None
            continue
        table[pid] = proc
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                    todo.extend(int(child) for child in f.read().split())
            except FileNotFoundError:
                if pid == root and not os.path.exists(f"/proc/{pid}/task/{task}/children"):
                    return None  # not this kernel: fall back to a full scan
            except OSError:
                continue
    return table


def now_ticks() -> int:
    """Now, in the clock /proc/PID/stat's start time uses (ticks since boot, suspend included)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLOCK_TICKS)


def is_alive(proc: Proc) -> bool:
    """Still running and still the same process (not a zombie, not a recycled PID)."""
    now = read_stat(proc.pid)
    return now is not None and now.start == proc.start and now.running


def cmdline(proc: Proc) -> str:
    """Its command line, or `[comm]` when it has none left to read (a zombie, a kernel task)."""
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text or f"[{proc.comm}]"


def environ(pid: int) -> list[bytes]:
    """The process's environment as it was exec'd (b"NAME=value" entries); [] where it cannot
    be read (another user's process) or was overwritten (setproctitle: slurmstepd, postgres)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return [entry for entry in f.read().split(b"\0") if entry]
    except OSError:
        return []


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether `entry` (b"NAME=value") is in the process's exec'd environment."""
    return entry in environ(pid)


def open_paths(pid: int) -> list[str]:
    """The files the process has open (targets of /proc/PID/fd/*); [] where unreadable."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    paths: list[str] = []
    for fd in fds:
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return paths


def children_of(table: dict[int, Proc]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    return children


def descendants(table: dict[int, Proc], root: int) -> list[Proc]:
    """Every process below `root` in `table`, parents before their children."""
    children = children_of(table)
    found: list[Proc] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(table[pid])
        todo.extend(children.get(pid, []))
    return found


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (Linux >= 3.4), so that
    orphans come back to it instead of PID 1; False where prctl is unavailable or refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def wait_gone(procs: Iterable[Proc], timeout_s: float) -> list[Proc]:
    """Wait (bounded) until none of `procs` runs; those still running at the end."""
    left = [p for p in procs if is_alive(p)]
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if is_alive(p)]
    return left


def _send(proc: Proc, sig: signal.Signals) -> None:
    """Signal `proc` through a pidfd opened after checking its start time, so a PID that was
    recycled in the meantime is never hit."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        return  # gone already
    try:
        if is_alive(proc):
            signal.pidfd_send_signal(pidfd, sig)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        os.close(pidfd)


def own_groups(procs: Iterable[Proc], table: dict[int, Proc]) -> list[Proc]:
    """The process-group leaders among `procs` whose whole group is in `procs`: groups the
    owner made itself (start_new_session, a shell's job), which may be signalled as a whole.
    Never pytest's own group, never a group with a member that is not being stopped."""
    procs = list(procs)
    keys = {p.key for p in procs}
    leaders = [p for p in procs if p.pgid == p.pid and p.pgid != os.getpgrp()]
    return [
        leader
        for leader in leaders
        if all(
            member.key in keys
            for member in table.values()
            if member.pgid == leader.pgid and member.running
        )
    ]


def _signal_all(procs: list[Proc], groups: list[Proc], sig: signal.Signals) -> None:
    for leader in groups:
        if is_alive(leader):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader.pgid, sig)
    for proc in procs:
        _send(proc, sig)


def reap(procs: Iterable[Proc]) -> None:
    """Collect the exit status of those of `procs` that are now this process's zombies (its
    own children, or orphans it adopted as subreaper), so none lingers in the process table."""
    for proc in procs:
        now = read_stat(proc.pid)
        mine = now is not None and now.start == proc.start and now.ppid == os.getpid()
        if mine and now is not None and not now.running:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)


def terminate(
    procs: Iterable[Proc],
    table: dict[int, Proc] | None = None,
    grace_s: float = TERM_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> list[Proc]:
    """Stop `procs` by PID: SIGTERM, `grace_s` for them to exit, SIGKILL for the rest. Groups
    wholly made of `procs` are signalled as groups too, which catches a child forked meanwhile.
    Returns those still running afterwards (stuck in the kernel): nothing more can be done."""
    procs = [p for p in procs if is_alive(p)]
    if not procs:
        return []
    groups = own_groups(procs, scan() if table is None else table)
    _signal_all(procs, groups, signal.SIGTERM)
    left = wait_gone(procs, grace_s)
    if left:
        _signal_all(left, [g for g in groups if g in left], signal.SIGKILL)
        left = wait_gone(left, kill_wait_s)
    reap(procs)
    return left


def stop_tree(procs: Iterable[Proc], grace_s: float = TERM_GRACE_S) -> list[Proc]:
    """`terminate` each of `procs` and everything below them (children first is not needed:
    all are signalled at once, so none is orphaned and missed)."""
    table = scan()
    roots = [p for p in procs if is_alive(p)]
    everything = {p.key: p for p in roots}
    for root in roots:
        for below in descendants(table, root.pid):
            everything.setdefault(below.key, below)
    return terminate(everything.values(), table, grace_s)


# --- who started what ------------------------------------------------------------------------


@dataclass(eq=False)
class Owner:
    """What a process is charged to: the session, a test, or a wider-scoped fixture."""

    label: str
    start: int  # clock ticks since boot when its window opened


@dataclass(frozen=True)
class Leak:
    """A process that outlived its owner, as it was when found (before it was killed)."""

    proc: Proc
    command: str
    owner: Owner
    survived: bool = False  # still running even after SIGKILL

    def __str__(self) -> str:
        p = self.proc
        tail = "  (STILL RUNNING after SIGKILL)" if self.survived else ""
        return f"pid {p.pid} (ppid {p.ppid}, pgid {p.pgid}): {self.command}{tail}"


@dataclass
class Ledger:
    """Every process this session started, and who started it (see the module docstring).

    Windows open and close on one thread (pytest's); a lock keeps a harness thread that calls
    `attributed_to` from interleaving with them."""

    root: int = field(default_factory=os.getpid)
    marker: str = field(default_factory=lambda: f"{os.getpid()}-{secrets.token_hex(8)}")
    subreaper: bool = False
    session: Owner = field(
        default_factory=lambda: Owner("the session (collection, session hooks, between tests)", 0)
    )

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._windows: list[Owner] = [self.session]
        self._owners: dict[Key, Owner] = {}
        self._first_parent: dict[Key, int] = {}  # ppid when first seen
        self._foreign: set[Key] = set()
        self._entry = f"{MARKER_ENV}={self.marker}".encode()
        self._baseline = {p.key for p in scan().values()}

    def install(self) -> None:
        """Mark the environment children inherit, become their subreaper, and make this the
        ledger `current_owner` and `attributed_to` answer from."""
        global _ledger
        os.environ[MARKER_ENV] = self.marker
        self.subreaper = become_subreaper()
        _ledger = self

    def uninstall(self) -> None:
        global _ledger
        if _ledger is self:
            _ledger = None

    def current(self) -> Owner:
        return self._windows[-1]

    def open(self, label: str) -> Owner:
        """Open a window: processes that start from now on, not below one of ours, are its.
        What started before is charged first, to the window below: start times are in clock
        ticks (10 ms), too coarse to tell a process started just before from one just after.
        That charge reads pytest's tree only (a test opens a window each time: a full scan
        per test costs more); a marked process elsewhere is charged by start time alone."""
        with self._lock:
            self.claim(full=False)
            owner = Owner(label, now_ticks())
            self._windows.append(owner)
            return owner

    def close(self, owner: Owner) -> dict[int, Proc]:
        """Close `owner`'s window, charging it what started in it; the scan it took."""
        with self._lock:
            table = self.claim()
            if owner in self._windows:
                self._windows.remove(owner)
            return table

    @contextlib.contextmanager
    def window(self, owner: Owner) -> Iterator[None]:
        """Reopen `owner`'s window (it may have closed long ago): what starts inside is its."""
        with self._lock:
            self.claim()
            self._windows.append(owner)
        try:
            yield
        finally:
            self.close(owner)

    def _window_at(self, start: int) -> Owner:
        for owner in reversed(self._windows):
            if start >= owner.start:
                return owner
        return self.session

    def claim(self, full: bool = True) -> dict[int, Proc]:
        """Scan /proc and charge every new process of ours to its owner; the scan. With
        `full=False`, pytest's tree only (what it returns then is that tree)."""
        with self._lock:
            table = None if full else tree(self.root)
            if table is None:
                table, full = scan(), True
            ours = self._ours(table, full)
            for proc in ours.values():
                chain: list[Proc] = []
                step: Proc | None = proc
                seen: set[object] = set()
                # A recycled PID can make parent links loop (a child whose PID an ancestor's
                # parent once had): stop at the first process seen twice.
                while step is not None and step.key not in self._owners and step.key not in seen:
                    seen.add(step.key)
                    chain.append(step)
                    step = ours.get(step.ppid)
                if step is not None and step.key in seen:
                    step = None
                owner = self._owners[step.key] if step is not None else None
                for link in reversed(chain):  # the topmost new ancestor first
                    owner = owner or self._window_at(link.start)
                    self._owners[link.key] = owner
                self._first_parent.setdefault(proc.key, proc.ppid)
            self._reap_adopted(ours)
            if not full:
                return table
            live = {p.key for p in table.values()}
            self._owners = {k: o for k, o in self._owners.items() if k in live}
            self._first_parent = {k: v for k, v in self._first_parent.items() if k in live}
            self._foreign &= live
            return table

    def _reap_adopted(self, ours: dict[int, Proc]) -> None:
        """Collect the zombies of orphans pytest adopted as subreaper, seen earlier under
        another parent: no subprocess.Popen waits for those (Popen only waits for children it
        forked itself, which were pytest's from the start)."""
        reap(
            p
            for p in ours.values()
            if not p.running and p.ppid == self.root and self._first_parent.get(p.key) != p.ppid
        )

    def reap_all(self) -> None:
        """At the very end: collect every zombie child left, adopted or not, so none is handed
        to PID 1 when pytest exits (a container's init may be slow to collect them)."""
        reap(p for p in scan().values() if p.ppid == self.root and not p.running)

    def _ours(self, table: dict[int, Proc], full: bool = True) -> dict[int, Proc]:
        """The processes this session started that still exist: pytest's descendants, and
        (in a full scan) those elsewhere that carry the session's marker."""
        mine = {p.pid: p for p in descendants(table, self.root) if p.key not in self._baseline}
        for proc in table.values() if full else ():
            key = proc.key
            if proc.pid in mine or proc.pid == self.root or key in self._baseline:
                continue
            if key in self._owners:
                mine[proc.pid] = proc
            elif key not in self._foreign:
                if environ_has(proc.pid, self._entry):
                    mine[proc.pid] = proc
                else:
                    self._foreign.add(key)
        return mine

    def running(self, owner: Owner | None, table: dict[int, Proc]) -> list[Proc]:
        """`owner`'s processes (every owner's, for None) still running in `table`, by start."""
        found = [
            proc
            for proc in table.values()
            if proc.running
            and (o := self._owners.get(proc.key)) is not None
            and (owner is None or (o is owner and proc.start >= owner.start))
        ]
        return sorted(found, key=lambda p: (p.start, p.pid))

    def stop_leftovers(self, owner: Owner | None, settle_s: float = SETTLE_S) -> list[Leak]:
        """Close `owner`'s window if open, and kill what `owner` (everyone, for None) left
        running, after `settle_s` for processes already on their way out; what was found, as
        it was before the kill."""
        with self._lock:
            table = self.claim()
            if owner in self._windows:
                self._windows.remove(owner)
            left = self.running(owner, table)
            deadline = time.monotonic() + settle_s
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                table = self.claim()
                left = self.running(owner, table)
            if not left:
                return []
            found = [(p, cmdline(p), self._owners[p.key]) for p in left]
            survivors = {p.key for p in terminate(left, table)}
            self.claim()
            return [Leak(p, command, o, p.key in survivors) for p, command, o in found]


_ledger: Ledger | None = None


def current_owner() -> Owner | None:
    """Whoever processes started now are charged to; None when no guard runs (benchmarks)."""
    return None if _ledger is None else _ledger.current()


def attributed_to(owner: Owner | None) -> contextlib.AbstractContextManager[None]:
    """Charge processes started inside to `owner` (taken with `current_owner()` when a
    long-lived harness was made): a session server that a test stops and starts again stays
    the session fixture's, instead of becoming a leak of that test."""
    if _ledger is None or owner is None:
        return contextlib.nullcontext()
    return _ledger.window(owner)
