"""A read predicate checked against DataFusion itself: the filter DataFusion plans for a SQL
WHERE over some rows, encoded as HoraeDB sends it, read back through a real TableEngine."""

from __future__ import annotations

import itertools

import pyarrow as pa
from datafusion import SessionContext

from flightfeed.tables.engine import TableEngine, TableRead
from flightfeed.tables.requests import decode_predicate
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName, TableStore

_NAMES = itertools.count()


async def read_ids(rows: pa.Table, where: str) -> tuple[list[int], list[int]]:
    """(the ids flightfeed reads with DataFusion's plan of `where`, the ids DataFusion returns)."""
    ctx = SessionContext()
    ctx.register_record_batches("t", [rows.to_batches()])
    frame = ctx.sql(f"SELECT id FROM t WHERE {where}")
    expected = sorted(frame.to_arrow_table().column("id").to_pylist())
    plan = frame.optimized_logical_plan()
    while type(plan.to_variant()).__name__ != "Filter":
        (plan,) = plan.inputs()
    predicate = plan.to_variant().predicate().to_bytes()
    schema = TableSchema.from_arrow(rows.schema, timestamp="ts")  # (rows: a "ts" and an "id")
    store = TableStore.open(None)
    try:
        engine = TableEngine(store)
        name = TableName.of(f"words_{next(_NAMES)}")
        await engine.create(name, schema, {"update_mode": "APPEND"})
        await engine.write([(name, rows)])
        read = TableRead(name, predicates=(decode_predicate(predicate, schema.arrow),))
        got = sorted(i for b in [b async for b in engine.read(read)] for i in b["id"].to_pylist())
    finally:
        store.close()
    return got, expected
