"""A worker stopped gracefully (SIGTERM) lets the table writes and reads under way end, and
refuses new ones, saying it is shutting down, over real gRPC with pyarrow's C++ client.
Before, it waited for its tasks only and exited at once: a DoPut one batch from its end
failed with "Socket closed", and a client had to write it again elsewhere."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers.worker_process import start_worker, worker_process

from flightfeed._generated.flightfeed.v1 import (
    CreateTable,
    GetWorkerInfoRequest,
    TableRef,
    WorkerServiceStub,
)
from flightfeed.flight.grpc import GrpcChannel
from flightfeed.tables.schema import TableSchema
from flightfeed.worker.state import TABLES_SHUTTING_DOWN

ROWS = pa.table(
    {"ts": pa.array(range(1_000), pa.timestamp("ms")), "v": pa.array(range(1_000), pa.int64())}
)


def worker_info(location: str) -> tuple[int, bool]:
    """(calls running, draining) as the worker's GetWorkerInfo says."""

    async def ask() -> tuple[int, bool]:
        host, port = location.removeprefix("grpc://").split(":")
        channel = GrpcChannel(host, int(port))
        try:
            reply = await WorkerServiceStub(channel).get_worker_info(GetWorkerInfoRequest())
            return reply.calls, reply.draining
        finally:
            channel.close()

    return anyio.run(ask)


def until(check: Callable[[], object], what: str) -> None:
    """Ask the worker process again until `check()` holds (another process: nothing to await)."""
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"the worker never got to {what}"
        time.sleep(0.02)


def put(client: flight.FlightClient, name: str, table: pa.Table) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(name), table.schema)
    writer.write_table(table)
    writer.done_writing()
    reader.read()
    writer.close()


def test_a_write_under_way_ends_and_new_ones_are_refused(tmp_path: Path) -> None:
    data = str(tmp_path)
    proc, location = start_worker("--data-dir", data, "--shutdown-grace", "60")
    try:
        with flight.connect(location) as client:
            create = flight.Action("create_table", _create_table_body("kept"))
            list(client.do_action(create))
            writer, reader = client.do_put(flight.FlightDescriptor.for_path("kept"), ROWS.schema)
            writer.write_table(ROWS.slice(0, 500))
            until(lambda: worker_info(location)[0] >= 2, "the write")  # (it and this call)
            proc.send_signal(signal.SIGTERM)
            until(lambda: worker_info(location)[1], "its drain")
            with (
                flight.connect(location) as late,
                pytest.raises(flight.FlightUnavailableError, match=TABLES_SHUTTING_DOWN),
            ):
                put(late, "kept", ROWS)
            writer.write_table(ROWS.slice(500))
            writer.done_writing()
            reader.read()
            writer.close()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "flightfeed worker stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with worker_process("--data-dir", data) as (_, again), flight.connect(again) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("kept"))
        read = pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)
    assert read.sort_by("v").to_pylist() == ROWS.to_pylist()


def _create_table_body(name: str) -> bytes:
    schema = TableSchema.from_arrow(ROWS.schema, timestamp="ts")
    table = TableRef(table=name)
    options = {"update_mode": "APPEND"}
    return bytes(CreateTable(table=table, table_schema=schema.to_proto(), options=options))
