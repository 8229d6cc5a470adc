"""The reads that open several transactions of one state of the tables (a snapshot's, a Read's
parallel slices) hold off commits while they open them, not whole writes (tables/store.py,
`_commit_lock`). On a real DuckDB store; the write that tries to commit mid-opening is a real
write, on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers.keyed_table import KEYED, keyed_rows

from flightfeed.tables.store import ScanSpec, TableName, TableStore

T = TableName.of("opened")
ROWS = 400
WAIT = 10.0


def version(v: float, start: int = 0) -> pa.Table:
    return keyed_rows(v, ROWS, first_key=start, start_ms=start)


@dataclass
class WatchedLock:
    """The store's commit lock, telling when a thread starts waiting for it."""

    inner: threading.Lock = field(default_factory=threading.Lock)
    waiting: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> None:
        if self.inner.locked():
            self.waiting.set()
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


@dataclass
class CommitsMidOpening:
    """The store's connection. Its `after`-th cursor, one of an opening's, first starts
    `write` on a thread and lets the opening go on once that write waits to commit."""

    inner: duckdb.DuckDBPyConnection
    write: Callable[[], object]
    after: int
    lock: WatchedLock
    writer: threading.Thread | None = None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        self.after -= 1
        if self.after == 0:
            self.writer = threading.Thread(target=self.write)
            self.writer.start()
            assert self.lock.waiting.wait(WAIT), "the write never came to its commit"
        return self.inner.cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def written(self) -> None:
        assert self.writer is not None
        self.writer.join(WAIT)
        assert not self.writer.is_alive()


@pytest.fixture
def store() -> Iterator[TableStore]:
    opened = TableStore.open(None)
    try:
        opened.create(T, KEYED)
        opened.write([(T, version(1.0))])
        yield opened
    finally:
        opened.close()


def commit_mid_opening(store: TableStore, after: int) -> CommitsMidOpening:
    """A write of ROWS more rows, reaching its commit while the opening opens cursor `after`."""
    lock = store._commit_lock = WatchedLock()  # type: ignore[assignment]
    write = CommitsMidOpening(store.connection, lambda: store.write([(T, version(2.0, ROWS))]),
                              after, lock)  # fmt: skip
    store.connection = write  # type: ignore[assignment]
    return write


def snapshot_rows(store: TableStore, cursors: int) -> list[pa.Table]:
    """What each transaction of a snapshot of T in `cursors` sees (then closed)."""
    _, opened, _ = store.open_snapshot(T, store.entry(T).id, cursors)
    try:
        spec = ScanSpec(columns=("k", "v"))
        return [store.scan_in(cur, T, spec).read_all() for cur in opened]
    finally:
        for cur in opened:
            cur.close()


def test_a_snapshot_opens_while_a_write_stages_its_rows(store: TableStore) -> None:
    """A write holds the write lock while it stages its rows (seconds, for a large one): a
    read planned meanwhile waited for all of it (benchmarks/table_plan_under_writes.py: 490 ms
    at the median during back-to-back 2M-row DoPuts, 54-71 ms after)."""
    with store._write_lock:
        seen = snapshot_rows(store, 3)
    assert [t.num_rows for t in seen] == [ROWS] * 3


def test_a_write_commits_after_the_snapshot_it_came_upon_is_open(store: TableStore) -> None:
    """Its commit waits: every transaction sees the table without it, then it lands."""
    write = commit_mid_opening(store, 2)
    seen = snapshot_rows(store, 3)
    write.written()
    assert [t.num_rows for t in seen] == [ROWS] * 3
    assert store.scan(T, ScanSpec(columns=("k",))).read_all().num_rows == 2 * ROWS


def test_a_reads_parallel_slices_are_opened_before_a_commit_lands(store: TableStore) -> None:
    """`scan_slices` (HoraeDB's Read with parallelism) opens its readers the same way."""
    write = commit_mid_opening(store, 3)
    readers = store.scan_slices(T, ScanSpec(columns=("k", "v")), 4)
    got = pa.concat_tables(reader.read_all() for reader in readers)
    write.written()
    assert sorted(got.column("k").to_pylist()) == list(range(ROWS))
