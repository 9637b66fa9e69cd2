"""The kernel log readers: /dev/kmsg records, the simulated device, the real device, the journal.

What a user relies on: every kernel line is read once (none missed while the ring still held
it, none replayed after a restart), what the ring lost is counted exactly, and nothing in a
record or a failing device makes the agent raise anything but the documented SourceError.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.core.snapshot import KernelLogBatch, KernelLogRecord
from exporter.sim.hardware.kmsg import SimKernelLog, SimKmsgReader
from exporter.sources.interfaces import KernelLogSource, SourceError
from exporter.sources.kmsg import (
    JOURNAL_STATE_FILE,
    KMSG_STATE_FILE,
    JournalSource,
    KmsgSource,
    open_kernel_log,
    parse_record,
)

BOOT = 1_750_000_000.0


# -- parse_record ---------------------------------------------------------------------------


def test_parse_plain_record() -> None:
    rec = parse_record(b"6,339,5140900,-;NET: Registered PF_INET6 protocol family\n", BOOT)
    assert rec == KernelLogRecord(
        seq=339,
        monotonic_usec=5140900,
        timestamp=BOOT + 5.1409,
        priority=6,
        message="NET: Registered PF_INET6 protocol family",
    )


def test_parse_priority_drops_the_facility() -> None:
    # prio 30 = facility 3 (daemon) << 3 | level 6; 11 = LOG_USER << 3 | 3 (a userspace write)
    rec = parse_record(b"30,340,5690716,-;udevd[80]: starting version 181\n", BOOT)
    assert rec is not None and rec.priority == 6
    rec = parse_record(b"11,7,1,-;from userspace\n", BOOT)
    assert rec is not None and rec.priority == 3


def test_parse_drops_continuation_lines() -> None:
    raw = (
        b"3,812,83112451,-;NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus.\n"
        b" SUBSYSTEM=pci\n"
        b" DEVICE=+pci:0000:53:00.0\n"
    )
    rec = parse_record(raw, BOOT)
    assert rec is not None
    assert rec.message == "NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus."
    assert rec.priority == 3 and rec.seq == 812


def test_parse_unescapes_what_the_kernel_escaped() -> None:
    # msg_add_ext_text escapes control bytes, bytes >= 0x7f and the backslash itself.
    raw = b"4,286,422376,-;amd_pstate: a\\x09b\\x0ac \\x5cx41 \\xc3\\xa9 \\x5c\n"
    rec = parse_record(raw, BOOT)
    assert rec is not None
    assert rec.message == "amd_pstate: a\tb\nc \\x41 \u00e9 \\"


@pytest.mark.parametrize(
    "raw",
    [
        b"6,1,2,c;cont fragment\n",  # LOG_CONT
        b"6,1,2,+;old kernels' continuation\n",  # before 4.9
        b"6,1,2,-,caller=T123;with caller id\n",  # CONFIG_PRINTK_CALLER
        b"6,1,2,-,caller=C3,more=x,y;future fields\n",
    ],
)
def test_parse_accepts_every_flag_and_extra_fields(raw: bytes) -> None:
    rec = parse_record(raw, BOOT)
    assert rec is not None
    assert (rec.seq, rec.monotonic_usec, rec.priority) == (1, 2, 6)
    assert rec.message == raw.split(b";", 1)[1].rstrip(b"\n").decode()


def test_parse_keeps_a_message_the_kernel_cut_short() -> None:
    # A record cut at PRINTK_MESSAGE_MAX loses its newline, perhaps in the middle of an escape.
    assert parse_record(b"6,1,2,-;a;b\n", BOOT).message == "a;b"  # type: ignore[union-attr]
    rec = parse_record(b"6,9,2,-;long line \\x0", BOOT)
    assert rec is not None and rec.message == "long line \\x0" and rec.seq == 9


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\n",
        b"\x00\xff\x13\x88binary garbage\x00",
        b"6,1,2",  # truncated header, no message
        b"6,1,2,-",  # no ';'
        b"6,1;x\n",  # too few header fields
        b"6,1,2;x\n",  # no flags field
        b"6,1,2,;x\n",  # empty flags
        b"a,1,2,-;x\n",
        b"6,-1,2,-;x\n",
        b"6, 1,2,-;x\n",
        b"6,1,2_0,-;x\n",
        b"6,1,\xd9\xa3,-;x\n",  # a non-ASCII digit
        b";6,1,2,-;x\n",
    ],
)
def test_parse_refuses_what_is_not_a_record(raw: bytes) -> None:
    assert parse_record(raw, BOOT) is None


def test_parse_never_raises_on_random_bytes() -> None:
    rng = random.Random(7)
    parsed = 0
    for n in range(5000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        if n % 2:
            raw = b"6,%d,5,-;" % n + raw  # a good header before garbage text still parses
        rec = parse_record(raw, BOOT)
        parsed += rec is not None
    assert parsed >= 2500


# -- the simulated device -------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = BOOT) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> SimKernelLog:
    return SimKernelLog(capacity_bytes=1 << 22, clock=clock, boot_time=BOOT - 100.0)


def kmsg_on(sim: SimKernelLog, state: Path | None, **kwargs: object) -> KmsgSource:
    return KmsgSource(
        "/sim/kmsg",
        state,
        opener=sim.open,
        boot_id=lambda: sim.boot_id,
        boot_time=lambda: sim.boot_time,
        **kwargs,  # type: ignore[arg-type]
    )


def drain(source: KernelLogSource) -> KernelLogBatch:
    """Read until a call returns nothing new; the batches summed."""
    records: list[KernelLogRecord] = []
    dropped = malformed = skipped = 0
    while True:
        batch = source.read()
        records += batch.records
        dropped += batch.dropped
        malformed += batch.malformed
        skipped += batch.skipped
        if not (batch.records or batch.dropped or batch.malformed or batch.skipped):
            return KernelLogBatch(tuple(records), dropped, malformed, skipped)


def messages(batch: KernelLogBatch) -> list[str]:
    return [r.message for r in batch.records]


def test_a_burst_is_read_whole_in_order(sim: SimKernelLog, tmp_path: Path) -> None:
    source = kmsg_on(sim, tmp_path / "state")
    assert source.read() == KernelLogBatch()  # started at the end of an empty buffer
    for i in range(10_000):
        sim.write(f"burst line {i}", priority=i % 8)
    batch = source.read()
    assert messages(batch) == [f"burst line {i}" for i in range(10_000)]
    assert [r.priority for r in batch.records[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert [r.seq for r in batch.records] == list(range(10_000))
    assert (batch.dropped, batch.malformed) == (0, 0)
    assert source.read() == KernelLogBatch()


def test_timestamps_are_boot_time_plus_the_kernel_stamp(
    sim: SimKernelLog, clock: FakeClock, tmp_path: Path
) -> None:
    source = kmsg_on(sim, None)
    source.read()
    clock.now = BOOT + 12.5
    sim.write("stamped")
    (rec,) = source.read().records
    assert rec.monotonic_usec == 112_500_000  # booted 100 s before BOOT
    assert rec.timestamp == pytest.approx(BOOT + 12.5)


def test_an_overrun_counts_exactly_the_lines_lost_and_reading_goes_on(
    clock: FakeClock, tmp_path: Path
) -> None:
    sim = SimKernelLog(capacity_bytes=4096, clock=clock)  # 128 descriptors
    source = kmsg_on(sim, tmp_path / "state", max_records_per_read=10)
    for i in range(5):
        sim.write(f"before {i}")
    source.read()  # the start: at the end, nothing replayed
    for i in range(15):
        sim.write(f"line {i}")
    assert messages(source.read()) == [f"line {i}" for i in range(10)]
    for i in range(15, 1000):
        sim.write(f"line {i}")  # wraps the ring many times past the reader
    batch = drain(source)
    held = sim.next_seq - sim.first_seq
    assert len(batch.records) == held
    assert batch.dropped == 990 - held  # exactly the lines the ring overwrote before a read
    assert batch.records[0].seq == sim.first_seq
    assert messages(batch)[-1] == "line 999"
    sim.write("after the overrun")
    batch = source.read()
    assert messages(batch) == ["after the overrun"]
    assert (batch.dropped, batch.malformed) == (0, 0)


def test_a_restart_resumes_after_the_last_line_read(sim: SimKernelLog, tmp_path: Path) -> None:
    state = tmp_path / "kmsg.json"
    for i in range(50):
        sim.write(f"old {i}")
    first = kmsg_on(sim, state)
    assert first.read() == KernelLogBatch()  # no state: no replay of the 50 old lines
    sim.write("read by the first")
    assert messages(first.read()) == ["read by the first"]
    first.close()
    for i in range(3):
        sim.write(f"while the agent was down {i}")
    second = kmsg_on(sim, state)
    batch = second.read()
    assert messages(batch) == [f"while the agent was down {i}" for i in range(3)]
    assert batch.dropped == 0
    assert json.loads(state.read_text()) == {"boot_id": sim.boot_id, "seq": sim.next_seq - 1}


def test_a_restart_before_any_new_line_still_resumes_exactly(
    sim: SimKernelLog, tmp_path: Path
) -> None:
    for i in range(5):
        sim.write(f"old {i}")
    sim.source(tmp_path).read()  # the start learns the newest seq and saves it at once
    assert (tmp_path / KMSG_STATE_FILE).exists()
    sim.write("written while the agent restarted")
    assert messages(sim.source(tmp_path).read()) == ["written while the agent restarted"]


def test_lines_overwritten_while_the_agent_was_down_are_counted(
    clock: FakeClock, tmp_path: Path
) -> None:
    sim = SimKernelLog(capacity_bytes=4096, clock=clock)
    state = tmp_path / "kmsg.json"
    first = kmsg_on(sim, state)
    first.read()
    sim.write("seen")
    first.read()
    first.close()
    for i in range(500):
        sim.write(f"down {i}")
    batch = kmsg_on(sim, state).read()
    held = sim.next_seq - sim.first_seq
    assert len(batch.records) == held
    assert batch.dropped == 500 - held


def test_after_a_reboot_the_whole_buffer_is_new(sim: SimKernelLog, tmp_path: Path) -> None:
    state = tmp_path / "kmsg.json"
    first = kmsg_on(sim, state)
    first.read()
    for i in range(20):
        sim.write(f"previous boot {i}")
    first.read()
    first.close()
    sim.reboot()
    for i in range(5):
        sim.write(f"this boot {i}")
    batch = kmsg_on(sim, state).read()
    assert messages(batch) == [f"this boot {i}" for i in range(5)]
    assert [r.seq for r in batch.records] == list(range(5))  # seq restarted at 0
    assert batch.dropped == 0


def test_after_a_reboot_lines_the_ring_lost_before_the_agent_started_are_dropped(
    clock: FakeClock, tmp_path: Path
) -> None:
    state = tmp_path / "kmsg.json"
    state.write_text(json.dumps({"boot_id": "an-earlier-boot", "seq": 123456}))
    sim = SimKernelLog(capacity_bytes=4096, clock=clock)
    for i in range(400):
        sim.write(f"boot line {i}")
    batch = kmsg_on(sim, state).read()
    assert batch.dropped == sim.first_seq  # seq 0 .. oldest held: never read
    assert len(batch.records) == 400 - sim.first_seq


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\x00\x01", b"[1, 2]", b'{"boot_id": "x"}', b'{"seq": "7"}', b""],
)
def test_a_corrupt_state_file_starts_at_the_end(
    sim: SimKernelLog, tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "kmsg.json"
    state.write_bytes(content)
    for i in range(30):
        sim.write(f"old {i}")
    with caplog.at_level(logging.INFO, logger="exporter.sources.kmsg"):
        source = kmsg_on(sim, state)
    assert any("starting at the end" in r.getMessage() for r in caplog.records)
    assert source.read() == KernelLogBatch()
    sim.write("new")
    assert messages(source.read()) == ["new"]
    assert json.loads(state.read_text())["seq"] == 30


def test_an_unwritable_state_file_is_logged_once_and_reading_goes_on(
    sim: SimKernelLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "missing-dir" / "kmsg.json"
    source = kmsg_on(sim, state)
    with caplog.at_level(logging.WARNING, logger="exporter.sources.kmsg"):
        source.read()
        for i in range(5):
            sim.write(f"line {i}")
            assert messages(source.read()) == [f"line {i}"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot write state file" in warnings[0].getMessage()


def test_a_vanished_device_raises_then_resumes_with_nothing_lost(
    sim: SimKernelLog, tmp_path: Path
) -> None:
    source = kmsg_on(sim, tmp_path / "kmsg.json")
    source.read()
    sim.write("before")
    assert messages(source.read()) == ["before"]
    sim.remove()
    sim.write("while gone 1")
    for _ in range(2):  # the open handle fails, then the reopen does
        with pytest.raises(SourceError) as raised:
            source.read()
        assert raised.value.reason == "kmsg_unreadable"
    sim.write("while gone 2")
    sim.restore()
    batch = source.read()
    assert messages(batch) == ["while gone 1", "while gone 2"]
    assert batch.dropped == 0


def keep_marked(raw: bytes) -> bool:
    return b";keep " in raw


@pytest.mark.parametrize("gated", [False, True], ids=["every-line", "gated"])
@pytest.mark.parametrize("seed", range(8))
def test_random_writes_reads_restarts_and_outages_lose_nothing_uncounted(
    clock: FakeClock, tmp_path: Path, seed: int, gated: bool
) -> None:
    """Whatever the interleaving: every line is handed out once, in order, or counted as
    dropped; none is both, none is neither. With a `keep` gate (the pattern table's, in
    production) the lines it refuses are not parsed and their seqs not read, yet each is still
    counted once, as skipped."""
    rng = random.Random(seed)
    keep = keep_marked if gated else None
    sim = SimKernelLog(capacity_bytes=2048, clock=clock)  # 64 records at most
    state = tmp_path / "kmsg.json"
    for i in range(rng.randrange(100)):
        sim.write(f"before {i}" if i % 3 else f"keep before {i}")
    source = kmsg_on(sim, state, max_records_per_read=rng.randrange(1, 40), keep=keep)
    source.read()
    start = sim.next_seq
    seen: list[int] = []
    dropped = skipped = 0
    for step in range(300):
        for _ in range(rng.choice([0, 0, 1, 5, 30, 100])):
            seq = sim.next_seq
            sim.write(f"keep {seq} x" if rng.random() < 0.3 else f"line {seq} " + "x" * 20)
        action = rng.random()
        if action < 0.05:
            source.close()
            source = kmsg_on(sim, state, max_records_per_read=rng.randrange(1, 40), keep=keep)
        elif action < 0.1:
            sim.remove()
        elif action < 0.2:
            sim.restore()
        try:
            batch = source.read()
        except SourceError:
            continue
        seen += [r.seq for r in batch.records]
        dropped += batch.dropped
        skipped += batch.skipped
        assert all(f" {r.seq} " in r.message for r in batch.records), step
        assert not gated or all(r.message.startswith("keep ") for r in batch.records), step
    sim.restore()
    rest = drain(source)
    seen += [r.seq for r in rest.records]
    dropped += rest.dropped
    skipped += rest.skipped
    assert seen == sorted(set(seen))  # in order, none twice
    assert len(seen) + skipped + dropped == sim.next_seq - start
    assert gated or skipped == 0


class FailingAfter:
    """A device that fails with `error` after `good` reads (a device gone mid-drain)."""

    def __init__(self, inner: SimKmsgReader, good: int, error: int) -> None:
        self.inner, self.good, self.error = inner, good, error

    def read(self, size: int) -> bytes:
        if self.good == 0:
            raise OSError(self.error, os.strerror(self.error))
        self.good -= 1
        return self.inner.read(size)

    def seek_end(self) -> None:
        self.inner.seek_end()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("error", [errno.EIO, errno.ENODEV, errno.EBADF, errno.EACCES])
def test_a_device_failing_mid_read_loses_and_repeats_nothing(
    sim: SimKernelLog, tmp_path: Path, error: int
) -> None:
    opened = 0

    def opener() -> SimKmsgReader | FailingAfter:
        nonlocal opened
        opened += 1
        return FailingAfter(sim.open(), good=5, error=error) if opened == 2 else sim.open()

    source = KmsgSource(
        "/sim/kmsg",
        tmp_path / "kmsg.json",
        opener=opener,
        boot_id=lambda: sim.boot_id,
        boot_time=lambda: sim.boot_time,
    )
    source.read()
    sim.write("line 0")
    assert messages(source.read()) == ["line 0"]
    source.close()  # the next open fails after 5 reads (1 of them the walk over "line 0")
    for i in range(1, 10):
        sim.write(f"line {i}")
    with pytest.raises(SourceError) as raised:
        source.read()
    assert raised.value.reason == "kmsg_unreadable"
    batch = source.read()
    assert messages(batch) == [f"line {i}" for i in range(1, 10)]
    assert (batch.dropped, batch.malformed) == (0, 0)


def test_a_bounded_read_leaves_the_rest_for_the_next_call(
    sim: SimKernelLog, tmp_path: Path
) -> None:
    source = kmsg_on(sim, tmp_path / "kmsg.json", max_records_per_read=20)
    source.read()
    for i in range(50):
        sim.write(f"line {i}")
    sizes = [len(source.read().records) for _ in range(4)]
    assert sizes == [20, 20, 10, 0]


def test_a_100kb_record_is_counted_as_malformed_and_lost_alone(
    clock: FakeClock, tmp_path: Path
) -> None:
    # No stock kernel makes a record over 8 KiB; a sim with raised limits does, to reach EINVAL.
    sim = SimKernelLog(capacity_bytes=1 << 20, clock=clock, record_max=200_000, message_max=300_000)
    source = kmsg_on(sim, tmp_path / "kmsg.json")
    source.read()
    sim.write("before")
    sim.write("x" * 100_000)
    sim.write("after")
    batch = source.read()
    assert messages(batch) == ["before", "after"]
    assert (batch.dropped, batch.malformed) == (0, 1)


def test_the_kernel_caps_records_so_a_huge_printk_still_reads(
    sim: SimKernelLog, tmp_path: Path
) -> None:
    source = kmsg_on(sim, None)
    source.read()
    sim.write(b"\x01" * 100_000)  # 1024 bytes kept, escaped to 4096, cut at 2048
    sim.write("after")
    batch = source.read()
    assert batch.malformed == 0 and batch.dropped == 0
    assert messages(batch)[1] == "after"
    assert messages(batch)[0].startswith("\x01" * 400)


class Scripted:
    """A device answering from a script: bytes to return or an errno to raise."""

    def __init__(self, script: list[bytes | int]) -> None:
        self.script = script

    def read(self, size: int) -> bytes:
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "again")
        item = self.script.pop(0)
        if isinstance(item, int):
            raise OSError(item, os.strerror(item))
        return item

    def seek_end(self) -> None:
        self.script.clear()

    def close(self) -> None:
        pass


def scripted_source(tmp_path: Path, script: list[bytes | int]) -> KmsgSource:
    state = tmp_path / "kmsg.json"
    state.write_text(json.dumps({"boot_id": "b", "seq": -1}))  # resume at seq 0
    return KmsgSource(
        "/fake", state, opener=lambda: Scripted(script), boot_id=lambda: "b", boot_time=lambda: 0
    )


def test_garbage_records_are_counted_and_do_not_look_like_drops(tmp_path: Path) -> None:
    source = scripted_source(
        tmp_path,
        [
            b"6,0,1,-;good 0\n",
            b"\x00\xffgarbage",
            b"6,2,1,-;good 2\n",
            errno.EPIPE,  # the ring overwrote seq 3..6; the reader moved to 7
            b"not a record either",  # seq 7
            b"6,8,1,-;good 8\n",
            errno.EINVAL,  # seq 9, too big for the buffer
            b"6,10,1,-;good 10\n",
        ],
    )
    batch = source.read()
    assert messages(batch) == ["good 0", "good 2", "good 8", "good 10"]
    assert (batch.dropped, batch.malformed) == (4, 3)


def test_a_device_that_reads_empty_is_not_a_kernel_log(tmp_path: Path) -> None:
    source = KmsgSource("/dev/null", None, boot_id=lambda: "b")  # /dev/null bound over kmsg
    for _ in range(3):
        assert source.read() == KernelLogBatch()
    source.close()


def test_the_sim_round_trips_any_bytes_and_drops_device_info(
    sim: SimKernelLog, tmp_path: Path
) -> None:
    source = kmsg_on(sim, None)
    source.read()
    text = "tab\there back\\slash x41 \\x41 nl\nend \u00e9 \x7f"
    sim.write(text, priority=3, device={"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:53:00.0"})
    (rec,) = source.read().records
    assert (rec.message, rec.priority) == (text, 3)
    reader = sim.open()
    assert reader.read(8192).endswith(b"\n SUBSYSTEM=pci\n DEVICE=+pci:0000:53:00.0\n")


def test_sim_reader_semantics_copy_devkmsg_read(clock: FakeClock) -> None:
    sim = SimKernelLog(capacity_bytes=4096, clock=clock)
    sim.write("zero")
    reader = sim.open()  # at the oldest
    assert reader.read(8192).startswith(b"6,0,")
    with pytest.raises(BlockingIOError):
        reader.read(8192)
    for i in range(300):
        sim.write(f"fill {i}")
    with pytest.raises(BrokenPipeError):
        reader.read(8192)  # once ...
    assert reader.read(8192).startswith(b"6,%d," % sim.first_seq)  # ... then at the oldest
    late = sim.open()
    late.seek_end()
    with pytest.raises(BlockingIOError):
        late.read(8192)
    sim.write("too big for 4 bytes")
    sim.write("next")
    with pytest.raises(OSError) as too_small:
        late.read(4)
    assert too_small.value.errno == errno.EINVAL
    assert late.read(8192).endswith(b";next\n")  # the big record was skipped, not retried
    sim.remove()
    with pytest.raises(FileNotFoundError):
        sim.open()
    with pytest.raises(OSError) as gone:
        reader.read(8192)
    assert gone.value.errno == errno.ENODEV


# -- the real /dev/kmsg -----------------------------------------------------------------------


def _kmsg_writable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        os.close(os.open("/dev/kmsg", os.O_WRONLY))
    except OSError:
        return False
    return True


def write_kmsg(line: str, level: int = 3) -> None:
    """One line into the real log. A fresh open each: devkmsg_write rate-limits 10 lines per
    open file per 5 s (printk_devkmsg=ratelimit). The newline matters: a record without one
    stays open for continuation and is not readable until the next record arrives."""
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"<{level}>{line}\n".encode())
    finally:
        os.close(fd)


@pytest.mark.real_component
@pytest.mark.skipif(not _kmsg_writable(), reason="/dev/kmsg is not readable and writable here")
def test_the_real_dev_kmsg(tmp_path: Path) -> None:
    tag = f"topowatch-test-{uuid.uuid4().hex[:12]}"
    state = tmp_path / KMSG_STATE_FILE
    first = KmsgSource("/dev/kmsg", state)
    first.read()  # no state: at the end, nothing old
    for i in range(3):
        write_kmsg(f"{tag} first {i} \\ \t\u00e9", level=3 + i)
    batch = drain(first)
    mine = [r for r in batch.records if tag in r.message]
    assert [r.message for r in mine] == [f"{tag} first {i} \\ \t\u00e9" for i in range(3)]
    assert [r.priority for r in mine] == [3, 4, 5]
    assert all(b.seq < a.seq for b, a in itertools.pairwise(mine))
    assert abs(mine[0].timestamp - time.time()) < 60  # boot time + the kernel's stamp ≈ now
    first.close()
    for i in range(2):
        write_kmsg(f"{tag} second {i}")
    second = KmsgSource("/dev/kmsg", state)
    again = [r.message for r in drain(second).records if tag in r.message]
    assert again == [f"{tag} second {i}" for i in range(2)]
    second.close()


# -- the journal ------------------------------------------------------------------------------

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
BOOT_ID = "0123456789abcdef0123456789abcdef"


def _libsystemd() -> bool:
    try:
        import ctypes

        ctypes.CDLL("libsystemd.so.0")
    except OSError:
        return False
    return True


needs_journal = pytest.mark.skipif(
    not (os.access(JOURNAL_REMOTE, os.X_OK) and _libsystemd()),
    reason="systemd-journal-remote (Debian package) or libsystemd.so.0 missing",
)


def export_entry(i: int, kernel: bool) -> bytes:
    """One entry in the journal export format (systemd's JOURNAL_EXPORT_FORMATS)."""
    fields = [
        f"__REALTIME_TIMESTAMP={int(BOOT * 1e6) + 10_000_000 + i * 1000}",
        f"__MONOTONIC_TIMESTAMP={10_000_000 + i * 1000}",
        f"_BOOT_ID={BOOT_ID}",
    ]
    if kernel:
        fields += [
            "_TRANSPORT=kernel",
            f"MESSAGE=kernel line {i}",
            f"PRIORITY={i % 8}",
            f"_SOURCE_MONOTONIC_TIMESTAMP={9_000_000 + i * 1000}",
            "SYSLOG_FACILITY=0",
        ]
    else:
        fields += ["_TRANSPORT=syslog", f"MESSAGE=not the kernel {i}", "PRIORITY=6"]
    return ("\n".join(fields) + "\n\n").encode()


class JournalWriter:
    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, numbers: range) -> None:
        """Kernel entries for even numbers, others for odd, appended to the journal file."""
        data = b"".join(export_entry(i, kernel=i % 2 == 0) for i in numbers)
        proc = subprocess.run(
            [JOURNAL_REMOTE, "-o", str(self.path), "-"], input=data, capture_output=True
        )
        assert proc.returncode == 0, proc.stderr.decode()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[JournalWriter]:
    directory = tmp_path / "journal"
    directory.mkdir()
    yield JournalWriter(directory / "remote.journal")


def kernel_lines(numbers: range) -> list[str]:
    return [f"kernel line {i}" for i in numbers if i % 2 == 0]


@needs_journal
@pytest.mark.real_component
@pytest.mark.parametrize("by", ["directory", "files"])
def test_the_journal_first_start_reads_nothing_old_then_only_kernel_lines(
    journal: JournalWriter, tmp_path: Path, by: str
) -> None:
    journal.add(range(10))
    where = {"directories": [journal.path.parent]} if by == "directory" else {}
    source = JournalSource(state_path=tmp_path / "j.json", files=[journal.path], **where)  # type: ignore[arg-type]
    assert source.read() == KernelLogBatch()
    journal.add(range(10, 20))
    batch = source.read()
    assert messages(batch) == kernel_lines(range(10, 20))
    first = batch.records[0]
    assert (first.seq, first.priority, first.monotonic_usec) == (-1, 2, 9_010_000)
    # the kernel's own stamp, converted with that boot's start (realtime - monotonic)
    assert first.timestamp == pytest.approx(BOOT + 9.01)
    assert source.read() == KernelLogBatch()
    source.close()


@needs_journal
@pytest.mark.real_component
def test_the_journal_resumes_by_cursor(journal: JournalWriter, tmp_path: Path) -> None:
    state = tmp_path / JOURNAL_STATE_FILE
    journal.add(range(4))
    first = JournalSource([journal.path.parent], state)
    first.read()
    journal.add(range(4, 8))
    assert messages(first.read()) == kernel_lines(range(4, 8))
    first.close()
    journal.add(range(8, 14))
    second = JournalSource([journal.path.parent], state, max_records_per_read=2)
    assert messages(second.read()) == kernel_lines(range(8, 12))
    assert messages(second.read()) == kernel_lines(range(12, 14))
    assert second.read() == KernelLogBatch()
    second.close()


@needs_journal
@pytest.mark.real_component
def test_a_journal_without_kernel_entries_yet_is_read_from_its_head_after_a_restart(
    journal: JournalWriter, tmp_path: Path
) -> None:
    state = tmp_path / JOURNAL_STATE_FILE
    journal.add(range(1, 2))  # one non-kernel entry
    JournalSource([journal.path.parent], state).read()
    journal.add(range(2, 6))  # kernel lines while the agent restarts
    assert messages(JournalSource([journal.path.parent], state).read()) == kernel_lines(range(2, 6))


def test_the_journal_without_libsystemd_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot be loaded"):
        JournalSource([tmp_path], library="libsystemd-absent.so.0")


@pytest.mark.skipif(not _libsystemd(), reason="libsystemd.so.0 missing")
def test_a_missing_journal_directory_raises_the_documented_error(tmp_path: Path) -> None:
    source = JournalSource([tmp_path / "gone"], None)
    with pytest.raises(SourceError) as raised:
        source.read()
    assert raised.value.reason == "journal_unreadable"


# -- choosing a source ----------------------------------------------------------------------


def test_open_kernel_log_off(tmp_path: Path) -> None:
    assert open_kernel_log(
        "off", kmsg_path=Path("/dev/kmsg"), journal_dirs=[], state_dir=tmp_path
    ) == (None, "off")


def test_open_kernel_log_auto_with_neither_says_why(tmp_path: Path) -> None:
    source, why = open_kernel_log(
        "auto",
        kmsg_path=tmp_path / "no-kmsg",
        journal_dirs=[tmp_path / "no-journal"],
        state_dir=tmp_path,
    )
    assert source is None
    assert "cannot open" in why and "no journal files" in why


def test_open_kernel_log_forced_kmsg_raises_on_read_until_it_exists(tmp_path: Path) -> None:
    source, why = open_kernel_log(
        "kmsg", kmsg_path=tmp_path / "no-kmsg", journal_dirs=[], state_dir=tmp_path
    )
    assert isinstance(source, KmsgSource) and "forced" in why
    with pytest.raises(SourceError) as raised:
        source.read()
    assert raised.value.reason == "kmsg_unreadable"


@needs_journal
def test_open_kernel_log_auto_falls_back_to_the_journal(
    journal: JournalWriter, tmp_path: Path
) -> None:
    journal.add(range(2))
    # /dev/null opens and reads, but reads empty: not a kernel log.
    source, why = open_kernel_log(
        "auto",
        kmsg_path=Path("/dev/null"),
        journal_dirs=[tmp_path / "absent", journal.path.parent],
        state_dir=tmp_path,
    )
    assert isinstance(source, JournalSource), why
    assert source.name == "journal"
    source.read()
    assert (tmp_path / JOURNAL_STATE_FILE).exists()


@pytest.mark.skipif(not _kmsg_writable(), reason="/dev/kmsg cannot be read here")
def test_open_kernel_log_auto_prefers_kmsg(tmp_path: Path) -> None:
    source, why = open_kernel_log(
        "auto", kmsg_path=Path("/dev/kmsg"), journal_dirs=[], state_dir=tmp_path
    )
    assert isinstance(source, KmsgSource) and source.name == "kmsg", why
    source.read()
    assert (tmp_path / KMSG_STATE_FILE).exists()
    source.close()


def test_open_kernel_log_refuses_an_unknown_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="auto"):
        open_kernel_log("dmesg", kmsg_path=Path("/dev/kmsg"), journal_dirs=[], state_dir=None)


# -- the simulated node's fault lines (issue 28) -----------------------------------------------


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("xid-bare=46@gpu3", "xid"),
        ("recovery=reboot@gpu3", "xid"),
        ("gpu-init-failed@gpu3", "gpu_init_failed"),
        ("uvm-fatal", "uvm_fatal"),
        ("callbacks-suppressed", "printk_suppressed"),
        ("efa-admin-timeout@rdmap16s27", "efa_driver"),
    ],
)
def test_the_simulated_node_logs_the_forms_the_table_missed(
    tmp_path: Path, fault: str, kind: str
) -> None:
    """The simulated node writes each fault's lines to its /dev/kmsg in the driver's format;
    the production reader, with the table's raw-record gate, hands every one of them out (none
    skipped as ordinary) and the table recognises them."""
    from exporter.node.kernel.patterns import match_line
    from exporter.sim.faults import parse_faults
    from exporter.sim.hardware.node import SimulatedNode
    from exporter.sim.hardware.profiles import get_profile

    node = SimulatedNode(get_profile("p5.48xlarge"), root=tmp_path / "sim", start=BOOT)
    try:
        source = node.kernel_log_source(None)
        source.read()  # the agent reads the log from now on
        node.inject(parse_faults([fault])[0])
        node.advance(BOOT + 5.0)
        batch = source.read()
        assert batch.records and batch.skipped == 0 and batch.dropped == 0
        matched = [match_line(r.message) for r in batch.records]
        assert kind in {m.kind for m in matched if m is not None}, [
            r.message for r in batch.records
        ]
        source.close()
    finally:
        node.close()
