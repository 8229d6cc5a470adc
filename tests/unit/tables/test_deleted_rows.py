"""DuckDB never reclaims the rows deleted from a table with an index, and an OVERWRITE-mode
table has one, its primary key (tables/store.py). Before, each overwrite of such a table kept
every row it replaced: 300 overwrites of 20,000 rows held 6,000,000 rows and 93 MB of DuckDB's
memory, until its limit refused the next write. On a real DuckDB store, in memory and on disk;
what DuckDB keeps is read from its own catalog."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from helpers.keyed_table import KEYED, keyed_rows

from flightfeed.tables.options import TableOptions
from flightfeed.tables.store import ScanSpec, TableName, TableStore

T = TableName.of("replaced")
ROWS = 2_000
HOUR = 3_600_000


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TableStore]:
    opened = TableStore.open(None if request.param == "memory" else tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def rows(v: float, *, start_ms: int = 0, count: int = ROWS) -> pa.Table:
    return keyed_rows(v, count, start_ms=start_ms)


def kept_rows(store: TableStore, name: TableName = T) -> int:
    """The rows DuckDB holds for the table, the deleted ones it keeps included."""
    found = store.connection.execute(
        "SELECT estimated_size FROM duckdb_tables() WHERE table_name = ?",
        [store.entry(name).physical],
    ).fetchone()
    assert found is not None
    return int(found[0])


def overwrite(store: TableStore, table: pa.Table, job: str) -> int:
    """What a Spark write with mode overwrite commits."""
    store.stage(T, job, 0, 1, table)
    return store.commit_staged(T, job, [(0, 1)], overwrite=True)


def values(store: TableStore) -> pa.Table:
    return store.scan(T, ScanSpec(columns=("k", "v"))).read_all().sort_by("k")


@pytest.mark.parametrize("mode", ["OVERWRITE", "APPEND"])
def test_an_overwrite_keeps_none_of_the_rows_it_replaced(store: TableStore, mode: str) -> None:
    store.create(T, KEYED, TableOptions(update_mode=mode))  # type: ignore[arg-type]
    for version in range(1, 6):
        assert overwrite(store, rows(float(version)), f"job-{version}") == ROWS
        assert kept_rows(store) == ROWS
    assert values(store).equals(rows(5.0).select(["k", "v"]))


def test_an_upsert_keeps_none_of_the_rows_it_replaced(store: TableStore) -> None:
    """DuckDB updates an upserted row in place: nothing to reclaim."""
    store.create(T, KEYED)
    for version in range(1, 6):
        store.write([(T, rows(float(version)))])
    assert kept_rows(store) == ROWS
    assert values(store).equals(rows(5.0).select(["k", "v"]))


def test_a_snapshot_reads_the_table_an_overwrite_replaced(store: TableStore) -> None:
    store.create(T, KEYED)
    store.write([(T, rows(1.0))])
    _, (held,), _ = store.open_snapshot(T, store.entry(T).id, 1)
    try:
        overwrite(store, rows(2.0, count=ROWS // 2), "job")
        seen = store.scan_in(held, T, ScanSpec(columns=("k", "v"))).read_all().sort_by("k")
        assert seen.equals(rows(1.0).select(["k", "v"]))
    finally:
        held.close()
    assert values(store).equals(rows(2.0, count=ROWS // 2).select(["k", "v"]))


def test_rows_a_ttl_deleted_are_dropped_once_they_outnumber_the_live_ones(
    store: TableStore,
) -> None:
    store.compact_min_dead_rows = 100
    store.create(T, KEYED, TableOptions(ttl_ms=HOUR))
    now = int(time.time() * 1000)
    live = rows(1.0, start_ms=now, count=300)
    store.write([(T, live)])
    store.write([(T, expired(300, 100, now))])
    assert store.purge_expired() == 100
    assert kept_rows(store) == 300 + 100  # (fewer deleted rows than live ones: kept)
    _, (held,), _ = store.open_snapshot(T, store.entry(T).id, 1)
    store.write([(T, expired(400, 250, now))])
    assert store.purge_expired() == 250
    assert kept_rows(store) == 300  # (350 deleted, 300 live: copied anew)
    assert values(store).equals(live.select(["k", "v"]))
    try:  # (a snapshot taken before reads the table it took, to its end)
        (count,) = held.execute(f"SELECT count(*) FROM {store.entry(T).physical}").fetchone()  # type: ignore[misc]
        assert count == 300
    finally:
        held.close()


def expired(first_key: int, count: int, now: int) -> pa.Table:
    """`count` rows from key `first_key` on, written five hours ago."""
    return keyed_rows(0.0, count, first_key=first_key, start_ms=now - 5 * HOUR)
