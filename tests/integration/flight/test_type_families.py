"""Every Arrow type family through real Flight calls, in both directions and with both clients.

Each family case is a stream of several batches: one with nulls, a slice (offset != 0) and
one with nulls everywhere, each with its own app_metadata; plus dictionaries replaced and
extended between batches, extension types, zero-column and zero-row batches, schema-only
streams, metadata on schema and fields, and one batch larger than 16 MiB.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from helpers.arrow_data import (
    StreamCase,
    assert_stream_equal,
    family_cases,
    ids,
    large_batch_case,
)
from helpers.flight import (
    Received,
    StoreHandler,
    cpp_client,
    cpp_read,
    doget_both_clients,
    doput_both_clients,
    in_thread,
    running_server,
)

from flightfeed.flight import FlightClient, command_descriptor

pytestmark = pytest.mark.anyio
CASES = family_cases()
LARGE = large_batch_case()


def cpp_exchange(location: str, case: StreamCase) -> tuple[pa.Schema, Received]:
    """Send the whole case through an echoing DoExchange, then read every reply."""
    with cpp_client(location) as client:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(b"echo"))
        writer.begin(case.schema, options=case.options)
        for batch, metadata in zip(case.batches, case.metadata, strict=True):
            if metadata is None:
                writer.write_batch(batch)
            else:
                writer.write_with_metadata(batch, pa.py_buffer(metadata))
        writer.done_writing()
        result = cpp_read(reader)
        writer.close()
    return result


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
async def test_doget_cpp_and_flightfeed_clients(case: StreamCase) -> None:
    await doget_both_clients(case)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
async def test_doput_cpp_and_flightfeed_clients(case: StreamCase) -> None:
    await doput_both_clients(case)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
async def test_doexchange_echo_cpp_client(case: StreamCase) -> None:
    async with running_server(StoreHandler()) as location:
        schema, received = await in_thread(cpp_exchange, location, case)
    assert_stream_equal(case, schema, received)


async def test_doexchange_echo_flightfeed_client() -> None:
    """Every family case through one flightfeed-client DoExchange each, on one connection."""
    async with running_server(StoreHandler()) as location, FlightClient(location) as client:
        for case in CASES:
            async with client.do_exchange(command_descriptor(case.name.encode())) as (
                writer,
                reader,
                done_writing,
            ):
                await writer.begin(case.schema, options=case.options)
                received: list[Any] = []
                for batch, metadata in zip(case.batches, case.metadata, strict=True):
                    await writer.write(batch, metadata)
                    received.append(await reader.next())
                await done_writing()
                assert await reader.next() is None
            assert reader.schema is not None
            assert_stream_equal(case, reader.schema, received)


async def test_large_batch_doget() -> None:
    await doget_both_clients(LARGE)


async def test_large_batch_doput() -> None:
    await doput_both_clients(LARGE)


@pytest.mark.parametrize(
    ("name", "deltas", "replaced"),
    [("dictionary_delta", True, False), ("dictionary_replacement", False, True)],
)
async def test_dictionary_messages_on_the_wire(name: str, deltas: bool, replaced: bool) -> None:
    """Deltas stay deltas (with emit_dictionary_deltas), replacements stay replacements, and
    pyarrow's client reassembles the dictionaries from them."""
    case = next(c for c in CASES if c.name == name)
    store = StoreHandler()
    store.add(b"d", case)
    async with running_server(store) as location:

        def read_stats() -> Any:
            with cpp_client(location) as client:
                reader = client.do_get(fl.Ticket(b"d"))
                reader.read_all()
                return reader.stats

        stats = await in_thread(read_stats)
    assert (stats.num_dictionary_deltas > 0) is deltas
    assert (stats.num_replaced_dictionaries > 0) is replaced
