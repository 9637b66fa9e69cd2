"""The history writer: the event path never waits or fails; an outage queues up to a bound,
counts what it drops, and recovers in order. The sink here is a list that can be switched off;
the real stores (SQLite, PostgreSQL) behind the same `write` are tested in test_history_store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from exporter.core.exposition import encode_text
from exporter.store.sqlstore import StoreUnavailable
from exporter.store.writer import HistoryWriter


class Sink:
    """Rows are ints and strings here: the writer never looks inside them."""

    def __init__(self) -> None:
        self.rows: list[object] = []
        self.down = False
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def write(self, batch: Sequence[Any]) -> None:
        self.calls += 1
        self.gate.wait(10)
        if self.down:
            raise StoreUnavailable("connection refused")
        if any(row == "poison" for row in batch):
            raise TypeError("Object of type set is not JSON serializable")
        self.rows.extend(batch)


def test_rows_are_written_in_order_in_batches() -> None:
    sink = Sink()
    writer = HistoryWriter(sink, batch_max=100, flush_s=0.05).start()
    for i in range(1_000):
        writer.submit(i)
    assert writer.flush(10)
    writer.stop()
    assert sink.rows == list(range(1_000))
    assert sink.calls <= 20  # batched, not a transaction per row
    assert writer.written["int"] == 1_000


def test_submit_never_blocks_while_the_store_hangs() -> None:
    sink = Sink()
    sink.gate.clear()  # the store hangs on the first batch
    writer = HistoryWriter(sink, batch_max=10, flush_s=0.01).start()
    for i in range(5_000):
        writer.submit(i)  # returns at once: the writer thread is the one waiting
    sink.gate.set()
    assert writer.flush(10)
    writer.stop()
    assert sink.rows == list(range(5_000))


def test_an_outage_queues_up_to_the_bound_counts_drops_and_recovers_in_order() -> None:
    sink = Sink()
    sink.down = True
    writer = HistoryWriter(sink, max_rows=300, batch_max=50, flush_s=0.01).start()
    for i in range(500):
        writer.submit(i)
    assert not writer.flush(1.5)  # nothing gets through while the store is down
    text = encode_text(writer.families()).decode()
    assert "topowatch_history_store_up 0" in text
    assert "topowatch_history_rows_dropped_total 200" in text
    assert writer.failures >= 1 and "connection refused" in writer.last_error
    sink.down = False
    assert writer.flush(40)  # the retry after the backoff (1 s, then 2 s) gets it all in
    writer.stop()
    assert sink.rows == list(range(200, 500))  # the oldest 200 went; the rest in order
    assert writer.up and "topowatch_history_store_up 1" in encode_text(writer.families()).decode()


def test_stop_while_the_store_is_down_returns() -> None:
    sink = Sink()
    sink.down = True
    writer = HistoryWriter(sink, flush_s=0.01).start()
    writer.submit("row")
    writer.stop(timeout=0.5)
    assert writer._thread is None and sink.rows == []


def test_a_row_the_store_refuses_is_dropped_and_counted_not_retried_forever() -> None:
    sink = Sink()
    writer = HistoryWriter(sink, batch_max=10, flush_s=0.01).start()
    for row in [1, 2, "poison", 3]:
        writer.submit(row)
    assert writer.flush(10)
    writer.stop()
    assert sink.rows == [1, 2, 3] and writer.rejected == 1
    assert "topowatch_history_rows_rejected_total 1" in encode_text(writer.families()).decode()
