"""Table snapshots held between a read's planning and its slices' reads.

A FlightInfo of a table in several partitions hands out one ticket per slice of row ids, and
its readers (Spark's tasks) redeem them one by one, maybe minutes apart. Read each as a
transaction of its own and a write committed in between shows in some slices and not in
others: across a Spark overwrite, rows of both versions came back. So the FlightInfo opens a
snapshot here: a few DuckDB transactions that all see the table as it was planned
(`TableStore.open_snapshot`); a ticket names its snapshot and runs its slice in one of them, a
retried ticket included.

Held snapshots are not free: while one is open, DuckDB keeps the row versions it sees, and
writes that replace rows (an overwrite, an upsert of keys) hold off its checkpoints, so the
write-ahead log and memory grow with what is written meanwhile. So a snapshot is released as
soon as every slice was read to its end (or `grace` seconds after: a Spark task retried after
its read, once a write has committed, needs the snapshot itself), `ttl` seconds after its last
read ended while slices are still unread (a `show()` reads only a few; a task that failed
midway is retried), and sooner when `max_snapshots` are held and another read is planned.

Which one makes room is fair between the hosts that plan reads (a snapshot's `holder`): one
read whole first; else one of the host holding the most, the one due first among them. One
host planning reads in a loop (a dashboard, a hostile caller) then releases its own, where
releasing the one due first across hosts let it release every other host's, and a Spark job
read midway failed at its next task once a write had committed.

A released snapshot's slice is still read while the store is at the version it was opened at
(no write since: the same rows under the same row ids, `TableStore.scan_unchanged`): Spark
retrying a task after its read, or recomputing a lost stage or an evicted cached partition,
reads again what it read. Once a write has committed, its ticket is NOT_FOUND, asking for the
read to be planned again; it never reads a later version of the table in its place.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.to_thread
import duckdb
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..concurrency import Signal
from ..errors import InvalidArgument, NotFound, ResourceExhausted
from .store import TableName, TableStore, close_all

log = logging.getLogger("flightfeed.tables")

SNAPSHOT_ID_BYTES: Final = 16
MAX_SNAPSHOTS: Final = 64
MAX_SNAPSHOT_CURSORS: Final = 16
"""Slices of one snapshot read at once; more readers wait for one of them to end."""
DEFAULT_SNAPSHOT_TTL: Final = 60.0
DEFAULT_SNAPSHOT_GRACE: Final = 0.0
"""Reads come back to back: a grace longer than the time between them keeps some snapshot
held for good, and DuckDB's checkpoints waiting (measured: a 450 MB log in 30 s of overwrites
under reads, with 5 s)."""

RowIds = tuple[int, int]
"""[lo, hi) of DuckDB row ids: one slice of a table read."""


@dataclass(frozen=True)
class SnapshotRef:
    """What a ticket names of its snapshot: its id, and the store's version when it was opened
    (empty: unknown, and then a released snapshot is not read again)."""

    id: bytes
    version: bytes = b""


@dataclass(eq=False)
class Snapshot:
    """One planned read's view of a table: its transactions, lent to one slice's read each."""

    id: bytes
    version: bytes
    """The store's version when the snapshot was opened (`TableStore.version`)."""
    name: TableName
    table_id: int
    slices: list[RowIds]
    """The row ids of each slice: together, every row of the snapshot."""
    _lend: MemoryObjectSendStream[duckdb.DuckDBPyConnection]
    _borrow: MemoryObjectReceiveStream[duckdb.DuckDBPyConnection]
    cursors: int
    """Transactions still usable (one whose query failed inside DuckDB is closed)."""
    unread: set[RowIds] = field(init=False)
    """The slices with rows not read to their end yet (an empty one, of a table with fewer
    rows than slices, has nothing to read: it needs no snapshot)."""
    holder: str = ""
    """Who planned the read (the host it came from; empty: unknown): room is made fairly
    between holders."""
    readers: int = 0
    idle_since: float = field(default_factory=anyio.current_time)

    def __post_init__(self) -> None:
        self.unread = {(lo, hi) for lo, hi in self.slices if lo < hi}

    @property
    def ref(self) -> SnapshotRef:
        return SnapshotRef(self.id, self.version)


class TableSnapshots:
    """The snapshots a worker's table reads hold. Run `expire_idle` for the worker's life and
    `close` at its end."""

    def __init__(
        self,
        store: TableStore,
        *,
        ttl: float = DEFAULT_SNAPSHOT_TTL,
        grace: float = DEFAULT_SNAPSHOT_GRACE,
        max_snapshots: int = MAX_SNAPSHOTS,
        max_cursors: int = MAX_SNAPSHOT_CURSORS,
    ) -> None:
        if max_snapshots < 1 or max_cursors < 1:
            raise ValueError("a worker holds at least one snapshot of at least one cursor")
        self.store = store
        self.ttl = ttl
        self.grace = grace
        self.max_snapshots = max_snapshots
        self.max_cursors = max_cursors
        self._held: dict[bytes, Snapshot] = {}
        self._idle: dict[bytes, Snapshot] = {}
        """The held snapshots no slice is reading."""
        self._opening = 0
        """Snapshots being opened (on a thread): they count against `max_snapshots` too."""
        self._changed = Signal()

    def __len__(self) -> int:
        return len(self._held)

    async def open(
        self, name: TableName, table_id: int, slices: int, *, holder: str = ""
    ) -> Snapshot:
        """A snapshot of table `table_id` for a read in `slices` slices of its row ids, planned
        by `holder` (module doc)."""
        if slices < 1:
            raise ValueError(f"a read has at least one slice, got {slices}")
        while len(self._held) + self._opening >= self.max_snapshots:
            due = self._to_make_room(holder)
            if due is None:
                raise ResourceExhausted(
                    f"{len(self._held) + self._opening} table reads are being read at once on"
                    f" this worker (at most {self.max_snapshots}); plan this read again once one"
                    " has ended"
                )
            await self._release(due, "to make room for another read")
        count = max(1, min(slices, self.max_cursors))
        opening = self.store.open_snapshot
        self._opening += 1
        try:
            # (shielded: transactions opened for a caller that left are still registered, and
            # expire; not shielded, they would be open for good)
            with anyio.CancelScope(shield=True):
                top, cursors, version = await anyio.to_thread.run_sync(
                    opening, name, table_id, count
                )
        finally:
            self._opening -= 1
        lend, borrow = anyio.create_memory_object_stream[duckdb.DuckDBPyConnection](count)
        for cursor in cursors:
            lend.send_nowait(cursor)
        bounds = [(top + 1) * i // slices for i in range(slices + 1)]
        ranges = list(itertools.pairwise(bounds))
        snapshot = Snapshot(secrets.token_bytes(SNAPSHOT_ID_BYTES), version, name, table_id,
                            ranges, lend, borrow, count, holder=holder)  # fmt: skip
        self._held[snapshot.id] = snapshot
        self._idle[snapshot.id] = snapshot
        self._changed.notify()
        return snapshot

    @asynccontextmanager
    async def lease(self, snapshot_id: bytes, table_id: int, rows: RowIds) -> AsyncIterator[Lease]:
        """One of the snapshot's transactions, for the read of slice `rows`: waits while every
        one is lent. NotFound once the snapshot was released (`released`). Left without an
        error, the slice counts as read."""
        snapshot = self._held.get(snapshot_id)
        if snapshot is None:
            raise self.released(snapshot_id)
        if snapshot.table_id != table_id:
            raise InvalidArgument(
                f"the ticket names table id {table_id}, its snapshot holds table id"
                f" {snapshot.table_id}"
            )
        snapshot.readers += 1
        self._idle.pop(snapshot_id, None)
        try:
            try:
                cursor = await snapshot._borrow.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise self.released(snapshot_id) from None
            lease = Lease(snapshot, cursor)
            try:
                yield lease
            except BaseException:
                lease.failed = True  # (checked before it is lent again)
                raise
            else:
                snapshot.unread.discard(rows)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._give_back(snapshot, lease)
        finally:
            snapshot.readers -= 1
            if snapshot.readers == 0 and snapshot.id in self._held:
                snapshot.idle_since = anyio.current_time()
                self._idle[snapshot.id] = snapshot
                self._changed.notify()
                if not snapshot.unread and self.grace <= 0:  # (released before the read's end
                    with anyio.CancelScope(shield=True):  # reaches its reader)
                        await self._release(snapshot, "read")

    def released(self, snapshot_id: bytes, *, changed: bool = False) -> NotFound:
        """The error of a ticket whose snapshot is no longer held (`changed`: nor readable
        again, a write having committed since it was opened)."""
        since = (
            ", and the worker's tables have changed since it was opened (a write, a restart),"
            " so its rows cannot be read again"
            if changed
            else ""
        )
        return NotFound(
            f"the snapshot this ticket reads ({snapshot_id.hex()[:8]}…) is no longer held{since}:"
            f" a read's snapshot is released {self.grace:g}s after each of its endpoints was"
            f" read, {self.ttl:g}s after the last read while some are unread, sooner when many"
            " reads are held (those of the host planning the most first), and when the worker"
            " restarts. Plan the read again (GetFlightInfo)"
        )

    async def expire_idle(self) -> None:
        """Run for the worker's life: release each snapshot when it is due (module doc)."""
        while True:
            due = self._first_due()
            if due is None:
                await self._changed.wait()
                continue
            wait = self._due_at(due) - anyio.current_time()
            if wait > 0:
                with anyio.move_on_after(wait):
                    await self._changed.wait()
                continue
            await self._release(due, "read" if not due.unread else f"unread for {self.ttl:g}s")

    def _due_at(self, snapshot: Snapshot) -> float:
        return snapshot.idle_since + (self.ttl if snapshot.unread else self.grace)

    def _first_due(self) -> Snapshot | None:
        """The idle snapshot to be released first (None: every one is being read)."""
        return min(self._idle.values(), key=self._due_at, default=None)

    def _to_make_room(self, holder: str) -> Snapshot | None:
        """The idle snapshot released for `holder`'s new read (module doc; None: every one is
        being read): one read whole, else one of the holder holding the most (the new read
        counted as `holder`'s), the one due first among them. So while all are idle, a holder
        holding at most its share (`max_snapshots // holders`) never loses one to another's
        read: the most held is always more than that share."""
        if not self._idle:
            return None
        held = Counter(snapshot.holder for snapshot in self._held.values())
        held[holder] += 1

        def claim(snapshot: Snapshot) -> tuple[bool, int, float]:
            return (not snapshot.unread, held[snapshot.holder], -self._due_at(snapshot))

        return max(self._idle.values(), key=claim)

    async def changed(self) -> None:
        """Wait for the next change: a snapshot opened, read, idle again or released."""
        await self._changed.wait()

    async def close(self) -> None:
        """Release every snapshot (the worker is stopping, its reads have ended)."""
        for snapshot in list(self._held.values()):
            await self._release(snapshot, "the worker is stopping")

    async def _give_back(self, snapshot: Snapshot, lease: Lease) -> None:
        """The transaction back to its snapshot, unless DuckDB aborted it (a failed query
        does) or the snapshot was released meanwhile: then it is closed."""
        if lease.failed and not await anyio.to_thread.run_sync(_usable, lease.cursor):
            snapshot.cursors -= 1
            await anyio.to_thread.run_sync(lease.cursor.close)
            if snapshot.cursors == 0 and snapshot.id in self._held:
                await self._release(snapshot, "its transactions failed")
            return
        try:
            snapshot._lend.send_nowait(lease.cursor)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            await anyio.to_thread.run_sync(lease.cursor.close)

    async def _release(self, snapshot: Snapshot, why: str) -> None:
        """Forget the snapshot and close its idle transactions (a lent one is closed when its
        read gives it back); waiting readers get NotFound."""
        if self._held.pop(snapshot.id, None) is None:
            return  # (released meanwhile: by another read making room, say)
        self._idle.pop(snapshot.id, None)
        snapshot._lend.close()
        idle: list[duckdb.DuckDBPyConnection] = []
        while True:
            try:
                idle.append(snapshot._borrow.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        snapshot._borrow.close()
        log.debug("released the snapshot of table %s read: %s", snapshot.name, why)
        self._changed.notify()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close_all, idle)


@dataclass(eq=False)
class Lease:
    """A snapshot's transaction lent to one read; `failed` if the read did not end well (the
    transaction is then checked before it is lent again)."""

    snapshot: Snapshot
    cursor: duckdb.DuckDBPyConnection
    failed: bool = False


def _usable(cursor: duckdb.DuckDBPyConnection) -> bool:
    """Whether the transaction still runs queries (DuckDB aborts one whose query failed)."""
    try:
        cursor.execute("SELECT 1").fetchall()
    except duckdb.Error:
        return False
    return True


__all__ = [
    "DEFAULT_SNAPSHOT_GRACE",
    "DEFAULT_SNAPSHOT_TTL",
    "MAX_SNAPSHOTS",
    "MAX_SNAPSHOT_CURSORS",
    "SNAPSHOT_ID_BYTES",
    "Lease",
    "RowIds",
    "Snapshot",
    "SnapshotRef",
    "TableSnapshots",
]
