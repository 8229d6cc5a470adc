"""MessageBuffer: a call's received gRPC messages, large ones received into buffers of their own.

A run of gRPC messages is cut at arbitrary points and added the two ways a connection adds
data: copied (`add` of the bytes) and, where the buffer offers a region (`claim`), received in
place (the bytes written into the region, then `add` of a view of it). Whatever the cuts, the
reader gets every message back, a placed one as a view of its own buffer (no copy), every
flow-controlled byte is acknowledged exactly once, and the budget holds nothing at the end.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.flight.message_buffer import GRPC_PREFIX_SIZE, MessageBuffer, PlacementBudget

MIN = 64
MAX = 4096


def framed(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


@dataclass
class Acks:
    total: int = 0
    calls: list[int] = field(default_factory=list)

    def __call__(self, size: int) -> None:
        self.total += size
        self.calls.append(size)


def feed(buffer: MessageBuffer, data: bytes, cuts: list[int], in_place: bool) -> int:
    """Adds `data` cut at `cuts` (each piece one DATA payload, acknowledged as its length + 1
    of padding); with `in_place`, whatever the buffer claims is received in place. Returns the
    flow-controlled bytes added."""
    acked = 0
    pos = 0
    for end in [*sorted(set(cuts)), len(data)]:
        while pos < end:
            region = buffer.claim(end - pos) if in_place else None
            if region is not None:
                n = len(region)
                region[:] = data[pos : pos + n]
                buffer.add(region, n + 1)
            else:
                n = end - pos
                buffer.add(data[pos:end], n + 1)
            acked += n + 1
            pos += n
    return acked


async def read_all(buffer: MessageBuffer, count: int) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    for _ in range(count):
        prefix = await buffer.read_view(GRPC_PREFIX_SIZE)
        (length,) = struct.unpack(">I", bytes(prefix)[1:])
        out.append(await buffer.read_view(length) if length else b"")
    return out


messages_strategy = st.lists(
    st.one_of(
        st.binary(max_size=MIN - 1),
        st.integers(MIN, MAX + 64).map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256)),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(messages=messages_strategy, data=st.data(), in_place=st.booleans())
def test_every_message_comes_back_whatever_the_cuts(
    messages: list[bytes], data: st.DataObject, in_place: bool
) -> None:
    stream = b"".join(framed(m) for m in messages)
    cuts = data.draw(st.lists(st.integers(0, max(len(stream), 1)), max_size=12))
    budget = PlacementBudget(limit=2 * MAX, min_size=MIN, max_size=MAX)
    acks = Acks()

    async def main() -> list[bytes | memoryview]:
        buffer = MessageBuffer(acks, budget)
        added = feed(buffer, stream, cuts, in_place)
        buffer.eof()
        got = await read_all(buffer, len(messages))
        assert await buffer.read_view(GRPC_PREFIX_SIZE) == b""  # then the end
        assert acks.total == added
        return got

    got = asyncio.run(main())
    assert [bytes(g) for g in got] == messages
    placed = [m for m in messages if MIN <= len(m) <= MAX]
    for message, received in zip(messages, got, strict=True):
        if MIN <= len(message) <= MAX:  # its own buffer, exactly its size, handed over as is
            assert isinstance(received, memoryview)
            assert isinstance(received.obj, pa.Buffer)
            assert received.obj.size == len(message)
        else:
            assert isinstance(received, bytes)
    assert budget.held == 0
    assert budget.placed_messages == len(placed)
    assert budget.placed_bytes == sum(len(m) for m in placed)


def test_a_claim_is_the_rest_of_the_message_and_no_more() -> None:
    async def main() -> None:
        budget = PlacementBudget(min_size=MIN, max_size=MAX)
        buffer = MessageBuffer(Acks(), budget)
        assert buffer.claim(1000) is None  # no message yet
        assert buffer.prefix_read(MIN) == GRPC_PREFIX_SIZE
        assert buffer.prefix_read(MIN - 1) == 0  # a payload too small to hold a placed one
        buffer.add(framed(b"x" * 100)[:7], 7)  # the prefix and 2 bytes of the message
        assert buffer.placing
        assert buffer.prefix_read(MIN) == 0
        region = buffer.claim(1000)
        assert region is not None
        assert len(region) == 98
        assert len(buffer.claim(10) or b"") == 10
        region[:] = b"y" * 98
        buffer.add(region, 98)
        assert not buffer.placing
        assert buffer.claim(1000) is None
        assert bytes(await buffer.read_view(5)) == framed(b"")[:1] + struct.pack(">I", 100)
        assert bytes(await buffer.read_view(100)) == b"xx" + b"y" * 98

    asyncio.run(main())


def test_past_the_budget_messages_come_in_pieces_and_the_budget_is_given_back() -> None:
    async def main() -> None:
        budget = PlacementBudget(limit=150, min_size=MIN, max_size=MAX)
        first, second = MessageBuffer(Acks(), budget), MessageBuffer(Acks(), budget)
        first.add(framed(b"a" * 100)[:5], 5)  # declared, not sent: 100 held
        assert first.placing
        assert budget.held == 100
        second.add(framed(b"b" * 100)[:5], 5)  # 200 would pass the limit
        assert not second.placing
        assert second.claim(100) is None
        second.add(b"b" * 100, 100)
        await second.read_view(5)
        received = await second.read_view(100)
        assert isinstance(received, bytes)
        assert received == b"b" * 100
        first.close()  # the call ended: nothing is held for it any more
        assert budget.held == 0
        assert budget.placed_messages == 0

    asyncio.run(main())


@pytest.mark.parametrize("in_place", [False, True])
def test_a_message_cut_short_by_the_end_of_the_stream_is_an_error(in_place: bool) -> None:
    async def main() -> None:
        budget = PlacementBudget(min_size=MIN, max_size=MAX)
        buffer = MessageBuffer(Acks(), budget)
        feed(buffer, framed(b"z" * 1000)[:600], [100, 300], in_place)
        buffer.eof()
        assert budget.held == 0
        await buffer.read_view(5)
        with pytest.raises(AssertionError):  # what recv_raw reports as a truncated message
            await buffer.read_view(1000)

    asyncio.run(main())


def test_unread_data_is_acknowledged_when_the_call_closes() -> None:
    async def main() -> None:
        acks = Acks()
        buffer = MessageBuffer(acks, PlacementBudget(min_size=MIN, max_size=MAX))
        added = feed(buffer, framed(b"q" * 500) + framed(b"r"), [3, 200], in_place=True)
        await buffer.read_view(5)  # takes (and acknowledges) only the first payload
        assert acks.total + buffer.unacked_size() == added

    asyncio.run(main())


def test_read_gives_bytes_for_grpclib() -> None:
    async def main() -> None:
        buffer = MessageBuffer(Acks(), PlacementBudget(min_size=MIN, max_size=MAX))
        feed(buffer, framed(b"p" * 300), [], in_place=True)
        assert await buffer.read(5) == framed(b"")[:1] + struct.pack(">I", 300)
        received = await buffer.read(300)
        assert type(received) is bytes
        assert received == b"p" * 300

    asyncio.run(main())
