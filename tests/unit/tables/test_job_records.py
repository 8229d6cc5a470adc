"""The store remembers each committed Spark job, so that committing it again publishes nothing
(a retried commit, a replayed micro-batch). Before, it remembered every one for ever: a
streaming query that wrote once a second added 86,400 records a day, in tables with a primary
key, from which DuckDB never reclaims what is deleted. Now a streaming query's commits are a
series, forgotten once no one can send them again, other jobs' after a week, and the records
have no index. On a real DuckDB store, in memory and on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from helpers.keyed_table import KEYED, keyed_rows

from flightfeed.tables import store as store_module
from flightfeed.tables.options import TableOptions
from flightfeed.tables.store import DEFAULT_COMMITTED_JOB_TTL_MS, TableName, TableStore

T = TableName.of("written")
COMMITS = "flightfeed_committed_jobs"
STAGED = "flightfeed_staged_jobs"


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TableStore]:
    opened = TableStore.open(None if request.param == "memory" else tmp_path)
    opened.create(T, KEYED, TableOptions(update_mode="APPEND"))
    try:
        yield opened
    finally:
        opened.close()


def micro_batch(store: TableStore, batch: int, query: str = "q1") -> int:
    """What a streaming write of one row commits for micro-batch `batch`."""
    job = f"spark-stream-{query}-{batch}"
    store.stage(T, job, 0, 1, keyed_rows(float(batch), 1, first_key=batch))
    return store.commit_staged(T, job, [(0, 1)], series=(query, batch))


def records(store: TableStore, table: str = COMMITS) -> list[str]:
    return sorted(job for (job,) in store.connection.execute(f"SELECT job FROM {table}").fetchall())


def row_count(store: TableStore) -> int:
    found = store.connection.execute(f"SELECT count(*) FROM {store.entry(T).physical}").fetchone()
    assert found is not None
    return int(found[0])


def test_a_streaming_query_keeps_two_records_however_many_batches_it_commits(
    store: TableStore,
) -> None:
    for batch in range(50):
        assert micro_batch(store, batch) == 1
    micro_batch(store, 0, query="q2")
    assert records(store) == ["spark-stream-q1-48", "spark-stream-q1-49", "spark-stream-q2-0"]
    assert records(store, STAGED) == []
    # The micro-batch Spark may run again after a restart still lands once:
    assert micro_batch(store, 49) == 1
    assert row_count(store) == 51


def test_a_job_of_no_series_is_remembered_for_a_week(
    store: TableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.stage(T, "batch-job", 0, 1, keyed_rows(1.0, 3))
    assert store.commit_staged(T, "batch-job", [(0, 1)]) == 3
    store.purge_expired()
    store.stage(T, "batch-job", 0, 2, keyed_rows(1.0, 3))  # a retried commit's tasks
    assert store.commit_staged(T, "batch-job", [(0, 2)]) == 3  # the first commit's count
    assert row_count(store) == 3

    now = store_module._now_ms()
    monkeypatch.setattr(store_module, "_now_ms", lambda: now + DEFAULT_COMMITTED_JOB_TTL_MS + 1)
    version = store.version
    store.purge_expired()
    assert records(store) == []
    assert store.version != version  # (a delete that commits may checkpoint: a write)


def test_forgotten_records_leave_no_rows_behind(tmp_path: Path) -> None:
    """DuckDB drops deleted rows of a table without an index at its checkpoints; the records
    of one streaming query stay a bounded few however long it runs."""
    store = TableStore.open(tmp_path)
    store.create(T, KEYED, TableOptions(update_mode="APPEND"))
    kept = []
    for batches in (range(300), range(300, 600)):
        for batch in batches:
            micro_batch(store, batch)
        store.connection.execute("CHECKPOINT")
        (size,) = store.connection.execute(
            "SELECT sum(estimated_size) FROM duckdb_tables() WHERE table_name IN (?, ?)",
            [COMMITS, STAGED],
        ).fetchone() or (0,)
        kept.append(int(size))
    store.close()
    assert kept[1] <= kept[0]  # with a primary key: 300, then 600


def test_a_store_from_before_copies_its_records_into_tables_without_an_index(
    tmp_path: Path,
) -> None:
    store = TableStore.open(tmp_path)
    store.create(T, KEYED, TableOptions(update_mode="APPEND"))
    table_id = store.entry(T).id
    store.close()
    old = duckdb.connect(str(tmp_path / "tables.duckdb"))  # the tables as they were made
    old.execute(f"DROP TABLE {COMMITS}")
    old.execute(f"DROP TABLE {STAGED}")
    old.execute(
        f"CREATE TABLE {COMMITS} (table_id UBIGINT NOT NULL, job VARCHAR NOT NULL,"
        " rows UBIGINT NOT NULL, PRIMARY KEY (table_id, job))"
    )
    old.execute(
        f"CREATE TABLE {STAGED} (table_id UBIGINT NOT NULL, job VARCHAR NOT NULL,"
        " started_ms BIGINT NOT NULL, PRIMARY KEY (table_id, job))"
    )
    old.execute(f"INSERT INTO {COMMITS} VALUES (?, 'done-before', 7)", [table_id])
    old.execute(f"INSERT INTO {STAGED} VALUES (?, 'under-way', 1)", [table_id])
    old.close()

    store = TableStore.open(tmp_path)
    try:
        keys = store.connection.execute(
            "SELECT count(*) FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'"
            " AND table_name IN (?, ?)",
            [COMMITS, STAGED],
        ).fetchone()
        assert keys == (0,)
        assert records(store, STAGED) == ["under-way"]
        store.stage(T, "done-before", 0, 1, keyed_rows(1.0, 2))
        assert store.commit_staged(T, "done-before", [(0, 1)]) == 7  # still remembered
        assert row_count(store) == 0
        store.stage(T, "under-way", 0, 1, keyed_rows(1.0, 2))
        assert store.commit_staged(T, "under-way", [(0, 1)]) == 2
        assert records(store, STAGED) == []
    finally:
        store.close()
