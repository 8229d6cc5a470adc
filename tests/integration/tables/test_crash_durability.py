"""A worker killed with SIGKILL at random moments while clients stream WriteBatch requests
into its tables; after each restart (on the same data directory), every acknowledged request
is fully present and every request in flight at the kill is fully present or fully absent, in
both tables alike.

One data directory serves every trial, so state piles up from trial to trial: a request
resolved once (present or absent) must stay so after every later crash, and the WAL replay,
checkpoints and recovery of earlier crashes are all under test again. Each WriteBatch covers
two tables (`t1`, `t2`) with rows tagged by a unique request id `req`; the two tables get
different row counts, so a half-applied batch cannot hide. Rows are generated from the seed
and the request id, and the last check compares every row read back with what was sent.

`FLIGHTFEED_CRASH_TRIALS` sets the number of kills (default 50; 12 when `CI` is set),
`FLIGHTFEED_CRASH_SEED` the seed. `pytest -s` prints the counts.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from grpclib.client import Channel
from helpers.worker_process import worker_log, worker_process

from flightfeed._generated.remote_engine import (
    ReadRequest,
    RemoteEngineServiceStub,
    RowGroup,
    TableIdentifier,
    TableReadRequest,
    WriteBatchRequest,
    WriteRequest,
)
from flightfeed._generated.schema import ProjectedSchema, Projection
from flightfeed._generated.storage import ArrowPayload
from flightfeed.tables.decode_budget import DecodeBudget
from flightfeed.tables.options import TableOptions
from flightfeed.tables.payload import decode_payload, ipc_stream
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import DATABASE_FILE, TableName, TableStore

TRIALS = int(os.environ.get("FLIGHTFEED_CRASH_TRIALS", "12" if os.environ.get("CI") else "50"))
SEED = int(os.environ.get("FLIGHTFEED_CRASH_SEED", "20250611"))
SENDERS = 3
"""Clients writing at once: the worker queues their batches, so a kill finds several in flight."""
MAX_KILL_DELAY = 0.3
"""The kill lands uniformly within this many seconds of the first request (trials 1, 3, ...: it
may hit work the first write after a restart does, such as the checkpoint a long replayed WAL
calls for) or of the first acknowledgement (trials 2, 4, ...: while writes flow)."""
FIRST_ACK_TIMEOUT = 120.0
TABLES = ("t1", "t2")
SCHEMA = pa.schema(
    [
        ("req", pa.int64()),
        ("i", pa.int64()),
        ("ts", pa.timestamp("ms")),
        ("host", pa.string()),
        ("v", pa.float64()),
        ("n", pa.int64()),
        ("note", pa.string()),
    ]
)
TABLE_SCHEMA = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host"])
STORED = TABLE_SCHEMA.arrow
"""As the tables hold it (the timestamp and tag are not null)."""
MAX_DECODED = 1 << 30
CALL_TIMEOUT = 30.0


def request_rows(req: int) -> dict[str, pa.RecordBatch]:
    """Request `req`'s rows for each table: the same every time they are asked for (seeded by
    the request id), several hundred per table, a different number for each table."""
    rng = np.random.default_rng([SEED, req])
    rows = {}
    for table in TABLES:
        count = int(rng.integers(200, 800))
        i = np.arange(count, dtype=np.int64)
        hosts = rng.integers(0, 16, count)
        notes = rng.integers(0, 1 << 62, count)
        rows[table] = pa.record_batch(
            [
                pa.array(np.full(count, req, dtype=np.int64)),
                pa.array(i),
                pa.array(1_700_000_000_000 + req * 1_000 + i, pa.timestamp("ms")),
                pa.array([f"host-{h:02d}" for h in hosts]),
                pa.array(rng.random(count)),
                pa.array(rng.integers(-(1 << 40), 1 << 40, count)),
                pa.array([f"{n:016x}" * 16 for n in notes]),  # 256 bytes: WAL volume
            ],
            schema=SCHEMA,
        )
    return rows


def write_batch(req: int) -> WriteBatchRequest:
    return WriteBatchRequest(
        batch=[
            WriteRequest(
                table=TableIdentifier(table=table),
                row_group=RowGroup(
                    arrow=ArrowPayload(record_batches=[ipc_stream(batch).to_pybytes()])
                ),
            )
            for table, batch in request_rows(req).items()
        ]
    )


@dataclass
class Trial:
    """What the clients saw of one trial's requests."""

    sent: list[int] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    refused: dict[int, str] = field(default_factory=dict)
    """Requests answered with an error header: they must have written nothing."""
    early_errors: list[str] = field(default_factory=list)
    """Calls that failed before the kill (there should be none)."""
    killed_at: float | None = None
    first_ack: float | None = None
    """Seconds from the first request to the first acknowledgement."""

    @property
    def in_doubt(self) -> set[int]:
        return set(self.sent) - self.acked - set(self.refused)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def endpoint(location: str) -> tuple[str, int]:
    host, port = location.removeprefix("grpc://").rsplit(":", 1)
    return host, int(port)


async def write_until_killed(
    location: str, pid: int, ids: itertools.count[int], *, delay: float, after_ack: bool
) -> Trial:
    """SENDERS clients writing batches back to back; the worker is killed `delay` seconds
    after the first request, or after the first acknowledgement (`after_ack`). Returns once
    every client's call has ended."""
    trial = Trial()
    channel = Channel(*endpoint(location))
    stub = RemoteEngineServiceStub(channel)
    acknowledged = asyncio.Event()
    began = time.perf_counter()

    async def sender() -> None:
        while trial.killed_at is None:
            req = next(ids)
            message = write_batch(req)
            trial.sent.append(req)
            try:
                response = await stub.write_batch(message, timeout=CALL_TIMEOUT)
            except Exception as exc:
                if trial.killed_at is None:
                    trial.early_errors.append(f"request {req}: {type(exc).__name__}: {exc}")
                return
            header = response.header
            if header is not None and header.code != 0:
                trial.refused[req] = f"{header.code}: {header.error}"
            else:
                trial.acked.add(req)
                if trial.first_ack is None:
                    trial.first_ack = time.perf_counter() - began
                    acknowledged.set()

    async def killer() -> None:
        if after_ack:
            await asyncio.wait_for(acknowledged.wait(), FIRST_ACK_TIMEOUT)
        await asyncio.sleep(delay)
        trial.killed_at = time.perf_counter()
        os.kill(pid, signal.SIGKILL)

    try:
        await asyncio.gather(killer(), *(sender() for _ in range(SENDERS)))
    finally:
        channel.close()
    return trial


async def read_columns(location: str, table: str, columns: list[str] | None) -> pa.Table:
    """A whole table (`columns` of it, None: all) through the Read RPC."""
    projected = None
    if columns is not None:
        projection = Projection(idx=[SCHEMA.get_field_index(c) for c in columns])
        projected = ProjectedSchema(projection=projection)
    request = ReadRequest(
        table=TableIdentifier(table=table),
        read_request=TableReadRequest(projected_schema=projected),
    )
    channel = Channel(*endpoint(location))
    try:
        batches: list[pa.RecordBatch] = []
        async for response in RemoteEngineServiceStub(channel).read(request, timeout=120):
            header = response.header
            assert header is None or header.code == 0, f"Read of {table} failed: {header}"
            if response.arrow is not None:
                batches.extend(decode_payload(response.arrow, budget=DecodeBudget(MAX_DECODED)))
    finally:
        channel.close()
    schema = STORED if columns is None else pa.schema([STORED.field(c) for c in columns])
    return pa.Table.from_batches(batches, schema=schema)


async def request_summaries(location: str) -> dict[str, dict[int, tuple[int, int, int, int]]]:
    """Per table, per request id: (row count, sum, min and max of `i`)."""
    found = {}
    for table in TABLES:
        rows = await read_columns(location, table, ["req", "i"])
        grouped = rows.group_by("req").aggregate(
            [("i", "count"), ("i", "sum"), ("i", "min"), ("i", "max")]
        )
        found[table] = {
            req: (count, total, low, high)
            for req, count, total, low, high in zip(
                *(
                    grouped.column(c).to_pylist()
                    for c in ("req", "i_count", "i_sum", "i_min", "i_max")
                ),
                strict=True,
            )
        }
    return found


def complete(req: int) -> dict[str, tuple[int, int, int, int]]:
    """What request `req` looks like when all of it is there."""
    summary = {}
    for table, batch in request_rows(req).items():
        n = batch.num_rows
        summary[table] = (n, n * (n - 1) // 2, 0, n - 1)
    return summary


def check_state(
    found: dict[str, dict[int, tuple[int, int, int, int]]],
    present: set[int],
    in_doubt: set[int],
) -> set[int]:
    """Every request of `present` complete in both tables; each of `in_doubt` complete in both
    or absent from both; nothing else. Returns the requests of `in_doubt` that are present."""
    problems: list[str] = []
    landed: set[int] = set()
    for req in sorted(present | in_doubt):
        whole = complete(req)
        seen = {table: found[table].get(req) for table in TABLES}
        if all(seen[t] == whole[t] for t in TABLES):
            landed.add(req)
        elif not (req in in_doubt and all(seen[t] is None for t in TABLES)):
            kind = "acknowledged" if req in present else "in-flight"
            problems.append(f"{kind} request {req}: found {seen}, expected {whole} or nothing")
    for table in TABLES:
        strangers = sorted(set(found[table]) - present - in_doubt)
        if strangers:
            problems.append(
                f"{table} holds requests nobody wrote or that were refused: {strangers}"
            )
    assert not problems, "\n".join(problems)
    assert present <= landed
    return landed & in_doubt


async def check_contents(location: str, present: set[int]) -> int:
    """Every row of every table is exactly what was sent; returns the rows checked."""
    rows = 0
    for table in TABLES:
        stored = (await read_columns(location, table, None)).sort_by(
            [("req", "ascending"), ("i", "ascending")]
        )
        expected = pa.Table.from_batches(
            [request_rows(req)[table] for req in sorted(present)], schema=SCHEMA
        )
        assert stored.num_rows == expected.num_rows, table
        for name in SCHEMA.names:
            same = pc.all(pc.equal(stored.column(name), expected.column(name))).as_py()
            assert same or stored.num_rows == 0, f"{table}.{name} differs from what was written"
        rows += stored.num_rows
    return rows


def create_tables(data_dir: Path) -> None:
    store = TableStore.open(data_dir)
    try:
        for table in TABLES:
            store.create(
                TableName.of(table),
                TABLE_SCHEMA,
                TableOptions(update_mode="APPEND"),
            )
    finally:
        store.close()


@pytest.mark.timeout(max(300, 10 * TRIALS))
def test_acknowledged_writes_survive_kill_9(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    create_tables(tmp_path)
    ids = itertools.count(1)
    present: set[int] = set()
    absent: set[int] = set()
    in_doubt: set[int] = set()
    totals = {"acked": 0, "in_doubt": 0, "in_doubt_present": 0, "in_doubt_absent": 0}
    restarts: list[float] = []
    first_acks: list[float] = []
    checkpoints = 0
    wal = tmp_path / (DATABASE_FILE + ".wal")
    started = time.perf_counter()
    for trial_number in range(TRIALS + 1):
        restart = time.perf_counter()
        proc: subprocess.Popen[str]
        with worker_process("--data-dir", str(tmp_path)) as (proc, location):
            restarts.append(time.perf_counter() - restart)
            # The state the previous crash left: every acknowledged request, and each in-flight
            # one whole or not at all.
            found = asyncio.run(request_summaries(location))
            landed = check_state(found, present, in_doubt)
            present |= landed
            absent |= in_doubt - landed
            totals["in_doubt_present"] += len(landed)
            totals["in_doubt_absent"] += len(in_doubt - landed)
            if trial_number == TRIALS:
                checked = asyncio.run(check_contents(location, present))
                assert "Traceback" not in worker_log(proc), worker_log(proc)
                break
            wal_before = wal.stat().st_size if wal.exists() else 0
            after_ack = trial_number % 2 == 1
            delay = rng.uniform(0, MAX_KILL_DELAY)
            trial = asyncio.run(
                write_until_killed(location, proc.pid, ids, delay=delay, after_ack=after_ack)
            )
            assert proc.wait(timeout=30) == -signal.SIGKILL
            log = worker_log(proc)
        assert not trial.early_errors, trial.early_errors
        assert not trial.refused, trial.refused
        assert "Traceback" not in log, log
        present |= trial.acked
        in_doubt = trial.in_doubt
        totals["acked"] += len(trial.acked)
        totals["in_doubt"] += len(in_doubt)
        wal_after = wal.stat().st_size if wal.exists() else 0
        checkpoints += wal_after < wal_before  # DuckDB checkpointed, and truncated its WAL
        if trial.first_ack is not None:
            first_acks.append(trial.first_ack)
        first = "-" if trial.first_ack is None else f"{trial.first_ack * 1000:.0f} ms"
        print(
            f"trial {trial_number + 1} (kill {'after the first ack' if after_ack else 'any time'}):"
            f" {len(trial.sent)} sent, {len(trial.acked)} acknowledged (first after {first}),"
            f" {len(in_doubt)} in flight at the kill; WAL {wal_after / 1e6:.1f} MB"
        )
    elapsed = time.perf_counter() - started
    print(
        f"{TRIALS} kills (seed {SEED}) in {elapsed:.1f} s: {totals['acked']} acknowledged"
        f" WriteBatches all present; {totals['in_doubt']} in flight at a kill:"
        f" {totals['in_doubt_present']} fully present, {totals['in_doubt_absent']} fully absent;"
        f" {checked} rows checked value by value at the end; a checkpoint completed during"
        f" {checkpoints} trial(s); first acknowledgement after a restart: median"
        f" {median(first_acks) * 1000:.0f} ms, max {max(first_acks, default=0) * 1000:.0f} ms;"
        f" worker start median {median(restarts):.2f} s,"
        f" max {max(restarts):.2f} s"
    )
    assert totals["acked"] > 0
    assert len(present) + len(absent) == next(ids) - 1
