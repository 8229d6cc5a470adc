"""Many data streams at once: on one HTTP/2 connection they share the connection window, so
every stream must keep making progress however the window is divided between them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import numpy as np
import pyarrow as pa
import pytest
from helpers.arrow_data import StreamCase
from helpers.flight import StoreHandler, cpp_do_get, in_thread, running_server

from flightfeed.flight import FlightClient, command_descriptor

pytestmark = pytest.mark.anyio
ROWS = 400_000  # ~6.4 MB per stream: more than the 4 MiB windows


def numbers(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"a": rng.integers(0, 1 << 40, ROWS), "b": rng.standard_normal(ROWS)})


async def test_concurrent_doget_on_one_connection() -> None:
    store = StoreHandler()
    tables = {f"t{i}".encode(): numbers(i) for i in range(8)}
    for ticket, table in tables.items():
        store.add(ticket, StreamCase("t", table.schema, table.to_batches(max_chunksize=50_000)))
    results: dict[bytes, pa.Table] = {}
    async with running_server(store) as location, FlightClient(location) as client:

        async def fetch(ticket: bytes) -> None:
            results[ticket] = await client.do_get(ticket).read_all()

        async with anyio.create_task_group() as tg:
            for ticket in tables:
                tg.start_soon(fetch, ticket)
    assert results.keys() == tables.keys()
    assert all(results[t].equals(tables[t]) for t in tables)


async def test_concurrent_clients_of_both_kinds() -> None:
    store = StoreHandler()
    table = numbers(0)
    store.add(b"shared", StreamCase("s", table.schema, table.to_batches(max_chunksize=100_000)))
    got: list[pa.Table] = []
    async with running_server(store) as location:

        async def cpp() -> None:
            schema, items = await in_thread(cpp_do_get, location, b"shared")
            got.append(pa.Table.from_batches([b for b, _ in items], schema=schema))

        async def ours() -> None:
            async with FlightClient(location) as client:
                got.append(await client.do_get(b"shared").read_all())

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(cpp)
                tg.start_soon(ours)
    assert len(got) == 6
    assert all(t.equals(table) for t in got)


async def test_doput_and_doget_interleaved_on_one_connection() -> None:
    store = StoreHandler()
    down = numbers(1)
    up = numbers(2)
    store.add(b"down", StreamCase("d", down.schema, down.to_batches(max_chunksize=70_000)))

    async def upload() -> AsyncIterator[pa.RecordBatch]:
        for batch in up.to_batches(max_chunksize=70_000):
            yield batch

    async with running_server(store) as location, FlightClient(location) as client:
        fetched: list[pa.Table] = []
        acks: list[list[bytes]] = []

        async def get() -> None:
            fetched.append(await client.do_get(b"down").read_all())

        async def put() -> None:
            acks.append(await client.do_put(command_descriptor(b"up"), up.schema, upload()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(get)
            tg.start_soon(put)
            tg.start_soon(get)
    assert [t.equals(down) for t in fetched] == [True, True]
    assert len(acks[0]) == len(up.to_batches(max_chunksize=70_000))
    stored = store.streams[b"up"]
    assert pa.Table.from_batches([b for b, _ in stored.items if b is not None]).equals(up)
