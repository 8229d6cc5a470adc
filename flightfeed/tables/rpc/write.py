"""Write and WriteBatch: row groups (an ArrowPayload, or HoraeDB's contiguous rows) into
tables, one transaction per request.

A WriteBatch commits every row of every request in it, or none (HoraeDB stops at the first
failing table and keeps what it wrote before); the header names the request and table that
failed. Rows decode and validate on a worker thread, all of a call's within the worker's decode
limit (decode_budget.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

import anyio
import pyarrow as pa

from ..._generated.common import ResponseHeader
from ..._generated.remote_engine import WriteRequest, WriteResponse
from ...errors import FlightfeedError, InvalidArgument, ResourceExhausted
from ..contiguous import decode_contiguous_rows
from ..decode_budget import DecodeBudget
from ..engine import TableEngine
from ..headers import OK_HEADER, error_header
from ..payload import declared_bytes, decode_payload
from ..requests import table_name
from ..schema import TableSchema
from ..store import TableName, TableWriteError, WriteFailure, write_error

MAX_REQUESTS_PER_BATCH: Final = 4096


def decode_rows(
    request: WriteRequest, budget: DecodeBudget, schema: Callable[[], TableSchema]
) -> pa.Table:
    """A request's rows as one table, decoded within `budget` (the call's). `schema`: the
    table's, which contiguous rows (what a HoraeDB node sends) are encoded for."""
    group = request.row_group
    if group is None:
        raise InvalidArgument("the write has no row group")
    if group.contiguous is not None:
        return decode_contiguous_rows(group.contiguous, schema(), budget=budget)
    if group.arrow is None:
        raise InvalidArgument("the row group has no rows")
    batches = decode_payload(group.arrow, budget=budget)
    if not batches:
        raise InvalidArgument("the row group's payload holds no record batch")
    try:
        return pa.Table.from_batches(batches)
    except pa.ArrowInvalid as exc:
        raise InvalidArgument(f"the row group's batches differ in schema: {exc}") from exc


def _decode_all(
    engine: TableEngine, requests: Sequence[WriteRequest], max_decoded_bytes: int
) -> list[tuple[TableName, pa.Table]]:
    budget = DecodeBudget(max_decoded_bytes)  # (one for the whole call)
    declared = sum(
        declared_bytes(r.row_group.arrow) for r in requests if r.row_group and r.row_group.arrow
    )
    if declared > budget.limit:  # (before decompressing any of it)
        raise ResourceExhausted(
            f"the write's zstd payload elements declare {declared} bytes in all, over the"
            f" worker's limit of {budget.limit} bytes for one write: send less per write"
        )
    decoded = []
    for index, request in enumerate(requests):
        try:
            name = table_name(request.table)
        except InvalidArgument as exc:
            raise TableWriteError(
                f"request {index}: {exc.message}", WriteFailure(index, ""), exc
            ) from exc
        try:
            schema = partial(_schema, engine, name)
            decoded.append((name, decode_rows(request, budget, schema)))
        except FlightfeedError as exc:
            raise write_error(index, name, exc, len(requests)) from exc
    return decoded


def _schema(engine: TableEngine, name: TableName) -> TableSchema:
    return engine.entry(name).schema


def _check_count(requests: Sequence[WriteRequest]) -> None:
    if len(requests) > MAX_REQUESTS_PER_BATCH:
        raise InvalidArgument(
            f"a WriteBatch holds at most {MAX_REQUESTS_PER_BATCH} requests, got {len(requests)}"
        )


async def write(
    engine: TableEngine, requests: Sequence[WriteRequest], max_decoded_bytes: int
) -> WriteResponse:
    """All rows or none; the response says how many, or why not."""
    what = "Write" if len(requests) == 1 else "WriteBatch"
    try:
        _check_count(requests)
        if not requests:
            return WriteResponse(header=OK_HEADER, affected_rows=0)
        decoded = await anyio.to_thread.run_sync(_decode_all, engine, requests, max_decoded_bytes)
        await engine.write(decoded)
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        header: ResponseHeader = error_header(exc, what)
        return WriteResponse(header=header)
    # The rows the request carried, as HoraeDB counts them: in OVERWRITE mode a key written
    # twice is one row stored and two written.
    return WriteResponse(header=OK_HEADER, affected_rows=sum(rows.num_rows for _, rows in decoded))


__all__ = ["MAX_REQUESTS_PER_BATCH", "decode_rows", "write"]
