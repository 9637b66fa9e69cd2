"""Production readers of the kernel log: /dev/kmsg, or the systemd journal where it cannot be read.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg; kernel/printk/printk.c) hands out one record per
`read()`, formatted by `info_print_ext_header` and `msg_print_ext_body`:

    prio,seq,usec,flags[,more];message\\n
     SUBSYSTEM=pci\\n                     (continuation lines: the record's dev_info, dropped)
     DEVICE=+pci:0000:53:00.0\\n

`prio` is `facility << 3 | level`, `seq` the record's sequence number (0 at boot, +1 a record),
`usec` the printk timestamp, `flags` `-` or `c` (LOG_CONT; kernels before 4.9 also wrote `+`),
and `more` optional fields such as `caller=T123` (CONFIG_PRINTK_CALLER). `msg_add_ext_text`
escapes every byte below 0x20, from 0x7f up, and the backslash itself as `\\xNN`, so a
backslash in the text always starts an escape. The kernel cuts a formatted record at its output
buffer (PRINTK_MESSAGE_MAX, 2 KiB since 6.1; CONSOLE_EXT_LOG_MAX, 8 KiB before), which can drop
the trailing newline or cut an escape in half: such a message is kept as far as it goes.

The device's semantics that `KmsgSource` relies on (kernel/printk/printk.c):

* `devkmsg_open` starts a reader at the oldest record still held (`prb_first_valid_seq`) and
  refuses a reader without CAP_SYSLOG under `dmesg_restrict=1` (`check_syslog_permissions`:
  EPERM), or when `printk_devkmsg=off` (EPERM).
* `devkmsg_read` returns exactly one record; EAGAIN on an O_NONBLOCK reader when no new record
  exists; EPIPE when the reader's next record was overwritten (the ring wrapped past it), after
  moving the reader to the oldest record still held; EINVAL when the caller's buffer is smaller
  than the record, after moving the reader past it (the record is lost to this reader).
* `devkmsg_llseek(fd, 0, SEEK_END)` moves the reader after the newest record.

Where /dev/kmsg cannot be read (a container without the device, or without CAP_SYSLOG),
`JournalSource` reads the same lines from the systemd journal through libsystemd;
`open_kernel_log` picks one for the CLI's `--kernel-log` flag.

Nothing here raises for what a record contains: a record that does not parse is counted as
malformed. Only a device that cannot be read at all raises `SourceError`, once per call, and the
next call reopens it and resumes after the last record handed out.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from exporter.core.atomicfile import atomic_write
from exporter.core.snapshot import KernelLogBatch, KernelLogRecord
from exporter.sources.interfaces import KernelLogSource, SourceError

log = logging.getLogger(__name__)

KMSG_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# A record with its dev_info is at most CONSOLE_EXT_LOG_MAX (8 KiB, kernels before 6.1) or
# PRINTK_MESSAGE_MAX (2 KiB since); a buffer that size can never see EINVAL from a stock kernel.
READ_BUFFER_BYTES = 8192
DEFAULT_MAX_RECORDS_PER_READ = 20000
# How many records a start "at the end" walks before giving up on learning the newest seq and
# seeking to the end blind (only a log growing faster than it can be read gets there).
END_WALK_LIMIT = 1_000_000
KMSG_STATE_FILE = "kmsg.state.json"
JOURNAL_STATE_FILE = "journal.state.json"
KERNEL_LOG_MODES = ("auto", "kmsg", "journal", "off")

# `\xNN` -> the byte, for both cases of hex digit (the kernel writes lower case).
_UNHEX: dict[bytes, bytes] = {}
for _i in range(256):
    _UNHEX[b"%02x" % _i] = bytes((_i,))
    _UNHEX[b"%02X" % _i] = bytes((_i,))


def _unescape(text: bytes) -> bytes:
    """Undo msg_add_ext_text's `\\xNN` escapes. Split-and-join beats a regex callback here; an
    escape the kernel cut short at the end of its buffer stays as it is."""
    parts = text.split(b"\\x")
    out = [parts[0]]
    unhex = _UNHEX
    for part in parts[1:]:
        byte = unhex.get(part[:2])
        if byte is None:
            out.append(b"\\x" + part)
        else:
            out.append(byte)
            out.append(part[2:])
    return b"".join(out)


# prio,seq,usec: ASCII digits (a bytes pattern's \d is [0-9] only); flags: one field, not empty;
# then optional `,key=value` fields up to the `;`; the message runs to the first newline (the
# continuation lines after it are dropped) or to the end where the kernel cut the record short.
# `[^;,]+` cannot match the comma that starts the optional fields, so a long line without `;`
# fails in linear time, not by backtracking.
_RECORD = re.compile(rb"(\d+),(\d+),(\d+),[^;,]++(?:,[^;]*+)?;([^\n]*+)")


def parse_record(raw: bytes, boot_time: float) -> KernelLogRecord | None:
    """One /dev/kmsg record (`prio,seq,usec,flags[,more];message\\n[ KEY=value\\n...]`) as a
    record, or None when it does not parse (the caller counts it as malformed).

    Runs once per kernel log line, so it stays on bytes and decodes once. One compiled match
    validates and splits the header in C: measured here it beats find/split/isdigit (about
    1.15 against 1.3 us a record on this machine, before the record is built). `boot_time` is
    the wall-clock time of boot: timestamp = boot_time + usec.
    """
    m = _RECORD.match(raw)
    if m is None:
        return None
    prio, seq, usec, text = m.groups()
    if b"\\" in text:
        text = _unescape(text)
    usec_i = int(usec)
    # Positional: KernelLogRecord(seq, monotonic_usec, timestamp, priority, message); keywords
    # cost ~150 ns a record in the frozen dataclass's __init__.
    return KernelLogRecord(
        int(seq), usec_i, boot_time + usec_i / 1e6, int(prio) & 7, text.decode("utf-8", "replace")
    )


def _record_seq(raw: bytes) -> int | None:
    """Just the seq of a record: what a walk over records already handed out needs."""
    first = raw.find(b",")
    second = raw.find(b",", first + 1)
    if first < 0 or second < 0:
        return None
    seq = raw[first + 1 : second]
    return int(seq) if seq.isdigit() else None


def real_boot_time(clock: Callable[[], float] = time.time) -> float:
    """The wall-clock time of boot, for turning printk's timestamps into unix seconds.

    printk stamps records with `local_clock()` (kernel/printk/printk.c `vprintk_store`), the
    scheduler clock: nanoseconds since boot, which tracks CLOCK_MONOTONIC to within
    microseconds on modern x86 and arm64 (both count from boot, neither includes suspend).
    So boot = now - CLOCK_MONOTONIC, taken once when the device is opened; an NTP step later
    shifts wall time but not the kernel's stamps, which is what dmesg -T does too.
    """
    return clock() - time.clock_gettime(time.CLOCK_MONOTONIC)


def real_boot_id() -> str:
    """This boot's random id: a different one means the node rebooted (and seq restarted)."""
    with open(BOOT_ID_PATH, encoding="ascii") as f:
        return f.read().strip()


class KmsgDevice(Protocol):
    """An open /dev/kmsg reader: what `os.read` on the real device does, and a SEEK_END."""

    def read(self, size: int) -> bytes:
        """One record; BlockingIOError (EAGAIN), BrokenPipeError (EPIPE), OSError (EINVAL...)."""
        ...

    def seek_end(self) -> None: ...

    def close(self) -> None: ...


class _OsKmsgDevice:
    """The real character device, opened O_RDONLY|O_NONBLOCK (never blocks a poll)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def read(self, size: int) -> bytes:
        return os.read(self._fd, size)

    def seek_end(self) -> None:
        os.lseek(self._fd, 0, os.SEEK_END)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def os_opener(path: str | os.PathLike[str]) -> Callable[[], KmsgDevice]:
    """The default opener seam: `os.open` on `path`."""
    spath = os.fspath(path)
    return lambda: _OsKmsgDevice(spath)


class _StateFile:
    """A small JSON state file, replaced atomically (exporter/core/atomicfile.py: temp file +
    rename) so a crash mid-write leaves the old state or the new, never half. No fsync: the
    state only has to survive the agent's restart (the page cache does); after a power loss the
    node has rebooted and the kmsg state is void anyway (a new boot id), the journal's cursor
    merely replays a little."""

    def __init__(self, path: Path | None, what: str) -> None:
        self.path = path
        self._what = what
        self._written: dict[str, Any] | None = None
        self._write_failed = False

    def load(self) -> tuple[dict[str, Any] | None, str]:
        """The saved state, or None and why not."""
        if self.path is None:
            return None, "no state file configured"
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None, f"no state file {self.path}"
        except (OSError, ValueError) as e:
            return None, f"state file {self.path} unreadable ({e})"
        if not isinstance(data, dict):
            return None, f"state file {self.path} corrupt (not an object)"
        self._written = data
        return data, ""

    def save(self, data: dict[str, Any]) -> None:
        """Write when it changed; a failure is logged once and reading goes on."""
        if self.path is None or data == self._written:
            return
        try:
            atomic_write(self.path, json.dumps(data, sort_keys=True), durable=False)
        except OSError as e:
            if not self._write_failed:
                log.warning(
                    "%s: cannot write state file %s (%s): reading goes on, but a restart of"
                    " the agent will not resume where it stopped",
                    self._what,
                    self.path,
                    e,
                )
                self._write_failed = True
            return
        if self._write_failed:
            log.info("%s: state file %s writable again", self._what, self.path)
            self._write_failed = False
        self._written = dict(data)


class KmsgSource:
    """/dev/kmsg as a `KernelLogSource`: non-blocking, bounded, restart-safe.

    Where a read starts:

    * state file with this boot's id: right after the saved seq. A fresh open starts at the
      oldest record (`devkmsg_open`), so the records up to the saved seq are walked over
      unparsed; if the first newer one is beyond seq+1 the gap was overwritten while the agent
      was down and is counted as dropped.
    * state file from another boot (the node rebooted): everything in the buffer, all of it
      written since the agent last ran; records of this boot the ring already lost (seq 0 up to
      the oldest held) count as dropped.
    * no state file, or one that cannot be read: at the end, so old lines are not replayed as
      new events. The start walks to the newest record rather than seeking blind
      (`devkmsg_llseek` SEEK_END) so that it learns the newest seq and can write the state at
      once: a restart before the next kernel line then still resumes exactly. Only a walk that
      does not end within END_WALK_LIMIT records falls back to SEEK_END.

    Loss is counted exactly from the seq numbers: every record read carries its seq, and a
    record beyond the one expected means the ring overwrote the ones between (the EPIPE case
    of `devkmsg_read`: the reader was moved to the oldest record still held).

    A device that fails (ENOENT, ENODEV, EIO, EACCES, ...) is closed and the call raises
    `SourceError("kmsg_unreadable")`; what that call had read is not handed out nor saved, so
    the next call reopens and re-reads it from the ring, resuming after the last seq handed out.
    """

    name = "kmsg"

    def __init__(
        self,
        path: str | os.PathLike[str] = KMSG_PATH,
        state_path: Path | None = None,
        max_records_per_read: int = DEFAULT_MAX_RECORDS_PER_READ,
        clock: Callable[[], float] = time.time,
        *,
        opener: Callable[[], KmsgDevice] | None = None,
        boot_id: Callable[[], str] = real_boot_id,
        boot_time: Callable[[], float] | None = None,
        read_buffer_bytes: int = READ_BUFFER_BYTES,
        keep: Callable[[bytes], bool] | None = None,
    ) -> None:
        """`keep`, when given, is asked about each raw record: a record it refuses is counted
        (`KernelLogBatch.skipped`) and its seq accounted for, but not parsed nor handed out.
        The pattern table's cheap gate (exporter/node/kernel/patterns.py `record_may_match`) goes
        here: at a thousand lines a second, parsing lines no pattern can match is most of the
        work left besides the read itself."""
        if max_records_per_read < 1:
            raise ValueError("max_records_per_read must be at least 1")
        self.path = os.fspath(path)
        self._opener = opener if opener is not None else os_opener(self.path)
        self._boot_time_fn = boot_time or (lambda: real_boot_time(clock))
        self._max = max_records_per_read
        self._keep = keep
        self._bufsize = max(read_buffer_bytes, READ_BUFFER_BYTES)
        self._state = _StateFile(state_path, "kmsg")
        self._dev: KmsgDevice | None = None
        self._boot_time = 0.0
        self._empty_reads_logged = False
        try:
            self._boot_id = boot_id()
        except OSError as e:
            log.warning("kmsg: cannot read the boot id (%s): a reboot cannot be told apart", e)
            self._boot_id = ""
        # _committed: the last seq handed out (or walked past at the start); None: not known yet.
        # _replay_all: the next open reads everything held (a new boot since the state was saved).
        self._committed: int | None = None
        self._replay_all = False
        self._walk_done = False  # the start at the end has walked to the newest record
        saved, why = self._state.load()
        seq = saved.get("seq") if saved is not None else None
        if saved is not None and not (isinstance(seq, int) and seq >= -1):
            saved, why = None, f"state file {state_path} corrupt (no seq)"
        if saved is None or not self._boot_id:
            log.info("kmsg: %s: starting at the end of the kernel log (no replay)", why)
        elif saved.get("boot_id") == self._boot_id:
            self._committed = seq
        else:
            log.info("kmsg: the node rebooted since the state was saved: reading the whole buffer")
            self._replay_all = True
        if self._committed is None and not self._replay_all:
            # "The end" is where the log stood when the agent started, not at its first poll:
            # a line logged in between is new. The walk hands nothing out; a device that cannot
            # be read now is walked on the first read that works.
            with contextlib.suppress(SourceError):
                self.read()

    def read(self) -> KernelLogBatch:
        """Every record new since the last call, at most `max_records_per_read` of them."""
        if self._dev is None:
            self._open()
        dev = self._dev
        assert dev is not None
        records: list[KernelLogRecord] = []
        dropped = malformed = skipped = 0
        keep = self._keep
        walking = False
        expected: int | None  # the seq the next record should carry; None: any (no baseline)
        if self._replay_all:
            expected = 0
        elif self._committed is not None:
            expected = self._committed + 1
        else:
            expected = None
            walking = not self._walk_done
        unknown = 0  # records consumed since the last known seq whose seq could not be read
        # A skipped record's seq is not read: without an EPIPE the kernel hands out consecutive
        # seqs (devkmsg_read returns EPIPE whenever the next record is not user->seq), so
        # counting is exact; after an EPIPE the next record's seq is read to size the gap.
        resync = True
        walked = 0
        bufsize, limit, boot_time, parse = self._bufsize, self._max, self._boot_time, parse_record
        append = records.append
        try:
            while len(records) + malformed + skipped < limit:
                try:
                    raw = dev.read(bufsize)
                except BlockingIOError:
                    break
                except BrokenPipeError:
                    resync = True  # moved to the oldest record held; the seq gap says how many
                    continue
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    # devkmsg_read moved past the record before finding it too big: lost.
                    if not walking:
                        malformed += 1
                    unknown += 1
                    continue
                if not raw:
                    # The real device never reads empty; /dev/null bound over it in a container
                    # does. Nothing to read.
                    if not self._empty_reads_logged:
                        log.warning("kmsg: %s reads empty: not the kernel's /dev/kmsg", self.path)
                        self._empty_reads_logged = True
                    break
                if walking:
                    seq = _record_seq(raw)
                    if seq is not None:
                        expected, unknown = seq + 1, 0
                    walked += 1
                    if walked >= END_WALK_LIMIT:
                        dev.seek_end()
                        expected = None
                        break
                    continue
                rec: KernelLogRecord | None = None
                if keep is not None and not keep(raw):
                    if expected is not None and not resync and not unknown:
                        expected += 1  # accounted for, not parsed: no fault can be in it
                        skipped += 1
                        continue
                    seq_read = _record_seq(raw)
                else:
                    rec = parse(raw, boot_time)
                    seq_read = None if rec is None else rec.seq
                if seq_read is None:
                    malformed += 1
                    unknown += 1
                    continue
                if expected is not None:
                    if seq_read < expected:
                        # Handed out before a restart or a failure: walked over, not counted.
                        unknown = 0
                        continue
                    gap = seq_read - expected - unknown
                    if gap > 0:
                        dropped += gap
                expected, unknown, resync = seq_read + 1, 0, False
                if rec is None:
                    skipped += 1
                else:
                    append(rec)
        except OSError as e:
            self._close()
            raise SourceError(
                "kmsg_unreadable", f"reading {self.path}: {os.strerror(e.errno or 0)} ({e})"
            ) from e
        if walking:
            self._walk_done = True
        if expected is not None:
            self._committed = expected - 1 + unknown
            self._replay_all = False
        self._save()
        return KernelLogBatch(
            records=tuple(records), dropped=dropped, malformed=malformed, skipped=skipped
        )

    def close(self) -> None:
        self._close()

    def _open(self) -> None:
        try:
            self._dev = self._opener()
        except OSError as e:
            raise SourceError(
                "kmsg_unreadable", f"opening {self.path}: {os.strerror(e.errno or 0)} ({e})"
            ) from e
        self._boot_time = self._boot_time_fn()
        if self._committed is None and not self._replay_all and self._walk_done:
            # The start at the end knew no seq yet (an empty buffer, or a walk cut short): a
            # fresh open is at the oldest record, which is not new. devkmsg_llseek SEEK_END.
            try:
                self._dev.seek_end()
            except OSError as e:
                self._close()
                raise SourceError("kmsg_unreadable", f"seeking {self.path}: {e}") from e

    def _close(self) -> None:
        dev, self._dev = self._dev, None
        if dev is not None:
            with contextlib.suppress(OSError):
                dev.close()

    def _save(self) -> None:
        if self._committed is not None and self._boot_id:
            self._state.save({"boot_id": self._boot_id, "seq": self._committed})


# -- the systemd journal -------------------------------------------------------------------------

LIBSYSTEMD = "libsystemd.so.0"
_KERNEL_MATCH = b"_TRANSPORT=kernel"


class _Libsystemd:
    """The few sd-journal calls used, typed through ctypes (sd-journal(3)). Every call returns a
    negative errno on failure."""

    def __init__(self, name: str = LIBSYSTEMD) -> None:
        lib = ctypes.CDLL(name, use_errno=True)
        libc = ctypes.CDLL(None)
        vp, pvp, i, cp = (
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_char_p,
        )
        u64p = ctypes.POINTER(ctypes.c_uint64)
        sizep = ctypes.POINTER(ctypes.c_size_t)

        def fn(fname: str, argtypes: list[Any], restype: Any = i) -> Any:
            f = getattr(lib, fname)
            f.argtypes, f.restype = argtypes, restype
            return f

        self.open_directory = fn("sd_journal_open_directory", [pvp, cp, i])
        self.open_files = fn("sd_journal_open_files", [pvp, ctypes.POINTER(cp), i])
        self.add_match = fn("sd_journal_add_match", [vp, cp, ctypes.c_size_t])
        self.get_fd = fn("sd_journal_get_fd", [vp])
        self.process = fn("sd_journal_process", [vp])
        self.seek_head = fn("sd_journal_seek_head", [vp])
        self.seek_tail = fn("sd_journal_seek_tail", [vp])
        self.seek_cursor = fn("sd_journal_seek_cursor", [vp, cp])
        self.test_cursor = fn("sd_journal_test_cursor", [vp, cp])
        self.next = fn("sd_journal_next", [vp])
        self.previous = fn("sd_journal_previous", [vp])
        self.get_data = fn("sd_journal_get_data", [vp, cp, pvp, sizep])
        self.get_realtime_usec = fn("sd_journal_get_realtime_usec", [vp, u64p])
        self.get_monotonic_usec = fn("sd_journal_get_monotonic_usec", [vp, u64p, vp])
        self.get_cursor = fn("sd_journal_get_cursor", [vp, pvp])
        self.close = fn("sd_journal_close", [vp], None)
        self.free = libc.free
        self.free.argtypes, self.free.restype = [vp], None


class _Journal:
    """One open sd_journal handle (a directory, or a list of files), matching kernel entries.

    Never blocks: no sd_journal_wait. `sd_journal_get_fd` sets up the inotify watches once, so
    `sd_journal_process` at each read picks up rotated and new files without waiting."""

    def __init__(self, lib: _Libsystemd, directory: Path | None, files: Sequence[Path]) -> None:
        self._lib = lib
        handle = ctypes.c_void_p()
        if directory is not None:
            self.key = str(directory)
            _check(lib.open_directory(ctypes.byref(handle), os.fsencode(directory), 0), "open")
        else:
            self.key = "files:" + ",".join(sorted(str(f) for f in files))
            paths = (ctypes.c_char_p * (len(files) + 1))(*[os.fsencode(f) for f in files], None)
            _check(lib.open_files(ctypes.byref(handle), paths, 0), "open")
        self.handle = handle
        try:
            _check(lib.add_match(handle, _KERNEL_MATCH, len(_KERNEL_MATCH)), "add_match")
            self._watching = (
                lib.get_fd(handle) >= 0
            )  # no inotify (limits hit): files stay as opened
        except SourceError:
            self.close()
            raise

    def process(self) -> None:
        if self._watching:
            r = self._lib.process(self.handle)
            if r < 0:
                _check(r, "process")

    def position(self, cursor: str | None) -> tuple[bool, str]:
        """Place the handle. Returns (whether it already sits on an unread entry, the cursor to
        save for where it stands).

        `cursor` None: the first start, at the newest kernel entry (no replay of old ones); a
        journal with no kernel entry yet is read from its head, saved as "".
        `cursor` "": the journal held no kernel entry when the agent first started: the head.
        Otherwise right after the entry it names; if that entry was vacuumed away the handle
        lands on the next one still held, which is unread."""
        lib, h = self._lib, self.handle
        if cursor is None:
            _check(lib.seek_tail(h), "seek_tail")
            if _check(lib.previous(h), "previous") > 0:
                return False, self.cursor()
            _check(lib.seek_head(h), "seek_head")
            return False, ""
        if cursor == "":
            _check(lib.seek_head(h), "seek_head")
            return False, ""
        _check(lib.seek_cursor(h, cursor.encode()), "seek_cursor")
        if _check(lib.next(h), "next") == 0:
            return False, cursor
        return _check(lib.test_cursor(h, cursor.encode()), "test_cursor") == 0, cursor

    def next(self) -> bool:
        return _check(self._lib.next(self.handle), "next") > 0

    def field(self, name: bytes) -> bytes | None:
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        r = self._lib.get_data(self.handle, name, ctypes.byref(data), ctypes.byref(size))
        if r == -errno.ENOENT:
            return None
        _check(r, "get_data")
        assert data.value is not None
        return ctypes.string_at(data.value, size.value)[len(name) + 1 :]

    def record(self) -> KernelLogRecord | None:
        """The current entry as a record; None when it lacks a MESSAGE."""
        message = self.field(b"MESSAGE")
        if message is None:
            return None
        prio_raw = self.field(b"PRIORITY")
        priority = int(prio_raw) & 7 if prio_raw is not None and prio_raw.isdigit() else 6
        realtime, monotonic = ctypes.c_uint64(), ctypes.c_uint64()
        _check(self._lib.get_realtime_usec(self.handle, ctypes.byref(realtime)), "get_realtime")
        # With no boot id to fill in, sd_journal_get_monotonic_usec refuses (ESTALE) entries of
        # any boot but the running one: a journal mounted from the host, or an old boot.
        boot_id = (ctypes.c_ubyte * 16)()
        _check(
            self._lib.get_monotonic_usec(
                self.handle, ctypes.byref(monotonic), ctypes.byref(boot_id)
            ),
            "get_monotonic",
        )
        # journald stamps the entry when it receives it; the kernel's own stamp is
        # _SOURCE_MONOTONIC_TIMESTAMP. The entry's realtime minus its monotonic is that boot's
        # start, so the kernel's stamp converts the same way as a /dev/kmsg record's.
        source = self.field(b"_SOURCE_MONOTONIC_TIMESTAMP")
        usec = int(source) if source is not None and source.isdigit() else monotonic.value
        boot = (realtime.value - monotonic.value) / 1e6
        return KernelLogRecord(
            seq=-1,
            monotonic_usec=usec,
            timestamp=boot + usec / 1e6,
            priority=priority,
            message=message.decode("utf-8", "replace"),
        )

    def cursor(self) -> str:
        out = ctypes.c_void_p()
        _check(self._lib.get_cursor(self.handle, ctypes.byref(out)), "get_cursor")
        assert out.value is not None
        try:
            return ctypes.string_at(out.value).decode("ascii", "replace")
        finally:
            self._lib.free(out)

    def close(self) -> None:
        if self.handle.value is not None:
            self._lib.close(self.handle)
            self.handle = ctypes.c_void_p()


def _check(r: int, call: str) -> int:
    if r < 0:
        raise SourceError("journal_unreadable", f"sd_journal_{call}: {os.strerror(-r)}")
    return r


class JournalSource:
    """The kernel's lines as journald stored them (`_TRANSPORT=kernel` entries), for nodes where
    /dev/kmsg cannot be read: a container without the device, or without CAP_SYSLOG under
    dmesg_restrict. The chart mounts /var/log/journal and /run/log/journal read-only.

    Read through libsystemd with ctypes (no binding to install; libsystemd.so.0 ships in
    Debian's python image). One handle a directory: sd-journal opens one directory a handle
    (with its machine-id subdirectories). The state is each handle's cursor, saved after every
    read that moved it; a first start (no state) begins at the newest kernel entry, so old lines
    are not replayed. A journal that holds no kernel entry yet is saved as "from the head", so a
    restart reads what arrived meanwhile. Kernel lines in the journal carry no printk seq
    (seq = -1) and nothing is counted as dropped: journald's own rate limits and vacuuming are
    invisible from here.
    """

    name = "journal"

    def __init__(
        self,
        directories: Sequence[Path] = (),
        state_path: Path | None = None,
        max_records_per_read: int = DEFAULT_MAX_RECORDS_PER_READ,
        *,
        files: Sequence[Path] = (),
        library: str = LIBSYSTEMD,
    ) -> None:
        if not directories and not files:
            raise ValueError("JournalSource needs journal directories or files")
        try:
            self._lib = _Libsystemd(library)
        except (OSError, AttributeError) as e:
            raise SourceError(
                "journal_unreadable",
                f"{library} cannot be loaded ({e}): the journal cannot be read without libsystemd",
            ) from e
        self._directories = tuple(directories)
        self._files = tuple(files)
        self._max = max_records_per_read
        self._state = _StateFile(state_path, "journal")
        saved, why = self._state.load()
        cursors = saved.get("cursors") if saved is not None else None
        if saved is not None and not isinstance(cursors, dict):
            why = f"state file {state_path} corrupt (no cursors)"
            cursors = None
        if cursors is None:
            log.info("journal: %s: starting at the newest kernel entry (no replay)", why)
            cursors = {}
        self._cursors: dict[str, str] = {
            str(k): v for k, v in cursors.items() if isinstance(v, str)
        }
        self._journals: list[_Journal] | None = None
        self._pending: dict[str, bool] = {}  # handles already on an unread entry

    def read(self) -> KernelLogBatch:
        """Kernel entries new since the last call, at most `max_records_per_read` of them.

        A failure closes the handles and raises; what that call had read is not handed out and
        the cursors stay where the last successful call left them, so the next call re-reads it.
        """
        records: list[KernelLogRecord] = []
        malformed = 0
        try:
            if self._journals is None:
                self._open()
            assert self._journals is not None
            cursors = dict(self._cursors)
            for journal in self._journals:
                journal.process()
                pending = self._pending.pop(journal.key, False)
                moved = False
                while len(records) + malformed < self._max:
                    if pending:
                        pending = False
                    elif not journal.next():
                        break
                    moved = True
                    rec = journal.record()
                    if rec is None:
                        malformed += 1
                    else:
                        records.append(rec)
                if pending:
                    self._pending[journal.key] = True  # the budget ran out before it
                if moved:
                    cursors[journal.key] = journal.cursor()
        except SourceError:
            self._close()
            raise
        self._cursors = cursors
        self._save()
        return KernelLogBatch(records=tuple(records), malformed=malformed)

    def close(self) -> None:
        self._close()

    def _open(self) -> None:
        journals: list[_Journal] = []
        try:
            if self._directories:
                for d in self._directories:
                    journals.append(_Journal(self._lib, d, ()))
            else:
                journals.append(_Journal(self._lib, None, self._files))
            pending: dict[str, bool] = {}
            cursors = dict(self._cursors)
            for j in journals:
                pending[j.key], cursors[j.key] = j.position(self._cursors.get(j.key))
        except SourceError:
            for j in journals:
                j.close()
            raise
        self._journals, self._pending, self._cursors = journals, pending, cursors
        self._save()

    def _close(self) -> None:
        for j in self._journals or ():
            j.close()
        self._journals = None

    def _save(self) -> None:
        self._state.save({"cursors": {k: v for k, v in sorted(self._cursors.items())}})


# -- choosing a source ---------------------------------------------------------------------------


def probe_kmsg(opener: Callable[[], KmsgDevice]) -> str | None:
    """None when the device can be opened and read (one record, or EAGAIN); else why not.

    The open is where access is refused (`devkmsg_open`: EPERM without CAP_SYSLOG under
    dmesg_restrict=1, or under printk_devkmsg=off; ENOENT where a container has no device), and
    a read proves the fd is the kernel's log and not /dev/null bound over it."""
    try:
        dev = opener()
    except OSError as e:
        return f"cannot open: {os.strerror(e.errno or 0)}"
    try:
        raw = dev.read(READ_BUFFER_BYTES)
    except (BlockingIOError, BrokenPipeError):
        return None
    except OSError as e:
        return f"cannot read: {os.strerror(e.errno or 0)}"
    finally:
        with contextlib.suppress(OSError):
            dev.close()
    if parse_record(raw, 0.0) is None:
        return "reads no kmsg record (not the kernel's /dev/kmsg)"
    return None


def journal_files_in(directory: Path) -> bool:
    """Whether a journal directory holds journal files (itself or its machine-id folders)."""
    try:
        return any(directory.glob("*.journal")) or any(directory.glob("*/*.journal"))
    except OSError:
        return False


class UnreadableKernelLog:
    """A kernel log that was asked for (`--kernel-log journal|kmsg`) and cannot be read: every
    read fails the `kernel_log` collector with the reason, so the deployment error shows in
    `topowatch_exporter_collector_errors_total` and the collector's success gauge, not only in
    a log line at start."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self._why = why

    def read(self) -> KernelLogBatch:
        raise SourceError(f"{self.name}_unreadable", self._why)

    def close(self) -> None:
        pass


def open_kernel_log(
    mode: str,
    *,
    kmsg_path: Path,
    journal_dirs: Sequence[Path],
    state_dir: Path | None,
    max_records_per_read: int = DEFAULT_MAX_RECORDS_PER_READ,
    keep: Callable[[bytes], bool] | None = None,
) -> tuple[KernelLogSource | None, str]:
    """The kernel log source for `--kernel-log MODE`, and a line saying why that one (or none).

    "auto": /dev/kmsg when it can be opened and read, else the journal when one of the
    directories holds journal files and libsystemd loads, else none. "kmsg" and "journal" force
    one: a forced kmsg that cannot be read now is still returned (its reads raise SourceError,
    counted, until the device can be read); a forced journal that cannot be opened is not.
    "off": none. The state files, one per kind, sit in `state_dir` (None: no resume). `keep`
    gates which kmsg records are parsed (see KmsgSource).
    """
    if mode not in KERNEL_LOG_MODES:
        raise ValueError(f"kernel log mode {mode!r} is not one of {', '.join(KERNEL_LOG_MODES)}")
    if mode == "off":
        return None, "off"

    def kmsg() -> KmsgSource:
        state = state_dir / KMSG_STATE_FILE if state_dir is not None else None
        return KmsgSource(kmsg_path, state, max_records_per_read, keep=keep)

    def journal(dirs: Sequence[Path]) -> JournalSource:
        state = state_dir / JOURNAL_STATE_FILE if state_dir is not None else None
        return JournalSource(dirs, state, max_records_per_read)

    why_not_kmsg = None
    if mode in ("auto", "kmsg"):
        why_not_kmsg = probe_kmsg(os_opener(kmsg_path))
        if why_not_kmsg is None:
            return kmsg(), f"kmsg: {kmsg_path}"
        if mode == "kmsg":
            return kmsg(), f"kmsg (forced): {kmsg_path} {why_not_kmsg}"
    # Forced, a directory that exists will do: journald may not have written to it yet, and the
    # handle's inotify watch sees the first file arrive.
    dirs = [d for d in journal_dirs if (d.is_dir() if mode == "journal" else journal_files_in(d))]
    if not dirs:
        listed = ", ".join(str(d) for d in journal_dirs) or "none given"
        why_not_journal = f"no journal files in the journal directories ({listed})"
    else:
        try:
            return journal(dirs), "journal: " + ", ".join(str(d) for d in dirs)
        except SourceError as e:
            why_not_journal = str(e)
    if mode == "journal":
        return None, f"journal (forced): {why_not_journal}"
    return None, f"none: {kmsg_path} {why_not_kmsg}; {why_not_journal}"
