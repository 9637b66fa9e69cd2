"""Custom health-check scripts, run the way node-problem-detector's custom plugin monitor runs
them, so existing NPD and HyperPod-style scripts work unchanged.

The protocol (kubernetes/node-problem-detector, pkg/custompluginmonitor):

- exit code 0 is OK, 1 is NonOK (a problem), anything else Unknown (`types/types.go`; the
  `switch exitCode` in `plugin/plugin.go`). A script killed by a signal has no exit code:
  Unknown. A script that cannot be started: Unknown ("Error in starting plugin").
- the message is stdout with surrounding white space trimmed, cut at `max_output_length`
  bytes, 80 by default (`strings.TrimSpace`, then `output[:MaxOutputLength]` in plugin.go;
  `defaultMaxOutputLength = 80` in `types/config.go`). Only the first 4 KiB of stdout and of
  stderr are kept, the rest is read and dropped (`maxCustomPluginBufferBytes = 1024 * 4`,
  `readFromReader`: `io.LimitReader`, then `io.Copy(ioutil.Discard, ...)`).
- the script runs without a shell, from its path with its args, in a process group of its own
  (`Setpgid: true`, `util/exec_unix.go`); on timeout the whole group gets SIGKILL
  (`syscall.Kill(-pid, SIGKILL)`). Defaults: every 30 s, 5 s timeout (`types/config.go`).

Two things go further than NPD: once the script itself exits, whatever it left running in its
group is killed too (NPD would wait for a backgrounded child holding stdout until the timeout),
and a check never runs twice at once: a turn that comes while the last run is still going is
skipped and counted.

The runner owns one scheduler thread and one short-lived thread per run; the poller reads the
latest results (`read`) as plain data, so a slow script never slows a poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from exporter.core.snapshot import (
    CUSTOM_OK,
    CUSTOM_PROBLEM,
    CUSTOM_RESULTS,
    CUSTOM_UNKNOWN,
    CustomCheckReading,
)

log = logging.getLogger(__name__)

READ_CAP_BYTES = 4096  # NPD's maxCustomPluginBufferBytes: kept of stdout and of stderr each
CHUNK_BYTES = 65536  # one read; what is past the cap is dropped chunk by chunk
DEFAULT_MAX_OUTPUT_LENGTH = 80  # NPD's defaultMaxOutputLength
DEFAULT_INTERVAL_SECONDS = 30.0  # NPD's defaultInvokeInterval
DEFAULT_TIMEOUT_SECONDS = 5.0  # NPD's defaultGlobalTimeout
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_POLL_SECONDS = 0.05  # only where pidfd_open is missing: how often to look for the exit


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One script to run: what the health config's `custom_checks` entry says."""

    name: str
    path: str
    args: tuple[str, ...] = ()
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_output_length: int = DEFAULT_MAX_OUTPUT_LENGTH


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run of one script."""

    result: str  # ok | problem | unknown | timeout | error
    status: int  # CUSTOM_OK / CUSTOM_PROBLEM / CUSTOM_UNKNOWN
    message: str
    exit_code: int | None  # None: not started, or killed by a signal
    duration_seconds: float
    stdout_bytes: int = 0  # everything the script wrote on stdout, kept or dropped
    stdout_kept: int = 0  # of which kept (at most READ_CAP_BYTES)
    stderr: bytes = b""  # the first READ_CAP_BYTES of stderr


# --- one run -------------------------------------------------------------------------------


def run_check(
    spec: CheckSpec,
    timer: Callable[[], float] = time.monotonic,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Outcome:
    """Run the script once and return how it ended; never raises for the script's faults.

    `started` is told the process as soon as it exists (the runner keeps it to kill its group
    on shutdown). Returns once the script has exited and its group is gone (or, for a group
    member that escaped the group and holds the pipes, once the timeout passed).
    """
    begin = timer()
    problem = _not_runnable(spec.path)
    if problem is not None:
        return Outcome("error", CUSTOM_UNKNOWN, problem, None, timer() - begin)
    try:
        proc = subprocess.Popen(
            [spec.path, *spec.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            process_group=0,  # its own group, as NPD's Setpgid: the timeout kills them all
        )
    except OSError as e:  # exec format error (no #! line), permission, ...
        message = f"cannot start {spec.path}: {e.strerror or e}"
        return Outcome("error", CUSTOM_UNKNOWN, message, None, timer() - begin)
    if started is not None:
        started(proc)
    try:
        return _supervise(proc, spec, timer, begin)
    finally:
        _reap(proc)


def _not_runnable(path: str) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{path} not found"
    except OSError as e:
        return f"cannot stat {path}: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable"
    return None


class _Capped:
    """The first `cap` bytes of a stream; the rest counted and dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    def take(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]


def _supervise(
    proc: subprocess.Popen[bytes], spec: CheckSpec, timer: Callable[[], float], begin: float
) -> Outcome:
    assert proc.stdout is not None and proc.stderr is not None
    deadline = begin + spec.timeout_seconds
    out, err = _Capped(READ_CAP_BYTES), _Capped(READ_CAP_BYTES)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    pidfd = _pidfd(proc.pid)
    timed_out = False
    exited = False
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        try:
            while streams or not exited:  # until EOF on both pipes and the exit
                left = deadline - timer()
                if left <= 0:
                    if not exited:  # the leader is unreaped: its pid still names the group
                        timed_out = True
                        _kill_group(proc.pid)
                    break  # whatever still holds the pipes escaped the group: stop reading
                if not exited and pidfd is None:
                    left = min(left, _POLL_SECONDS)
                for key, _ in sel.select(left):
                    fd = int(key.fd)
                    if fd == pidfd:
                        continue
                    try:
                        data = os.read(fd, CHUNK_BYTES)
                    except BlockingIOError:
                        continue
                    if data:
                        streams[fd].take(data)
                    else:
                        sel.unregister(fd)
                        del streams[fd]
                if not exited and _has_exited(proc.pid):
                    exited = True
                    # The script is done: what it left behind in its group goes too (its
                    # zombie keeps the group's id from being reused until we reap it).
                    _kill_group(proc.pid)
                    if pidfd is not None:
                        sel.unregister(pidfd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    message = npd_message(bytes(out.kept), spec.max_output_length)

    def outcome(result: str, status: int, text: str, code: int | None) -> Outcome:
        return Outcome(
            result, status, text, code, timer() - begin, out.total, len(out.kept), bytes(err.kept)
        )

    if timed_out:
        said = f"; output: {message}" if message else ""
        text = f"timed out after {spec.timeout_seconds:g}s, process group killed{said}"
        return outcome("timeout", CUSTOM_UNKNOWN, text, None)
    code = proc.wait()
    if code == 0:
        return outcome("ok", CUSTOM_OK, message, code)
    if code == 1:
        return outcome("problem", CUSTOM_PROBLEM, message, code)
    if code < 0:
        text = f"killed by signal {-code}" + (f": {message}" if message else "")
        return outcome("unknown", CUSTOM_UNKNOWN, text, None)
    return outcome("unknown", CUSTOM_UNKNOWN, message, code)


def npd_message(stdout: bytes, max_length: int) -> str:
    """NPD's status message: stdout trimmed, cut at `max_length` bytes; control characters
    (binary garbage) shown as U+FFFD so the message is safe in logs, JSON and Events."""
    cut = stdout.strip()[:max_length].decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in cut)


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:  # a kernel before 5.3, or a seccomp profile that refuses it
        return None


def _has_exited(pid: int) -> bool:
    """Whether the process has exited, without reaping it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the (killed or exited) leader and close the pipes. A leader that SIGKILL cannot
    end at once (in the D state) keeps the run, and so the check, in flight: its turns are
    skipped and counted rather than a second copy started."""
    try:
        proc.wait()
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# --- the runner ----------------------------------------------------------------------------


class _State:
    """One check's schedule, in-flight run and counters (guarded by the runner's lock)."""

    def __init__(self, spec: CheckSpec, history: int) -> None:
        self.spec = spec
        self.next_at: float | None = None  # monotonic; None: due at once
        self.running: threading.Thread | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.reading = CustomCheckReading(check=spec.name)
        self.recent: deque[int] = deque(maxlen=history)
        self.runs = dict.fromkeys(CUSTOM_RESULTS, 0)
        self.buckets = [0] * len(DURATION_BUCKETS)
        self.duration_sum = 0.0
        self.duration_count = 0
        self.logged: tuple[str, str] | None = None  # the last (result, message) logged


class CustomCheckRunner:
    """Runs every configured check on its own interval in the background.

    `read` hands the poller one `CustomCheckReading` per check. `tick(now)` is one pass of the
    scheduler (tests call it with their own `now`); `start` runs the scheduler in a thread.
    """

    def __init__(
        self,
        specs: Sequence[CheckSpec],
        history: int = 16,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("custom check names must be unique")
        self._clock = clock
        self._timer = timer
        self._states = {s.name: _State(s, max(1, history)) for s in specs}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def specs(self) -> tuple[CheckSpec, ...]:
        return tuple(st.spec for st in self._states.values())

    # -- the poller's side ------------------------------------------------------------------

    def read(self) -> tuple[CustomCheckReading, ...]:
        with self._lock:
            return tuple(self._reading(st) for st in self._states.values())

    def close(self) -> None:
        """Stop scheduling and kill the process groups of runs under way."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            running = [st.process for st in self._states.values() if st.process is not None]
        for proc in running:
            _kill_group(proc.pid)
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    # -- scheduling -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="topowatch-custom-checks", daemon=True
        )
        self._thread.start()

    def tick(self, now: float | None = None) -> float | None:
        """Start every check that is due at `now` (monotonic seconds) and not running; a check
        still running from an earlier turn skips this one (counted). Returns when the next
        check falls due, or None when there is none."""
        now = self._timer() if now is None else now
        upcoming: list[float] = []
        with self._lock:
            if self._stop.is_set():
                return None
            for st in self._states.values():
                if st.next_at is None:
                    st.next_at = now
                if st.next_at <= now:
                    interval = st.spec.interval_seconds
                    missed = int((now - st.next_at) // interval)  # turns passed unnoticed
                    if st.running is not None:
                        st.runs["skipped"] += 1 + missed
                        self._log_skip(st)
                    else:
                        st.runs["skipped"] += missed
                        self._launch(st)
                    st.next_at += (missed + 1) * interval
                upcoming.append(st.next_at)
        return min(upcoming, default=None)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the runs under way to finish; False if some still run after `timeout`."""
        end = None if timeout is None else self._timer() + timeout
        while True:
            with self._lock:
                threads = [st.running for st in self._states.values() if st.running is not None]
            if not threads:
                return True
            for t in threads:
                t.join(None if end is None else max(0.0, end - self._timer()))
            if end is not None and self._timer() >= end:
                with self._lock:
                    return all(st.running is None for st in self._states.values())

    def run_all_once(self) -> None:
        """Run every check now and wait for them (the agent's `--once`)."""
        self.tick()
        longest = max((s.spec.timeout_seconds for s in self._states.values()), default=0.0)
        self.wait_idle(longest + 10.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                due = self.tick()
            except Exception:  # never let the scheduler die
                log.exception("custom check scheduler failed")
                due = None
            delay = 1.0 if due is None else max(0.0, due - self._timer())
            self._wake.wait(delay)
            self._wake.clear()

    def _launch(self, st: _State) -> None:
        thread = threading.Thread(
            target=self._run, args=(st,), name=f"topowatch-check-{st.spec.name}", daemon=True
        )
        st.running = thread
        thread.start()

    def _run(self, st: _State) -> None:
        def started(proc: subprocess.Popen[bytes]) -> None:
            with self._lock:
                st.process = proc
            if self._stop.is_set():  # closed while starting: do not leave it behind
                _kill_group(proc.pid)

        try:
            outcome = run_check(st.spec, self._timer, started)
        except Exception as e:  # a bug here must not stop the check for good
            log.exception("custom check %s: the runner failed", st.spec.name)
            outcome = Outcome("error", CUSTOM_UNKNOWN, f"runner error: {e}", None, 0.0)
        finished = self._clock()
        with self._lock:
            self._record(st, outcome, finished)
            st.process = None
            st.running = None
        self._log_outcome(st, outcome)
        if outcome.stderr and outcome.status != CUSTOM_OK:
            log.debug("custom check %s stderr: %r", st.spec.name, outcome.stderr[:512])

    def _record(self, st: _State, outcome: Outcome, finished: float) -> None:
        st.runs[outcome.result] += 1
        st.recent.append(outcome.status)
        for i, bound in enumerate(DURATION_BUCKETS):
            if outcome.duration_seconds <= bound:
                st.buckets[i] += 1
        st.duration_sum += outcome.duration_seconds
        st.duration_count += 1
        st.reading = replace(
            st.reading,
            status=outcome.status,
            result=outcome.result,
            message=outcome.message,
            finished_at=finished,
        )

    def _reading(self, st: _State) -> CustomCheckReading:
        return replace(
            st.reading,
            recent=tuple(st.recent),
            runs=dict(st.runs),
            duration_buckets=tuple(zip(DURATION_BUCKETS, st.buckets, strict=True)),
            duration_sum=st.duration_sum,
            duration_count=st.duration_count,
        )

    # -- logging: once per change, not once per run -----------------------------------------

    def _log_outcome(self, st: _State, outcome: Outcome) -> None:
        key = (outcome.result, outcome.message if outcome.result == "error" else "")
        if st.logged == key:
            return
        first = st.logged is None
        st.logged = key
        name = st.spec.name
        if outcome.result == "error":
            log.warning("custom check %s cannot run: %s", name, outcome.message)
        elif outcome.result == "ok":
            if not first:
                log.info("custom check %s: ok again", name)
        else:
            log.warning("custom check %s: %s: %s", name, outcome.result, outcome.message)

    def _log_skip(self, st: _State) -> None:
        if st.runs["skipped"] == 1:
            log.warning(
                "custom check %s still running at its next turn (interval %gs): turn skipped",
                st.spec.name,
                st.spec.interval_seconds,
            )
