"""Table snapshots (tables/snapshots.py) on a real DuckDB store: the slices of a read planned
once see the table as it was planned, whatever commits between their reads; a released
snapshot is refused, never read anew; the worker holds a bounded number of them."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import duckdb
import pyarrow as pa
import pytest
from anyio.abc import TaskStatus
from anyio.lowlevel import checkpoint
from helpers.keyed_table import KEYED, keyed_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import NotFound, ResourceExhausted
from flightfeed.plan.base import closing
from flightfeed.tables.engine import TableEngine, TableRead
from flightfeed.tables.snapshots import RowIds, Snapshot, SnapshotRef, TableSnapshots
from flightfeed.tables.store import TableName, TableWriteError

pytestmark = pytest.mark.anyio

T = TableName.of("versions")
ROWS = 600


def version(v: float, n: int = ROWS) -> pa.Table:
    return keyed_rows(v, n)


@pytest.fixture
async def engine() -> AsyncIterator[TableEngine]:
    opened = await TableEngine.open(None)
    try:
        await opened.create(T, KEYED)
        await opened.write([(T, version(1.0))])
        yield opened
    finally:
        await opened.aclose()


async def overwrite(engine: TableEngine, table: pa.Table, job: str) -> None:
    """What a Spark write with mode overwrite commits: every row replaced."""
    await engine.stage(T, job, 0, 1, table)
    await engine.commit_staged(T, job, [(0, 1)], overwrite=True)


async def read_slice(
    engine: TableEngine,
    snapshot: SnapshotRef,
    rows: tuple[int, int],
    *,
    batch_size: int = 65_536,
    table_id: int | None = None,
) -> pa.Table:
    """One ticket's read: of the table planned (`table_id`, by default the one named T)."""
    table_id = engine.entry(T).id if table_id is None else table_id
    read = TableRead(T, rowid_range=rows, table_id=table_id, batch_size=batch_size)
    batches = [b async for b in engine.read(read, snapshot=snapshot)]
    return pa.Table.from_batches(batches, schema=engine.read_schema(read))


async def plan_read(engine: TableEngine, slices: int) -> tuple[SnapshotRef, list[RowIds]]:
    """What a FlightInfo of T in `slices` partitions plans: its tickets' snapshot and slices."""
    planned = await engine.plan_slices(TableRead(T, table_id=engine.entry(T).id), slices)
    return planned.ref, planned.slices


async def test_every_slice_reads_the_table_as_it_was_planned(engine: TableEngine) -> None:
    """Before, each ticket read the table as it was when read: across an overwrite between two
    slices' reads, the rows of both versions came back (1,500 rows of 1,000 keys)."""
    snapshot, slices = await plan_read(engine, 3)
    first = await read_slice(engine, snapshot, slices[0])
    await overwrite(engine, version(2.0), "job-2")
    await engine.write([(T, version(3.0, 2 * ROWS).slice(ROWS))])  # (new keys, new row ids)
    second = await read_slice(engine, snapshot, slices[1])
    again = await read_slice(engine, snapshot, slices[1])  # (a retried ticket)
    assert again.equals(second)
    third = await read_slice(engine, snapshot, slices[2])
    whole = pa.concat_tables([first, second, third])
    assert sorted(whole.column("k").to_pylist()) == list(range(ROWS))
    assert set(whole.column("v").to_pylist()) == {1.0}
    now = pa.Table.from_batches([b async for b in engine.read(TableRead(T))])
    assert now.num_rows == 2 * ROWS
    assert set(now.column("v").to_pylist()) == {2.0, 3.0}


async def until_released(snapshots: TableSnapshots) -> None:
    """Run the expiry until no snapshot is held (at most 10 s)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(snapshots.expire_idle)
        with anyio.fail_after(10):
            while len(snapshots):
                await snapshots.changed()
        tg.cancel_scope.cancel()


async def expiry_ran(snapshots: TableSnapshots) -> None:
    """Let the expiry look at the snapshots (and release those due) once."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(snapshots.expire_idle)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()


async def test_a_released_snapshot_is_read_again_until_a_write_commits(
    engine: TableEngine,
) -> None:
    """Spark retries a task after its read (or recomputes a lost stage, an evicted cached
    partition) once the snapshot is released: while nothing was written since, the table is
    the snapshot, row ids and all. Before, the ticket was NOT_FOUND and the Spark job failed."""
    engine.snapshots = snapshots = TableSnapshots(engine.store, grace=0.05, ttl=3600)
    snapshot, slices = await plan_read(engine, 2)
    first = [await read_slice(engine, snapshot, rows) for rows in slices]
    await until_released(snapshots)
    again = [await read_slice(engine, snapshot, rows) for rows in reversed(slices)]
    assert [t.num_rows for t in first] == [ROWS // 2] * 2
    assert list(reversed(again)) == first
    await engine.write([(T, version(2.0, 1))])  # (one row: any write may renumber row ids)
    with pytest.raises(NotFound, match=r"no longer held, and .* have changed since.*Plan"):
        await read_slice(engine, snapshot, slices[1])
    unknown = SnapshotRef(snapshot.id)  # (no version: it was never known unchanged)
    with pytest.raises(NotFound, match=r"no longer held: .*Plan the read again"):
        await read_slice(engine, unknown, slices[1])


async def test_a_failed_write_and_a_purge_that_deleted_rows_count_as_changes(
    engine: TableEngine,
) -> None:
    """The version moves at every write begun, even one refused (conservative: whether
    DuckDB changed anything is not judged), and at a purge only when it deleted rows (it runs
    every few seconds on every worker)."""
    store = engine.store
    start = store.version
    assert await engine.purge_expired() == 0
    assert store.version == start
    with pytest.raises(TableWriteError):
        await engine.write([(T, pa.table({"k": pa.array(["not a number"])}))])
    after_failed = store.version
    assert after_failed != start
    await engine.alter_options(T, {"ttl": "1h"})  # (T's rows are of 1970: expired at once)
    after_alter = store.version
    assert after_alter != after_failed
    await engine.write([(T, version(1.0))])
    before_purge = store.version
    assert await engine.purge_expired() == ROWS
    assert store.version != before_purge


async def test_a_snapshot_of_a_store_opened_again_is_not_read_again(tmp_path: Path) -> None:
    """A restart checkpoints the database, which may renumber row ids: the count of writes
    starts again, the store's opening does not."""
    first = await TableEngine.open(tmp_path)
    await first.create(T, KEYED)
    await first.write([(T, version(1.0))])
    first.snapshots = TableSnapshots(first.store, grace=0)
    snapshot, slices = await plan_read(first, 2)
    await first.aclose()
    reopened = await TableEngine.open(tmp_path)
    try:
        with pytest.raises(NotFound, match="have changed since"):
            await read_slice(reopened, snapshot, slices[0])
    finally:
        await reopened.aclose()


async def test_a_snapshot_with_a_slice_unread_is_kept_for_its_ttl(engine: TableEngine) -> None:
    """A read left early (a Spark task that failed midway) does not count: its retry comes."""
    engine.snapshots = snapshots = TableSnapshots(engine.store, grace=0, ttl=3600)
    snapshot, slices = await plan_read(engine, 2)
    await read_slice(engine, snapshot, slices[0])
    left = TableRead(T, rowid_range=slices[1], table_id=engine.entry(T).id, batch_size=10)
    async with closing(engine.read(left, snapshot=snapshot)) as batches:
        async for _ in batches:
            break
    await expiry_ran(snapshots)
    assert len(snapshots) == 1
    await read_slice(engine, snapshot, slices[1])
    await until_released(snapshots)  # (now every slice was read: at once, with no grace)
    short = TableSnapshots(engine.store, grace=3600, ttl=0.05)
    unread = await short.open(T, engine.entry(T).id, 2)
    await until_released(short)
    with pytest.raises(NotFound, match="no longer held"):
        async with short.lease(unread.id, unread.table_id, unread.slices[0]):
            pass


async def test_a_snapshot_being_read_is_not_released(engine: TableEngine) -> None:
    """The TTL counts from the end of the last read: a slow reader keeps its snapshot."""
    snapshots = TableSnapshots(engine.store, ttl=0.01, grace=0.01)
    opened = await snapshots.open(T, engine.entry(T).id, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(snapshots.expire_idle)
        async with snapshots.lease(opened.id, opened.table_id, opened.slices[0]):
            await anyio.sleep(0.2)  # (twenty TTLs with a read open: not waiting for state)
            assert len(snapshots) == 1
        with anyio.fail_after(10):
            while len(snapshots):
                await snapshots.changed()
        tg.cancel_scope.cancel()


async def test_at_the_cap_the_snapshot_due_first_makes_room(engine: TableEngine) -> None:
    snapshots = TableSnapshots(engine.store, max_snapshots=2, grace=60, ttl=3600)
    table_id = engine.entry(T).id
    unread, read = [await snapshots.open(T, table_id, 1) for _ in range(2)]
    async with snapshots.lease(read.id, table_id, read.slices[0]):
        pass  # (read whole: due after its grace, before the other's TTL)
    newest = await snapshots.open(T, table_id, 2)
    assert len(snapshots) == 2
    with pytest.raises(NotFound, match="no longer held"):
        async with snapshots.lease(read.id, table_id, read.slices[0]):
            pass
    for snapshot in (unread, newest):
        async with snapshots.lease(snapshot.id, table_id, snapshot.slices[0]) as lease:
            assert await count_rows(engine, lease.cursor) == ROWS
    await snapshots.close()


async def test_at_the_cap_with_every_snapshot_being_read_a_new_read_is_refused(
    engine: TableEngine,
) -> None:
    snapshots = TableSnapshots(engine.store, max_snapshots=1)
    table_id = engine.entry(T).id
    busy = await snapshots.open(T, table_id, 1)
    async with snapshots.lease(busy.id, table_id, busy.slices[0]):
        with pytest.raises(ResourceExhausted, match=r"1 table reads are being read at once"):
            await snapshots.open(T, table_id, 1)
    await snapshots.open(T, table_id, 1)  # (idle now: it makes room)
    await snapshots.close()


async def test_readers_past_its_transactions_wait_for_one(engine: TableEngine) -> None:
    snapshots = TableSnapshots(engine.store, max_cursors=1)
    table_id = engine.entry(T).id
    snapshot = await snapshots.open(T, table_id, 4)
    assert snapshot.cursors == 1
    second_in = anyio.Event()

    async def second(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        async with snapshots.lease(snapshot.id, table_id, snapshot.slices[1]):
            second_in.set()

    async with anyio.create_task_group() as tg:
        async with snapshots.lease(snapshot.id, table_id, snapshot.slices[0]):
            await tg.start(second)
            for _ in range(20):
                await checkpoint()
            assert not second_in.is_set()
        with anyio.fail_after(10):
            await second_in.wait()
    await snapshots.close()


async def test_a_failed_query_closes_its_transaction_and_the_others_read_on(
    engine: TableEngine,
) -> None:
    """DuckDB aborts a transaction whose query failed: it is closed, not lent again."""
    snapshots = TableSnapshots(engine.store)
    table_id = engine.entry(T).id
    snapshot = await snapshots.open(T, table_id, 2)
    await fail_a_query(snapshots, snapshot)
    assert snapshot.cursors == 1
    for _ in range(2):
        async with snapshots.lease(snapshot.id, table_id, snapshot.slices[0]) as lease:
            assert await count_rows(engine, lease.cursor) == ROWS
    await fail_a_query(snapshots, snapshot)
    assert len(snapshots) == 0  # (its last transaction failed)
    with pytest.raises(NotFound, match="no longer held"):
        async with snapshots.lease(snapshot.id, table_id, snapshot.slices[0]):
            pass


async def test_a_read_left_early_lends_its_transaction_again(engine: TableEngine) -> None:
    engine.snapshots = TableSnapshots(engine.store, max_cursors=1)
    snapshot, slices = await plan_read(engine, 2)
    read = TableRead(T, rowid_range=slices[0], table_id=engine.entry(T).id, batch_size=10)
    async with closing(engine.read(read, snapshot=snapshot)) as batches:
        async for _ in batches:
            break  # (closed at the first batch, its scan's result pending)
    whole = [await read_slice(engine, snapshot, rows, batch_size=10) for rows in slices]
    assert sum(t.num_rows for t in whole) == ROWS


async def test_a_table_dropped_under_its_snapshot_is_not_found(engine: TableEngine) -> None:
    table_id = engine.entry(T).id
    snapshot, slices = await plan_read(engine, 2)
    await engine.drop(T)  # (DuckDB drops it with the snapshot's transactions open)
    with pytest.raises(NotFound, match=r"no table 'flightfeed\.public\.versions'"):
        await read_slice(engine, snapshot, slices[0], table_id=table_id)
    await engine.create(T, KEYED)
    with pytest.raises(NotFound, match="dropped after this read was planned"):
        await read_slice(engine, snapshot, slices[0], table_id=table_id)


async def fail_a_query(snapshots: TableSnapshots, snapshot: Snapshot) -> None:
    with pytest.raises(duckdb.InvalidInputException):
        async with snapshots.lease(snapshot.id, snapshot.table_id, snapshot.slices[0]) as lease:
            await anyio.to_thread.run_sync(lambda: lease.cursor.execute("SELECT error('x')"))


async def count_rows(engine: TableEngine, cursor: duckdb.DuckDBPyConnection) -> int:
    """The rows of T a snapshot's transaction sees."""
    sql = f"SELECT count(*) FROM {engine.entry(T).physical}"
    (count,) = await anyio.to_thread.run_sync(lambda: cursor.execute(sql).fetchone())  # type: ignore[misc]
    return int(count)


async def test_a_table_with_fewer_rows_than_slices_reads_whole_in_any_order(
    engine: TableEngine,
) -> None:
    """Its empty slices need no snapshot: before, reading one of them counted every empty
    slice read, and the snapshot was released under the endpoints still to come."""
    await engine.drop(T)
    await engine.create(T, KEYED)
    await engine.write([(T, version(5.0, 3))])
    engine.snapshots = TableSnapshots(engine.store, grace=0)
    snapshot, slices = await plan_read(engine, 8)
    assert sum(hi > lo for lo, hi in slices) == 3
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.snapshots.expire_idle)
        read = []
        for rows in reversed(slices):  # (the last two: the same empty range)
            read.append(await read_slice(engine, snapshot, rows))
            await anyio.wait_all_tasks_blocked()  # (the expiry releases what is due)
        tg.cancel_scope.cancel()
    assert sorted(pa.concat_tables(read).column("k").to_pylist()) == [0, 1, 2]


async def test_at_the_cap_the_host_planning_the_most_reads_makes_room(
    engine: TableEngine,
) -> None:
    """One host planning reads in a loop (a dashboard, a hostile caller) releases its own
    snapshots, not a Spark job's read midway. Before, the snapshot due first across hosts made
    room: the job's, idle longest, and its next task was NOT_FOUND once a write committed."""
    snapshots = engine.snapshots = TableSnapshots(engine.store, max_snapshots=4, ttl=3600)
    table_id = engine.entry(T).id
    job = await snapshots.open(T, table_id, 2, holder="10.0.0.1")
    await read_slice(engine, job.ref, job.slices[0])  # (its first task: one slice left unread)
    flood = [await snapshots.open(T, table_id, 2, holder="10.0.0.2") for _ in range(20)]
    await overwrite(engine, version(2.0), "job-2")
    rest = await read_slice(engine, job.ref, job.slices[1])
    assert rest.num_rows == ROWS // 2
    assert set(rest.column("v").to_pylist()) == {1.0}
    kept = [snapshot for snapshot in flood if snapshot.id in {s.id for s in held(snapshots)}]
    assert kept == flood[-3:]
    await snapshots.close()


def held(snapshots: TableSnapshots) -> list[Snapshot]:
    return list(snapshots._held.values())


@settings(max_examples=40, deadline=None)
@given(
    cap=st.integers(1, 6),
    holders=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24),
)
async def test_a_host_within_its_share_never_loses_a_snapshot_to_another_hosts_read(
    cap: int, holders: list[str]
) -> None:
    """The fairness of making room, for any sequence of reads planned (none read yet): after
    each, every host holds at least as many as it planned, up to `cap // hosts`."""
    engine = await TableEngine.open(None)
    try:
        await engine.create(T, KEYED)
        await engine.write([(T, version(1.0, 8))])
        snapshots = TableSnapshots(engine.store, max_snapshots=cap, ttl=3600)
        table_id = engine.entry(T).id
        planned: Counter[str] = Counter()
        for holder in holders:
            await snapshots.open(T, table_id, 2, holder=holder)
            planned[holder] += 1
            now = Counter(snapshot.holder for snapshot in held(snapshots))
            assert sum(now.values()) == min(cap, sum(planned.values()))
            share = cap // len(planned)
            for host, count in planned.items():
                assert now[host] >= min(count, share), (host, now, planned)
        await snapshots.close()
    finally:
        await engine.aclose()
