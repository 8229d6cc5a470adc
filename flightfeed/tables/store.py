"""A worker's durable tables in one embedded DuckDB database: the blocking half of the tables
layer. Every method runs on a worker thread (`engine.py` puts it there); none is async.

DuckDB gives what a table needs without a storage format of our own: ACID transactions with a
write-ahead log (a commit survives `kill -9`), Arrow in and out without row-by-row conversion,
and zone maps that skip what a time range or predicate rules out. Each table is a DuckDB table
`t_<id>`; what DuckDB does not know (the HoraeDB schema with column ids and version, options,
partition info) lives in `flightfeed_tables`, written in the same transaction as the change it
describes, so a crash never leaves the two apart.

Writes take one lock (DuckDB would refuse concurrent upserts of the same rows anyway); reads
run concurrently on cursors of their own, and the reads that open several transactions of one
state of the tables (`open_snapshot`, `scan_slices`) hold off commits only, not whole writes,
while they open them (`_commit_lock`). The store counts its writes (`version`):
while the count stands, the tables are as they were, row ids too (DuckDB renumbers row ids only
in a checkpoint, and checkpoints only when a write commits), so a released snapshot's slice can
be read again (`scan_unchanged`).

DuckDB never reclaims the rows deleted from a table with an index (measured on 1.5: 300
overwrites of a 20,000-row table kept 6,000,000 rows, 93 MB of DuckDB's memory, until its
memory limit refused the next write; without an index it drops them at its checkpoints). An
OVERWRITE-mode table has one, its primary key. So an overwrite of every row fills a new table
in place of the old one, and a table whose expired rows, deleted by its TTL, come to outnumber
its live ones is copied anew (`_compact_if_due`); readers already under way read the old one to
their end (DuckDB's catalog is versioned like its rows). An upsert updates its row in place.
The records of Spark jobs (staged, committed) have no index, and are forgotten when no one can
commit their job again: a streaming query wrote a record a micro-batch, kept for ever.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, Literal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .._generated.schema import TableSchema as TableSchemaProto
from ..errors import AlreadyExists, Conflict, FlightfeedError, InvalidArgument, NotFound
from ..table_names import QUOTE_HINT, THREE_PARTS, joined_name, split_name
from .assign import assign
from .options import TableOptions
from .schema import MAX_NAME_BYTES, TableSchema, check_new_column_names

DATABASE_FILE: Final = "tables.duckdb"
STORE_VERSION_BYTES: Final = 16
DEFAULT_CATALOG: Final = "flightfeed"
DEFAULT_SCHEMA: Final = "public"
ENGINE: Final = "DuckDB"
_META: Final = "flightfeed_tables"
_COMMITS: Final = "flightfeed_committed_jobs"
_STAGED: Final = "flightfeed_staged_jobs"
_IDS: Final = "flightfeed_table_ids"
COMPACT_MIN_DEAD_ROWS: Final = 100_000
"""Deleted rows an OVERWRITE-mode table keeps however few its live rows (`_compact_if_due`)."""
MIN_DUCKDB_MEMORY: Final = 128 << 20
"""The least memory the table store is given, whatever the worker's limit."""
log = logging.getLogger("flightfeed.tables")
DEFAULT_STAGING_TTL_MS: Final = 86_400_000
"""Staged rows of a job neither committed nor aborted this long after it began (its driver
died) are discarded."""
DEFAULT_COMMITTED_JOB_TTL_MS: Final = 7 * 86_400_000
"""How long a commit of a job of no series is remembered (so that committing it again publishes
nothing): a Spark driver retries a commit within its own run."""
_COMMITS_COLUMNS: Final = (
    "table_id UBIGINT NOT NULL, job VARCHAR NOT NULL, rows UBIGINT NOT NULL, series VARCHAR,"
    " sequence UBIGINT, committed_ms BIGINT NOT NULL"
)
_STAGED_COLUMNS: Final = (
    "table_id UBIGINT NOT NULL, job VARCHAR NOT NULL, started_ms BIGINT NOT NULL"
)
PUT_JOB_PREFIX: Final = "put-"
"""Jobs of DoPut streams: staged, then published when their stream ends (never acknowledged
before, so discarded when a restart finds them)."""
_STAGE_COLUMNS: Final = ("__ff_job", "__ff_partition", "__ff_attempt")

Order = Literal["none", "asc", "desc"]


@dataclass(frozen=True, order=True)
class TableName:
    """A table's identifier: HoraeDB's (catalog, schema, table); empty parts mean the defaults."""

    table: str
    catalog: str = DEFAULT_CATALOG
    schema: str = DEFAULT_SCHEMA

    @classmethod
    def of(cls, table: str, catalog: str = "", schema: str = "") -> TableName:
        name = cls(table, catalog or DEFAULT_CATALOG, schema or DEFAULT_SCHEMA)
        for part in (name.table, name.catalog, name.schema):
            if not part or len(part.encode()) > MAX_NAME_BYTES or not part.isprintable():
                raise InvalidArgument(
                    f"bad table name part {part!r} (1 to {MAX_NAME_BYTES} bytes, no control"
                    " characters: a name with a line break printed as two tables in a list)"
                )
        return name

    @classmethod
    def parse(cls, text: str) -> TableName:
        """`TABLE` or `CATALOG.SCHEMA.TABLE`, as `str` writes it (table_names.py)."""
        parts = split_name(text)
        if len(parts) == 1:
            return cls.of(parts[0])
        if len(parts) == 3:
            return cls.of(parts[2], parts[0], parts[1])
        raise InvalidArgument(f"{THREE_PARTS}, got {text!r} {QUOTE_HINT}")

    def __str__(self) -> str:
        """Unambiguous (`parse` reads it back): `flightfeed.public."a.b.c"` is not `a.b.c`."""
        return joined_name((self.catalog, self.schema, self.table))


@dataclass(frozen=True)
class TableEntry:
    """What the store knows of a table."""

    name: TableName
    id: int
    schema: TableSchema
    options: TableOptions
    partition_info: bytes = b""
    """A `cluster.PartitionInfo`, encoded, when the table is one partition of a larger one."""

    @property
    def physical(self) -> str:
        return f"t_{self.id}"

    @property
    def staging(self) -> str:
        return f"s_{self.id}"


@dataclass(frozen=True)
class SqlPredicate:
    """A condition DuckDB evaluates: SQL text with `?` placeholders and their values."""

    sql: str
    params: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ScanSpec:
    columns: tuple[str, ...] | None = None
    """Projected columns in this order; None: all."""
    where: tuple[SqlPredicate, ...] = ()
    time_range: tuple[int, int] | None = None
    """[start, end) in milliseconds."""
    order: Order = "none"
    batch_size: int = 65_536
    rowid_range: tuple[int, int] | None = None
    """Only rows whose rowid is in [lo, hi): one of several parallel slices of a read."""


@dataclass(frozen=True)
class WriteFailure:
    """Which request of a write failed: a WriteBatch names it, and wrote nothing."""

    index: int
    table: str


class TableWriteError(InvalidArgument):
    """A write that committed nothing, naming the request and table that failed."""

    def __init__(self, message: str, failure: WriteFailure, cause: FlightfeedError) -> None:
        super().__init__(message)
        self.failure = failure
        self.cause = cause
        self.status = cause.status  # type: ignore[misc]  # the cause's kind, per instance


@dataclass(eq=False)
class TableStore:
    """`TableStore.open(data_dir)`; `None` keeps everything in memory (for tests)."""

    connection: duckdb.DuckDBPyConnection
    path: str | None
    _entries: dict[TableName, TableEntry] = field(default_factory=dict)
    _write_lock: threading.Lock = field(default_factory=threading.Lock)
    _meta_lock: threading.Lock = field(default_factory=threading.Lock)
    _commit_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by each COMMIT of a write and by a read opening transactions that must all see one
    state of the tables: a write holds `_write_lock` while it stages its rows (seconds, for a
    large one), a read planned meanwhile does not wait for that."""
    _instance: bytes = field(default_factory=lambda: secrets.token_bytes(8))
    """This opening of the database: a restart checkpoints it (and may renumber row ids)."""
    _writes: int = 0
    """Writes begun since the database was opened (a failed one too: counted, not judged)."""
    compact_min_dead_rows: int = COMPACT_MIN_DEAD_ROWS

    @property
    def version(self) -> bytes:
        """The tables' version: the same value as long as no write has begun since
        (`STORE_VERSION_BYTES`: this opening of the database, then its count of writes)."""
        return self._instance + self._writes.to_bytes(8, "big")

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The write lock, for a write that changes the version (whatever its outcome), once
        all it commits has committed: a snapshot opened before took the version before."""
        with self._write_lock:
            try:
                yield
            finally:
                self._writes += 1

    @classmethod
    def open(
        cls, data_dir: str | os.PathLike[str] | None, *, memory_limit: int | None = None
    ) -> TableStore:
        """Open (or create) the database; blocking. `memory_limit`: bytes DuckDB may hold
        (beyond them it spills to a directory beside the database, or refuses); None: DuckDB's
        default, 80% of the machine's memory."""
        path = None
        if data_dir is not None:
            path = os.path.join(os.fspath(data_dir), DATABASE_FILE)
            if os.path.exists(data_dir) and not os.path.isdir(data_dir):
                raise InvalidArgument(
                    f"cannot keep tables in {os.fspath(data_dir)!r}: it is a file, not a directory"
                    " (the tables' database is a file in that directory)"
                )
            try:
                os.makedirs(data_dir, exist_ok=True)
                connection = duckdb.connect(path)
            except (OSError, duckdb.IOException) as exc:  # a path it may not write, a full disk
                raise InvalidArgument(
                    f"cannot keep tables in {os.fspath(data_dir)!r}: {exc}"
                ) from None
        else:
            connection = duckdb.connect(":memory:")
        if memory_limit is not None:
            limit = max(memory_limit, MIN_DUCKDB_MEMORY)
            connection.execute(f"SET memory_limit = '{int(limit)}B'")
        store = cls(connection, path)
        store._load()
        store._discard_abandoned_puts()
        return store

    def close(self) -> None:
        self.connection.close()

    # --- metadata -----------------------------------------------------------------------

    def _load(self) -> None:
        self.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {_META} ("
            " id UBIGINT PRIMARY KEY, catalog VARCHAR NOT NULL, schema_name VARCHAR NOT NULL,"
            " name VARCHAR NOT NULL, table_schema BLOB NOT NULL, options JSON NOT NULL,"
            " partition_info BLOB NOT NULL, UNIQUE (catalog, schema_name, name))"
        )
        # The job records have no index: DuckDB keeps the rows deleted from a table that has
        # one (module doc), and a record is deleted for every job (`_unindex_job_records`).
        self.connection.execute(f"CREATE TABLE IF NOT EXISTS {_COMMITS} ({_COMMITS_COLUMNS})")
        self.connection.execute(f"CREATE TABLE IF NOT EXISTS {_STAGED} ({_STAGED_COLUMNS})")
        self._unindex_job_records()
        # Ids are never reused: a write under way tells a table created again under its name
        # from the one it began on (a store from before the sequence starts after its tables).
        (last,) = self.connection.execute(
            f"SELECT coalesce(max(id), 0) FROM {_META}"
        ).fetchone() or (0,)
        self.connection.execute(f"CREATE SEQUENCE IF NOT EXISTS {_IDS} START WITH {int(last) + 1}")
        rows = self.connection.execute(
            f"SELECT id, catalog, schema_name, name, table_schema, options, partition_info"
            f" FROM {_META}"
        ).fetchall()
        for table_id, catalog, schema_name, name, schema_bytes, options, partition in rows:
            key = TableName(name, catalog, schema_name)
            self._entries[key] = TableEntry(
                key,
                table_id,
                TableSchema.from_proto(TableSchemaProto.parse(schema_bytes)),
                _stored_options(key, json.loads(options)),
                bytes(partition),
            )

    def _unindex_job_records(self) -> None:
        """A store from before copies its job records into tables without the primary key
        (and the commits' series and time, the time of opening for the commits it has)."""
        keyed = {
            name
            for (name,) in self.connection.execute(
                "SELECT table_name FROM duckdb_constraints()"
                " WHERE constraint_type = 'PRIMARY KEY' AND table_name IN (?, ?)",
                [_COMMITS, _STAGED],
            ).fetchall()
        }
        copies = {
            _COMMITS: (_COMMITS_COLUMNS, f"table_id, job, rows, NULL, NULL, {_now_ms()}"),
            _STAGED: (_STAGED_COLUMNS, "table_id, job, started_ms"),
        }
        for table, (columns, selected) in copies.items():
            if table not in keyed:
                continue
            with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                cur.execute(f"CREATE TABLE {table}_unindexed ({columns})")
                cur.execute(f"INSERT INTO {table}_unindexed SELECT {selected} FROM {table}")
                cur.execute(f"DROP TABLE {table}")
                cur.execute(f"ALTER TABLE {table}_unindexed RENAME TO {table}")

    def _discard_abandoned_puts(self) -> None:
        """A DoPut stages its rows under a job "put-…" and publishes them at its end: staging
        left by a process that died in between was never acknowledged, so it goes."""
        for entry in self.tables():
            self.connection.execute(
                f"DELETE FROM {entry.staging} WHERE starts_with(__ff_job, ?)", [PUT_JOB_PREFIX]
            )

    def tables(self) -> list[TableEntry]:
        with self._meta_lock:
            return sorted(self._entries.values(), key=lambda e: e.name)

    def entry(self, name: TableName) -> TableEntry:
        with self._meta_lock:
            found = self._entries.get(name)
        if found is None:
            raise NotFound(f"no table {str(name)!r}")
        return found

    def _publish(self, entry: TableEntry) -> None:
        with self._meta_lock:
            self._entries[entry.name] = entry

    def _save_entry(self, cur: duckdb.DuckDBPyConnection, entry: TableEntry) -> None:
        cur.execute(
            f"INSERT INTO {_META} VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
            " table_schema = excluded.table_schema, options = excluded.options,"
            " partition_info = excluded.partition_info",
            [
                entry.id,
                entry.name.catalog,
                entry.name.schema,
                entry.name.table,
                bytes(entry.schema.to_proto()),
                json.dumps(entry.options.as_strings()),
                entry.partition_info,
            ],
        )

    def create(
        self,
        name: TableName,
        schema: TableSchema,
        options: TableOptions | None = None,
        *,
        partition_info: bytes = b"",
        if_not_exists: bool = False,
    ) -> TableEntry:
        options = options or TableOptions()
        check_new_column_names(schema.names)
        with self._writing():
            with self._meta_lock:
                existing = self._entries.get(name)
            if existing is not None:
                same = (
                    existing.schema.arrow.equals(schema.arrow)
                    and existing.schema.timestamp == schema.timestamp
                    and existing.schema.primary_key == schema.primary_key
                )
                if if_not_exists and same:
                    return existing
                differs = "" if same else " with another schema"
                raise AlreadyExists(f"table {name} exists already{differs}")
            with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                (next_id,) = cur.execute(f"SELECT nextval('{_IDS}')").fetchone() or (0,)
                entry = TableEntry(
                    name, int(next_id), replace(schema, version=1), options, partition_info
                )
                cur.execute(_create_sql(entry.physical, entry.schema, options))
                cur.execute(_create_sql(entry.staging, entry.schema, None, staging=True))
                self._save_entry(cur, entry)
            self._publish(entry)
            return entry

    def drop(self, name: TableName) -> None:
        with self._writing():
            entry = self.entry(name)
            with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                cur.execute(f"DROP TABLE {entry.physical}")
                cur.execute(f"DROP TABLE {entry.staging}")
                cur.execute(f"DELETE FROM {_META} WHERE id = ?", [entry.id])
                cur.execute(f"DELETE FROM {_COMMITS} WHERE table_id = ?", [entry.id])
                cur.execute(f"DELETE FROM {_STAGED} WHERE table_id = ?", [entry.id])
            with self._meta_lock:
                del self._entries[name]

    def alter_schema(
        self, name: TableName, schema: TableSchema, pre_schema_version: int
    ) -> TableEntry:
        """Adds the columns `schema` has beyond the table's; every existing column must stay as
        it is. Refused when the table's version is no longer `pre_schema_version`."""
        with self._writing():
            entry = self.entry(name)
            current = entry.schema
            if pre_schema_version != current.version:
                raise Conflict(
                    f"table {name} is at schema version {current.version}, the alteration was"
                    f" made against version {pre_schema_version}: read the table info again"
                )
            added = _added_columns(current, schema)
            if not added:
                return entry
            altered = replace(entry, schema=current.with_added(added))
            with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                for column in altered.schema.columns[len(current.columns) :]:
                    for table in (entry.physical, entry.staging):
                        cur.execute(
                            f"ALTER TABLE {table} ADD COLUMN {_quote(column.name)}"
                            f" {column.type.duckdb}"
                        )
                self._save_entry(cur, altered)
            self._publish(altered)
            return altered

    def _same_table(self, name: TableName, table_id: int | None) -> TableEntry:
        """The table `name` names, which must be table `table_id` if given (a table dropped and
        created again under its name while a write was under way is another table)."""
        entry = self.entry(name)
        if table_id is not None and entry.id != table_id:
            raise Conflict(
                f"table {name} was dropped and created again while rows were written to it:"
                " nothing of this write was published"
            )
        return entry

    def alter_options(self, name: TableName, options: dict[str, str]) -> TableEntry:
        with self._writing():
            entry = self.entry(name)
            altered = replace(entry, options=TableOptions.parse(options, entry.options))
            with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                self._save_entry(cur, altered)
                expired = _purge(cur, altered)
            self._publish(altered)
            if expired:
                self._compact_if_due(altered)
            return altered

    def purge_expired(
        self,
        staging_ttl_ms: int = DEFAULT_STAGING_TTL_MS,
        committed_job_ttl_ms: int = DEFAULT_COMMITTED_JOB_TTL_MS,
    ) -> int:
        """Deletes the rows every table's TTL has expired, the staging of jobs begun more
        than `staging_ttl_ms` ago and never committed nor aborted, and the records of commits
        of no series older than `committed_job_ttl_ms`; returns the rows deleted."""
        deleted = 0
        now = _now_ms()
        cutoff = now - staging_ttl_ms
        with self._write_lock:
            for entry in self.tables():
                try:
                    with _transaction(self.connection.cursor(), self._commit_lock) as cur:
                        expired = _purge(cur, entry)
                        stale = cur.execute(
                            f"SELECT job FROM {_STAGED} WHERE table_id = ? AND started_ms < ?",
                            [entry.id, cutoff],
                        ).fetchall()
                        discarded = sum(_discard_job(cur, entry, job) for (job,) in stale)
                        (forgotten,) = cur.execute(
                            f"DELETE FROM {_COMMITS} WHERE table_id = ? AND series IS NULL"
                            " AND committed_ms < ?",
                            [entry.id, now - committed_job_ttl_ms],
                        ).fetchone() or (0,)
                except duckdb.Error as exc:  # one table's trouble must not stop the others'
                    log.warning("purging table %s failed, left as it was: %s", entry.name, exc)
                    continue
                if expired:
                    self._compact_if_due(entry)
                if expired or stale or forgotten:  # (counted once committed, as `_writing`
                    self._writes += 1  # does; a purge that deleted nothing changed nothing,
                deleted += expired + discarded  # and it runs every few seconds, read or not)
        return deleted

    # --- writes ------------------------------------------------------------------------

    def write(self, requests: Sequence[tuple[TableName, pa.Table]]) -> int:
        """Appends (or upserts, in OVERWRITE mode) each table's rows, all in one transaction:
        every row or none. Returns the rows written."""
        with self._writing(), _transaction(self.connection.cursor(), self._commit_lock) as cur:
            total = 0
            for index, (name, data) in enumerate(requests):
                try:
                    entry = self.entry(name)
                    total += _insert(cur, entry, entry.physical, conform_rows(entry.schema, data))
                except FlightfeedError as exc:
                    raise write_error(index, name, exc, len(requests)) from exc
                except duckdb.Error as exc:
                    raise write_error(index, name, _duckdb_error(exc), len(requests)) from exc
            return total

    def stage(
        self,
        name: TableName,
        job: str,
        partition: int,
        attempt: int,
        data: pa.Table,
        *,
        table_id: int | None = None,
    ) -> int:
        """A Spark task attempt's rows, kept aside until its job commits or aborts (`table_id`:
        the table the writer started on, refused if `name` is another table now)."""
        entry = self._same_table(name, table_id)
        rows = conform_rows(entry.schema, data)
        tags = (pa.scalar(job), pa.scalar(partition, pa.int32()), pa.scalar(attempt, pa.int64()))
        tagged = rows
        for column, value in zip(_STAGE_COLUMNS, tags, strict=True):
            tagged = tagged.append_column(column, pa.repeat(value, len(rows)))
        with self._writing(), _transaction(self.connection.cursor(), self._commit_lock) as cur:
            self._same_table(name, entry.id)  # (not dropped since its rows were conformed)
            if not job.startswith(PUT_JOB_PREFIX):  # (a DoPut's job ends with its stream)
                cur.execute(
                    f"INSERT INTO {_STAGED} SELECT ?, ?, ? WHERE NOT EXISTS"
                    f" (SELECT 1 FROM {_STAGED} WHERE table_id = ? AND job = ?)",
                    [entry.id, job, _now_ms(), entry.id, job],
                )
            cur.register("incoming", tagged)
            try:
                cur.execute(f"INSERT INTO {entry.staging} BY NAME SELECT * FROM incoming")
            except duckdb.Error as exc:
                raise _duckdb_error(exc) from exc
            finally:
                cur.unregister("incoming")
        return len(rows)

    def commit_staged(
        self,
        name: TableName,
        job: str,
        attempts: Sequence[tuple[int, int]],
        *,
        overwrite: bool = False,
        table_id: int | None = None,
        series: tuple[str, int] | None = None,
    ) -> int:
        """Publishes exactly the rows of the committed (partition, attempt)s of `job` (all of
        the table's rows replaced, with `overwrite`) and discards the job's staging, in one
        transaction. Returns the rows published. `table_id` as for `stage`.

        Committing a job again publishes nothing and answers the first commit's count: a driver
        that retries its commit, or a streaming micro-batch replayed after its commit, lands
        exactly once. That is remembered for `DEFAULT_COMMITTED_JOB_TTL_MS` (`purge_expired`),
        or, for a job of a `series` (its name, this job's place in it: a streaming query's
        micro-batches, which Spark never runs again once the next one began), until the
        series' job after the next commits."""
        partitions = [p for p, _ in attempts]
        if len(set(partitions)) != len(partitions):
            raise InvalidArgument(f"a job commits one attempt per partition, got {list(attempts)}")
        with self._writing(), _transaction(self.connection.cursor(), self._commit_lock) as cur:
            entry = self._same_table(name, table_id)
            done = cur.execute(
                f"SELECT rows FROM {_COMMITS} WHERE table_id = ? AND job = ?", [entry.id, job]
            ).fetchone()
            if done is not None:  # what came since (a replay, a late attempt) goes
                _discard_job(cur, entry, job)
                return int(done[0])
            chosen = pa.table(
                {
                    "p": pa.array([p for p, _ in attempts], pa.int32()),
                    "a": pa.array([a for _, a in attempts], pa.int64()),
                }
            )
            cur.register("committed", chosen)
            columns = ", ".join(_quote(c) for c in entry.schema.names)
            source = (
                f"SELECT {columns} FROM {entry.staging} s JOIN committed c"
                f" ON s.__ff_partition = c.p AND s.__ff_attempt = c.a WHERE s.__ff_job = ?"
            )
            publish = partial(_insert_from, cur, entry, source=source, params=(job,))
            try:
                # (an overwrite fills a new table: DuckDB would keep the rows it deleted)
                published = _refill(cur, entry, publish) if overwrite else publish(entry.physical)
            except duckdb.Error as exc:
                raise _duckdb_error(exc) from exc
            finally:
                cur.unregister("committed")
            _discard_job(cur, entry, job)
            if not job.startswith(PUT_JOB_PREFIX):  # a DoPut's job is never committed twice
                _remember_commit(cur, entry, job, published, series)
            return published

    def _compact_if_due(self, entry: TableEntry) -> None:
        """Copies an OVERWRITE-mode table anew once the rows its TTL deleted, which DuckDB
        keeps (module doc), outnumber its live ones and `compact_min_dead_rows` (an upsert
        updates its row in place, and an overwrite fills a new table: purges are what leave
        deleted rows behind). Under the write lock, after the purge's commit; a failure leaves
        the table as it was."""
        if entry.options.update_mode != "OVERWRITE":
            return  # (no index: DuckDB drops deleted rows at its checkpoints)
        cur = self.connection.cursor()
        try:
            size = _stored_rows(cur, entry.physical)
            (live,) = cur.execute(f"SELECT count(*) FROM {entry.physical}").fetchone() or (0,)
            if size - live < max(live, self.compact_min_dead_rows):
                return
            with _transaction(self.connection.cursor(), self._commit_lock) as tx:
                _refill(tx, entry, partial(_copy_rows, tx, entry.physical, entry.schema.names))
            log.info("table %s copied anew: %d rows, %d deleted ones dropped", entry.name, live,
                     size - live)  # fmt: skip
        except duckdb.Error as exc:
            log.warning("copying table %s anew failed, left as it was: %s", entry.name, exc)
        finally:
            cur.close()

    def abort_staged(self, name: TableName, job: str) -> int:
        entry = self.entry(name)
        with self._writing(), _transaction(self.connection.cursor(), self._commit_lock) as cur:
            return _discard_job(cur, entry, job)

    # --- reads -------------------------------------------------------------------------

    def scan(
        self, name: TableName, spec: ScanSpec, table_id: int | None = None
    ) -> pa.RecordBatchReader:
        """The rows `spec` selects, streamed (the reader keeps its own cursor); `table_id`: of
        that table only, NotFound once it is dropped."""
        cur = self.connection.cursor()
        try:
            reader = self.scan_in(cur, name, spec, table_id)
        except BaseException:
            cur.close()
            raise
        return _CursorReader.wrap(reader, cur)

    def scan_in(
        self,
        cur: duckdb.DuckDBPyConnection,
        name: TableName,
        spec: ScanSpec,
        table_id: int | None = None,
    ) -> pa.RecordBatchReader:
        """`scan` on a cursor the caller keeps (one of a snapshot's: `open_snapshot`)."""
        entry = self._read_table(name, table_id)
        sql, params = scan_sql(entry, spec, now_ms=_now_ms())
        try:
            return cur.execute(sql, params).to_arrow_reader(spec.batch_size)
        except duckdb.CatalogException as exc:
            raise _dropped_while_read(name) from exc
        except duckdb.Error as exc:
            raise _duckdb_error(exc) from exc

    def open_snapshot(
        self, name: TableName, table_id: int, cursors: int
    ) -> tuple[int, list[duckdb.DuckDBPyConnection], bytes]:
        """`cursors` transactions that all see the table as it is now, its highest row id then
        (-1 when empty) and the store's `version` then: the slices of a read planned once and
        redeemed one by one (a FlightInfo's endpoints) read them, so no write between the
        slices' reads shows in some of them. DuckDB fixes a transaction's snapshot at its first
        statement, so each cursor runs one while no write commits (under the commit lock). The
        caller closes them."""
        if cursors < 1:
            raise ValueError(f"a snapshot needs at least one cursor, got {cursors}")
        opened: list[duckdb.DuckDBPyConnection] = []
        row: tuple[Any, ...] | None = None
        with self._commit_lock:
            version = self.version  # (before the transactions: a write counted after them is
            entry = self._read_table(name, table_id)  # one they may not have seen)
            try:
                for _ in range(cursors):
                    cur = self.connection.cursor()
                    opened.append(cur)
                    cur.execute("BEGIN TRANSACTION")
                    row = cur.execute(f"SELECT max(rowid) FROM {entry.physical}").fetchone()
            except BaseException as exc:
                close_all(opened)
                if isinstance(exc, duckdb.CatalogException):
                    raise _dropped_while_read(name) from exc
                if isinstance(exc, duckdb.Error):
                    raise _duckdb_error(exc) from exc
                raise
        top = None if row is None else row[0]
        return (-1 if top is None else int(top)), opened, version

    def scan_unchanged(
        self, name: TableName, spec: ScanSpec, table_id: int, version: bytes
    ) -> pa.RecordBatchReader | None:
        """`scan`, if the store is still at `version` (None if not): the rows a snapshot taken
        at that version reads, row ids and all (module doc). Started under the write lock, so
        no write commits between the check and the scan's transaction."""
        with self._write_lock:
            if version != self.version:
                return None
            return self.scan(name, spec, table_id)

    def scan_slices(
        self, name: TableName, spec: ScanSpec, parallelism: int, table_id: int | None = None
    ) -> list[pa.RecordBatchReader]:
        """`spec` split by row id into up to `parallelism` slices, a reader each, all of one
        snapshot. Each reader's cursor is a transaction of its own: they are opened while no
        write commits (under the commit lock), or the slices of one read could mix two writes."""
        with self._commit_lock:
            top = self.max_rowid(name, table_id)
            bounds = [(top + 1) * i // parallelism for i in range(parallelism + 1)]
            slices = [
                replace(spec, rowid_range=(lo, hi))
                for lo, hi in itertools.pairwise(bounds)
                if hi > lo
            ] or [spec]
            readers: list[pa.RecordBatchReader] = []
            try:
                readers.extend(self.scan(name, one, table_id) for one in slices)
            except BaseException:
                close_all(readers)
                raise
            return readers

    def row_count(self, name: TableName) -> int:
        entry = self.entry(name)
        sql, params = scan_sql(entry, ScanSpec(columns=()), now_ms=_now_ms())
        cur = self.connection.cursor()
        try:
            (count,) = cur.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()  # type: ignore[misc]
            return int(count)
        except duckdb.CatalogException as exc:
            raise _dropped_while_read(name) from exc
        finally:
            cur.close()

    def max_rowid(self, name: TableName, table_id: int | None = None) -> int:
        entry = self._read_table(name, table_id)
        cur = self.connection.cursor()
        try:
            (top,) = cur.execute(f"SELECT max(rowid) FROM {entry.physical}").fetchone()  # type: ignore[misc]
            return -1 if top is None else int(top)
        except duckdb.CatalogException as exc:
            raise _dropped_while_read(name) from exc
        finally:
            cur.close()

    def _read_table(self, name: TableName, table_id: int | None) -> TableEntry:
        """The table `name` names, which must be table `table_id` if given."""
        entry = self.entry(name)
        if table_id is not None and entry.id != table_id:
            raise _dropped_while_read(name)
        return entry


class _CursorReader:
    """Keeps a scan's cursor open exactly as long as its reader."""

    @staticmethod
    def wrap(reader: pa.RecordBatchReader, cur: duckdb.DuckDBPyConnection) -> pa.RecordBatchReader:
        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from reader
            finally:
                cur.close()

        return pa.RecordBatchReader.from_batches(reader.schema, batches())


TIMESTAMP_MIN_MS: Final = -9_223_372_022_400_000
TIMESTAMP_MAX_MS: Final = 9_223_372_036_854_775
"""The milliseconds DuckDB's TIMESTAMP holds (microseconds in an int64): every comparison of a
table's timestamps converts to it, so values outside are refused on write and a time range's
bounds outside are no bound (HoraeDB asks for [i64::MIN, i64::MAX) when it means 'any time')."""


def _cutoff(ms: int) -> int:
    """A lower bound in DuckDB's timestamp range (before its first instant: the first)."""
    return max(ms, TIMESTAMP_MIN_MS)


def scan_sql(entry: TableEntry, spec: ScanSpec, *, now_ms: int) -> tuple[str, list[Any]]:
    """The SELECT a scan runs, and its parameters."""
    schema = entry.schema
    if spec.columns is None:
        columns = schema.names
    else:
        for name in spec.columns:
            schema.column(name)  # a clear error for a column the table does not have
        columns = list(spec.columns)
    shown = ", ".join(_quote(c) for c in columns) if columns else "NULL AS __ff_none"
    where: list[str] = []
    params: list[Any] = []
    ts = _quote(schema.timestamp)
    if spec.time_range is not None:
        start, end = spec.time_range
        if start > TIMESTAMP_MAX_MS or end <= TIMESTAMP_MIN_MS or end <= start:
            where.append("FALSE")  # (no stored timestamp lies there)
        else:
            if start > TIMESTAMP_MIN_MS:
                where.append(f"{ts} >= epoch_ms(?::BIGINT)")
                params.append(start)
            if end <= TIMESTAMP_MAX_MS:
                where.append(f"{ts} < epoch_ms(?::BIGINT)")
                params.append(end)
    if entry.options.ttl_ms is not None:
        where.append(f"{ts} >= epoch_ms(?::BIGINT)")
        params.append(_cutoff(now_ms - entry.options.ttl_ms))
    if spec.rowid_range is not None:
        where.append("rowid >= ? AND rowid < ?")
        params.extend(spec.rowid_range)
    for predicate in spec.where:
        where.append(f"({predicate.sql})")
        params.extend(predicate.params)
    sql = f"SELECT {shown} FROM {entry.physical}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if spec.order != "none":
        sql += f" ORDER BY {ts} {spec.order.upper()}"
    return sql, params


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _create_sql(
    table: str, schema: TableSchema, options: TableOptions | None, *, staging: bool = False
) -> str:
    columns = [
        f"{_quote(c.name)} {c.type.duckdb}{'' if c.nullable else ' NOT NULL'}"
        for c in schema.columns
    ]
    if staging:
        columns += [
            f"{_STAGE_COLUMNS[0]} VARCHAR NOT NULL",
            f"{_STAGE_COLUMNS[1]} INTEGER NOT NULL",
            f"{_STAGE_COLUMNS[2]} BIGINT NOT NULL",
        ]
    elif options is not None and options.update_mode == "OVERWRITE":
        columns.append(f"PRIMARY KEY ({', '.join(_quote(c) for c in schema.primary_key)})")
    return f"CREATE TABLE {table} ({', '.join(columns)})"


def _added_columns(current: TableSchema, wanted: TableSchema) -> list[Any]:
    """The columns of `wanted` after the table's own, which must come first, unchanged (ids
    too: a HoraeDB node writes rows by them)."""
    have = current.columns
    if len(wanted.columns) < len(have):
        raise InvalidArgument("AlterTableSchema can only add columns, not drop them")
    for old, new in zip(have, wanted.columns, strict=False):
        if (old.name, old.type, old.nullable, old.is_tag, old.id) != (
            new.name,
            new.type,
            new.nullable,
            new.is_tag,
            new.id,
        ):
            raise InvalidArgument(
                f"AlterTableSchema can only add columns: column {old.name!r} would change"
            )
    if (wanted.timestamp, wanted.primary_key) != (current.timestamp, current.primary_key):
        raise InvalidArgument("AlterTableSchema cannot change the timestamp or primary key")
    added = list(wanted.columns[len(have) :])
    check_new_column_names([column.name for column in added])
    return added


def conform_rows(schema: TableSchema, data: pa.Table) -> pa.Table:
    """`data` as the table's columns: missing nullable columns are null, values converted as
    `assign` allows (a timestamp of any unit to milliseconds, exactly); an unknown column is an
    error."""
    known = set(schema.names)
    unknown = [name for name in data.column_names if name not in known]
    if unknown:
        raise InvalidArgument(f"no column(s) {unknown} in the table ({schema.names})")
    if len(set(data.column_names)) != len(data.column_names):
        raise InvalidArgument(f"columns repeat in the rows written: {data.column_names}")
    columns = []
    for column in schema.columns:
        if column.name not in data.column_names:
            if not column.nullable:
                raise InvalidArgument(f"the rows written lack non-null column {column.name!r}")
            columns.append(pa.nulls(len(data), column.type.arrow))
            continue
        values = assign(
            column.name, column.type.data_type.name, column.type.arrow, data.column(column.name)
        )
        if not column.nullable and values.null_count:
            raise InvalidArgument(f"column {column.name!r} is not nullable; got nulls")
        if pa.types.is_timestamp(values.type):
            _check_timestamp_range(column.name, values)
        columns.append(values)
    return pa.Table.from_arrays(columns, schema=schema.arrow)


def _stored_options(name: TableName, stored: dict[str, str]) -> TableOptions:
    """A table's options as stored; a TTL stored before TTLs were bounded (MAX_DURATION_MS)
    is none, as it was in effect, rather than a worker that cannot start."""
    try:
        return TableOptions.parse(stored)
    except InvalidArgument as exc:
        log.warning("table %s: stored option refused (%s); kept without a TTL", name, exc)
        kept = {k: v for k, v in stored.items() if k not in ("ttl", "enable_ttl")}
        return TableOptions.parse(kept)


def _check_timestamp_range(name: str, values: pa.ChunkedArray | pa.Array) -> None:
    """Refuse milliseconds DuckDB cannot compare (see TIMESTAMP_MIN_MS): stored, such a value
    failed every read and purge of its table."""
    if len(values) == values.null_count:
        return
    bounds = pc.min_max(values.cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low < TIMESTAMP_MIN_MS or high > TIMESTAMP_MAX_MS:
        bad = low if low < TIMESTAMP_MIN_MS else high
        raise InvalidArgument(
            f"column {name!r} holds {bad} ms since the epoch, outside the timestamps a table"
            f" stores ({TIMESTAMP_MIN_MS} to {TIMESTAMP_MAX_MS} ms: years 290308 BC to"
            " 294247 AD)"
        )


def _insert(cur: duckdb.DuckDBPyConnection, entry: TableEntry, table: str, data: pa.Table) -> int:
    cur.register("incoming", data)
    try:
        return _insert_from(cur, entry, table, "SELECT * FROM incoming", ())
    finally:
        cur.unregister("incoming")


def _insert_from(
    cur: duckdb.DuckDBPyConnection,
    entry: TableEntry,
    table: str,
    source: str,
    params: tuple[Any, ...],
) -> int:
    """INSERT the rows of `source`; in OVERWRITE mode the last of several rows with one key
    wins, within the request as against the table.

    The last row of a key is found on the keys alone and joined back: a window partitioned by
    the key over every column (`QUALIFY row_number() OVER (PARTITION BY key ...)`) made DuckDB
    1.5 drop the sign of -0.0 and -NaN in the rows' doubles when a string column rode along."""
    if entry.options.update_mode == "APPEND":
        sql = f"INSERT INTO {table} BY NAME {source}"
    else:
        key = ", ".join(_quote(c) for c in entry.schema.primary_key)
        sql = (
            f"INSERT OR REPLACE INTO {table} BY NAME"
            f" WITH numbered AS MATERIALIZED"
            f" (SELECT *, row_number() OVER () AS __ff_order FROM ({source}))"
            f" SELECT * EXCLUDE (__ff_order) FROM numbered SEMI JOIN"
            f" (SELECT max(__ff_order) AS __ff_last FROM numbered GROUP BY {key}) AS last"
            f" ON numbered.__ff_order = last.__ff_last"
        )
    row = cur.execute(sql, list(params)).fetchone()
    return int(row[0]) if row else 0


def _refill(cur: duckdb.DuckDBPyConnection, entry: TableEntry, fill: Callable[[str], int]) -> int:
    """In `cur`'s transaction, `entry`'s table replaced by a new one of its schema and options
    that `fill(name)` fills; returns what `fill` does. Nothing deleted is carried over."""
    fresh = f"{entry.physical}_refill"
    cur.execute(_create_sql(fresh, entry.schema, entry.options))
    rows = fill(fresh)
    cur.execute(f"DROP TABLE {entry.physical}")
    cur.execute(f"ALTER TABLE {fresh} RENAME TO {entry.physical}")
    return rows


def _copy_rows(
    cur: duckdb.DuckDBPyConnection, source: str, columns: Sequence[str], table: str
) -> int:
    """Every row of `source` into `table`, in their order."""
    names = ", ".join(_quote(c) for c in columns)
    row = cur.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {source}").fetchone()
    return int(row[0]) if row else 0


def _stored_rows(cur: duckdb.DuckDBPyConnection, table: str) -> int:
    """The rows DuckDB stores for `table`, deleted ones it keeps included (its estimate, from
    its catalog: no scan)."""
    row = cur.execute(
        "SELECT estimated_size FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = ?",
        [table],
    ).fetchone()
    return int(row[0]) if row else 0


def _purge(cur: duckdb.DuckDBPyConnection, entry: TableEntry) -> int:
    if entry.options.ttl_ms is None:
        return 0
    row = cur.execute(
        f"DELETE FROM {entry.physical} WHERE {_quote(entry.schema.timestamp)}"
        " < epoch_ms(?::BIGINT)",
        [_cutoff(_now_ms() - entry.options.ttl_ms)],
    ).fetchone()
    return int(row[0]) if row else 0


def _remember_commit(
    cur: duckdb.DuckDBPyConnection,
    entry: TableEntry,
    job: str,
    published: int,
    series: tuple[str, int] | None,
) -> None:
    """Records a commit, and forgets those of its series before the one before it."""
    name, sequence = series if series is not None else (None, None)
    cur.execute(
        f"INSERT INTO {_COMMITS} VALUES (?, ?, ?, ?, ?, ?)",
        [entry.id, job, published, name, sequence, _now_ms()],
    )
    if series is not None and sequence:
        cur.execute(
            f"DELETE FROM {_COMMITS} WHERE table_id = ? AND series = ? AND sequence < ?",
            [entry.id, name, sequence - 1],
        )


def _discard_job(cur: duckdb.DuckDBPyConnection, entry: TableEntry, job: str) -> int:
    """Drops a job's staged rows (and its record); returns how many rows."""
    cur.execute(f"DELETE FROM {_STAGED} WHERE table_id = ? AND job = ?", [entry.id, job])
    row = cur.execute(f"DELETE FROM {entry.staging} WHERE __ff_job = ?", [job]).fetchone()
    return int(row[0]) if row else 0


def _dropped_while_read(name: TableName) -> NotFound:
    """A read whose table was dropped since it found it (by then, DuckDB's catalog error)."""
    return NotFound(f"table {name} was dropped while it was read")


def _duckdb_error(exc: duckdb.Error) -> FlightfeedError:
    """DuckDB's refusal of bad data is the request's error; anything else is the worker's."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, duckdb.ConstraintException | duckdb.ConversionException):
        return InvalidArgument(text)
    if isinstance(exc, duckdb.BinderException | duckdb.InvalidInputException):
        return InvalidArgument(text)
    error = FlightfeedError(f"the table store failed: {text}", error_type=type(exc).__name__)
    return error


def write_error(index: int, name: TableName, cause: FlightfeedError, count: int) -> TableWriteError:
    """The error of request `index` of a write of `count` requests, which wrote nothing."""
    whole = "the WriteBatch wrote nothing: " if count > 1 else "nothing was written: "
    where = f"request {index} (table {name})" if count > 1 else f"table {name}"
    return TableWriteError(
        f"{whole}{where} failed: {cause.message}", WriteFailure(index, str(name)), cause
    )


class _transaction:
    """`with _transaction(cursor, commit_lock) as cur:` BEGIN … COMMIT (under `commit_lock`),
    or ROLLBACK on any error; the cursor is closed after."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, commit_lock: threading.Lock) -> None:
        self.cur = cur
        self.commit_lock = commit_lock

    def __enter__(self) -> duckdb.DuckDBPyConnection:
        self.cur.execute("BEGIN TRANSACTION")
        return self.cur

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            if kind is None:
                with self.commit_lock:
                    self.cur.execute("COMMIT")
            else:
                self.cur.execute("ROLLBACK")
        finally:
            self.cur.close()


def close_all(closeable: Iterable[duckdb.DuckDBPyConnection | pa.RecordBatchReader]) -> None:
    """Closes each cursor or reader (blocking: DuckDB may finish a query first)."""
    for one in closeable:
        one.close()


__all__ = [
    "DEFAULT_CATALOG",
    "DEFAULT_SCHEMA",
    "ENGINE",
    "PUT_JOB_PREFIX",
    "STORE_VERSION_BYTES",
    "ScanSpec",
    "SqlPredicate",
    "TableEntry",
    "TableName",
    "TableStore",
    "TableWriteError",
    "close_all",
    "WriteFailure",
    "scan_sql",
    "conform_rows",
    "write_error",
]
