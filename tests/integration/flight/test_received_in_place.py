"""Large messages are read from the socket straight into buffers of their own
(flight/message_buffer.py), over plain TCP and TLS, on both event loops: every batch arrives
intact and the client's connection says it received them in place."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pyarrow as pa
import pytest
from helpers.arrow_data import StreamCase
from helpers.certificates import Certificates, make_certificates
from helpers.flight import StoreHandler, running_server

from flightfeed.flight import FlightClient, command_descriptor
from flightfeed.flight.message_buffer import PLACEMENT_MIN
from flightfeed.flight.tls import ServerTls

pytestmark = pytest.mark.anyio
ROWS = 300_000


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    strings = pa.array([f"row {i}" for i in rng.integers(0, 1 << 30, ROWS)])
    return pa.table({"a": rng.integers(0, 1 << 40, ROWS), "s": strings})


@pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])
async def test_large_batches_are_received_in_place(secure: bool, certs: Certificates) -> None:
    data = table(1)
    batches = data.to_batches(max_chunksize=100_000)  # ~2.6 MB each, small ones too
    batches.append(data.slice(0, 10).to_batches()[0])
    store = StoreHandler()
    store.add(b"t", StreamCase("t", data.schema, batches))
    server_tls: ServerTls | None = certs.server if secure else None
    async with (
        running_server(store, tls=server_tls) as location,
        FlightClient(location, tls=certs.client if secure else None) as client,
    ):
        got = await client.do_get(b"t").read_all()
        messages, size = client.received_in_place
    assert got.equals(pa.Table.from_batches(batches))
    large = [b for b in batches if b.nbytes >= PLACEMENT_MIN]
    assert messages >= len(large)
    assert size >= sum(b.nbytes for b in large)


async def test_large_uploads_arrive_intact() -> None:
    data = table(2)
    store = StoreHandler()

    async def upload() -> AsyncIterator[pa.RecordBatch]:
        for batch in data.to_batches(max_chunksize=150_000):
            yield batch

    async with running_server(store) as location, FlightClient(location) as client:
        await client.do_put(command_descriptor(b"up"), data.schema, upload())
        got = await client.do_get(b"up").read_all()
    assert got.equals(data)
