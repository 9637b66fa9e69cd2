"""A simulated /dev/kmsg: the kernel's printk ring buffer and its per-reader semantics.

The production reader (exporter/sources/kmsg.py `KmsgSource`) reads it through its opener seam
(`opener=sim.open`; `sim.source(state_dir)` builds it so), exactly as it reads the real
character device through `os.read`: the same records, the same errors. Each quirk copies the
kernel (kernel/printk/printk.c, kernel/printk/printk_ringbuffer.c, kernel/printk/internal.h,
Linux 6.x):

* Records carry a seq that starts at 0 at boot and grows by one a record (`info->seq`). The
  ring is bounded twice, like `_DEFINE_PRINTKRB(..., CONFIG_LOG_BUF_SHIFT - PRB_AVGBITS, ...)`:
  a data ring of `capacity_bytes` where each record's text takes an 8-byte block id plus its
  length, rounded up to 8 (`DATA_SIZE` / `to_blk_size`), and a descriptor ring of
  `capacity_bytes >> 5` records (PRB_AVGBITS: 32 bytes a record on average). Writing a record
  that does not fit pushes the oldest ones out (`data_push_tail`, `desc_push_tail`). Blocks that
  would wrap the data ring's end waste its tail in the kernel; the sim does not model that
  waste, so it holds a few more records than a kernel of the same size.
* `write` is printk from inside the kernel (`vprintk_store`): the text is cut to
  PRINTKRB_RECORD_MAX (1024) and to a quarter of the ring (`truncate_msg`), the level and
  facility become `prio = facility << 3 | level`, and the timestamp is the clock's time since
  boot in microseconds (`local_clock()`, printed as `ts_nsec / 1000`). Device info
  (SUBSYSTEM, DEVICE: dev_printk's `dev_info`) becomes continuation lines.
* A read formats the record as `info_print_ext_header` + `msg_print_ext_body` do: every byte
  below 0x20, from 0x7f up, and the backslash escaped as `\\xNN` (`msg_add_ext_text`), the
  whole cut to PRINTK_MESSAGE_MAX (2048) bytes, which can drop the trailing newline.
* `open` is `devkmsg_open`: a reader starts at the oldest record held (`prb_first_valid_seq`).
  Its `read` is `devkmsg_read` on an O_NONBLOCK file: one record a call; BlockingIOError
  (EAGAIN) when none is new; BrokenPipeError (EPIPE) once when the reader's next record was
  overwritten, after moving it to the oldest record held (`pmsg.dropped`:
  `atomic64_set(&user->seq, pmsg.seq)`); OSError(EINVAL) when the caller's buffer is smaller
  than the record, after moving the reader past it (`atomic64_set(&user->seq, pmsg.seq + 1)`
  comes before the length check, so the record is lost to that reader). `seek_end` is
  `devkmsg_llseek(fd, 0, SEEK_END)` (`prb_next_seq`).

Faults, for tests and the simulated node: `remove()` makes the device vanish (an open raises
FileNotFoundError, a read on an open handle OSError(ENODEV), as a hot-unplugged character device
answers) until `restore()`; `reboot()` empties the ring, restarts seq at 0 and draws a new boot
id. `record_max` and `message_max` can be raised to make records the production reader's buffer
cannot hold (no stock kernel makes them): its EINVAL path.

Not modelled: a record written without a trailing newline stays open for `pr_cont` and becomes
readable only when the next record is stored (on the real device a userspace write must end in
"\\n" to be read back at once); the sim makes every record readable when written.
"""

from __future__ import annotations

import errno
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from exporter.sources.kmsg import DEFAULT_MAX_RECORDS_PER_READ, KMSG_STATE_FILE, KmsgSource

PRINTKRB_RECORD_MAX = 1024  # kernel/printk/internal.h: the most text one record keeps
PRINTK_MESSAGE_MAX = 2048  # kernel/printk/internal.h: a formatted (extended) record's cap
PRB_AVGBITS = 5  # kernel/printk/printk.c: 32 bytes a record on average sizes the descriptors
DEFAULT_CAPACITY_BYTES = 1 << 18  # CONFIG_LOG_BUF_SHIFT=18, Debian's and most distros' default
LOG_KERN = 0
LOG_USER = 1
LOG_INFO = 6

_NEEDS_ESCAPE = re.compile(rb"[^\x20-\x5b\x5d-\x7e]")  # < 0x20, >= 0x7f and the backslash


def escape(text: bytes) -> bytes:
    """msg_add_ext_text's escaping: non-printable bytes and the backslash as `\\xNN`."""
    return _NEEDS_ESCAPE.sub(lambda m: b"\\x%02x" % m[0][0], text)


def _block_size(text_len: int) -> int:
    """The data-ring bytes a record's text takes: an unsigned long block id plus the text,
    aligned to the id's size (printk_ringbuffer.c `to_blk_size`)."""
    return (8 + text_len + 7) & ~7


class SimKernelLog:
    """The kernel's log buffer on one simulated node; thread-safe (the node's fault injection
    writes while the poller reads)."""

    def __init__(
        self,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        clock: Callable[[], float] | None = None,
        *,
        boot_time: float | None = None,
        boot_id: str | None = None,
        record_max: int = PRINTKRB_RECORD_MAX,
        message_max: int = PRINTK_MESSAGE_MAX,
    ) -> None:
        """`clock` gives the simulated node's wall time in seconds (time.time by default);
        `boot_time` is when the node booted on that clock (default: now), so a record's stamp
        is clock() - boot_time, as the real one is local_clock() since boot."""
        if capacity_bytes < 1 << (PRB_AVGBITS + 1):
            raise ValueError(f"capacity_bytes {capacity_bytes} is too small for a log buffer")
        self._clock = clock if clock is not None else time.time
        self.capacity_bytes = capacity_bytes
        self.descriptor_count = capacity_bytes >> PRB_AVGBITS
        self.record_max = record_max
        self.message_max = message_max
        self._lock = threading.Lock()
        self._present = True
        self._records: dict[int, tuple[bytes, int]] = {}  # seq -> (formatted, block bytes)
        self._first_seq = 0
        self._next_seq = 0
        self._used = 0
        self._generation = 0
        self.boot_time = 0.0
        self.boot_id = ""
        self._boot(boot_time, boot_id)

    # -- the kernel side --------------------------------------------------------------------

    def write(
        self,
        message: str | bytes,
        priority: int = LOG_INFO,
        facility: int = LOG_KERN,
        *,
        device: Mapping[str, str] | None = None,
        cont: bool = False,
    ) -> int:
        """Store one record as printk does; returns its seq. `device`: dev_printk's dev_info,
        e.g. {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:53:00.0"}. `cont`: LOG_CONT (flag `c`)."""
        text = message.encode("utf-8", "surrogateescape") if isinstance(message, str) else message
        if text.endswith(b"\n"):
            text = text[:-1]  # vprintk_store: one trailing newline becomes LOG_NEWLINE
        text = text[: min(self.record_max, self.capacity_bytes // 4)]
        block = _block_size(len(text))
        with self._lock:
            seq = self._next_seq
            usec = max(0, int((self._clock() - self.boot_time) * 1e6))
            header = b"%d,%d,%d,%s;" % (
                (facility << 3) | (priority & 7),
                seq,
                usec,
                b"c" if cont else b"-",
            )
            body = escape(text) + b"\n"
            for key in ("SUBSYSTEM", "DEVICE"):
                value = (device or {}).get(key)
                if value:
                    body += b" " + key.encode() + b"=" + escape(value.encode()) + b"\n"
            formatted = (header + body)[: self.message_max]
            while self._records and (
                self._used + block > self.capacity_bytes
                or len(self._records) >= self.descriptor_count
            ):
                self._drop_oldest()
            self._records[seq] = (formatted, block)
            self._used += block
            self._next_seq = seq + 1
            return seq

    def _drop_oldest(self) -> None:
        _, block = self._records.pop(self._first_seq)
        self._used -= block
        self._first_seq += 1

    def _boot(self, boot_time: float | None, boot_id: str | None) -> None:
        self.boot_time = self._clock() if boot_time is None else boot_time
        self.boot_id = boot_id if boot_id is not None else str(uuid.uuid4())
        self._records = {}
        self._first_seq = 0
        self._next_seq = 0
        self._used = 0
        self._generation += 1

    def reboot(self, boot_id: str | None = None) -> None:
        """The node rebooted: an empty ring, seq from 0, a new boot id, boot time now. Handles
        opened before read as a vanished device (the old kernel is gone)."""
        with self._lock:
            self._boot(None, boot_id)

    def remove(self) -> None:
        """The device vanishes: opens raise FileNotFoundError, reads ENODEV."""
        with self._lock:
            self._present = False

    def restore(self) -> None:
        """The device is back, with the records the ring still holds."""
        with self._lock:
            self._present = True

    @property
    def first_seq(self) -> int:
        """The oldest record still held (`prb_first_valid_seq`)."""
        with self._lock:
            return self._first_seq

    @property
    def next_seq(self) -> int:
        """The seq the next record will get (`prb_next_seq`)."""
        with self._lock:
            return self._next_seq

    # -- the device side --------------------------------------------------------------------

    def source(
        self,
        state_dir: Path | str | None,
        max_records_per_read: int = DEFAULT_MAX_RECORDS_PER_READ,
        keep: Callable[[bytes], bool] | None = None,
    ) -> KmsgSource:
        """The production reader over this device, as `open_kernel_log` would build it for
        /dev/kmsg: the same state file name in `state_dir`, this node's boot id and boot time."""
        state = Path(state_dir) / KMSG_STATE_FILE if state_dir is not None else None
        return KmsgSource(
            "/dev/kmsg (simulated)",
            state,
            max_records_per_read,
            opener=self.open,
            boot_id=lambda: self.boot_id,
            boot_time=lambda: self.boot_time,
            keep=keep,
        )

    def open(self) -> SimKmsgReader:
        """`devkmsg_open`: a reader at the oldest record held. Usable as KmsgSource's opener."""
        with self._lock:
            if not self._present:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/dev/kmsg")
            return SimKmsgReader(self, self._first_seq, self._generation)

    def _read(self, reader: SimKmsgReader, size: int) -> bytes:
        with self._lock:
            if not self._present or reader.generation != self._generation:
                raise OSError(errno.ENODEV, "No such device")
            if reader.seq >= self._next_seq:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            if reader.seq < self._first_seq:
                reader.seq = self._first_seq
                raise BrokenPipeError(errno.EPIPE, "Broken pipe")
            formatted, _ = self._records[reader.seq]
            reader.seq += 1
            if len(formatted) > size:
                raise OSError(errno.EINVAL, "Invalid argument")
            return formatted

    def _seek_end(self, reader: SimKmsgReader) -> None:
        with self._lock:
            if not self._present or reader.generation != self._generation:
                raise OSError(errno.ENODEV, "No such device")
            reader.seq = self._next_seq


class SimKmsgReader:
    """One open file on the simulated device, with its own position (`devkmsg_user.seq`)."""

    def __init__(self, log: SimKernelLog, seq: int, generation: int) -> None:
        self._log: SimKernelLog | None = log
        self.seq = seq
        self.generation = generation

    def read(self, size: int) -> bytes:
        if self._log is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return self._log._read(self, size)

    def seek_end(self) -> None:
        if self._log is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        self._log._seek_end(self)

    def close(self) -> None:
        self._log = None
