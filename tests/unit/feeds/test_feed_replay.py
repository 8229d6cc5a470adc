"""Replayable inboxes: a partition read again yields the very same units, in the same order,
whatever the earlier reader did (finished, or left early mid-run), within the replay limit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import FeedError
from flightfeed.feeds import FeedInbox, UnitRun, encode_batch
from flightfeed.protocol import FeedCredits, FeedPartitionEnd, WorkUnitBatch

pytestmark = pytest.mark.anyio

A = b"A" * 16


def units(*bodies: bytes) -> WorkUnitBatch:
    return encode_batch([UnitRun(A, 0, list(bodies), [1] * len(bodies))], sent_ns=2)


def end() -> WorkUnitBatch:
    return WorkUnitBatch(ends=[FeedPartitionEnd(id=A, partition=0)])


def granted(inbox: FeedInbox) -> list[tuple[int, bool]]:
    """Every grant waiting to go to the coordinator: (credits, finished)."""
    taken: FeedCredits | None = inbox.credit_grants.take_nowait()
    return [] if taken is None else [(c.credits, c.finished) for c in taken.credits]


async def read(inbox: FeedInbox, limit: int | None = None) -> list[bytes]:
    out: list[bytes] = []
    stream: AsyncIterator[bytes] = inbox.bodies(A, 0)
    async for body in stream:
        out.append(body)
        if limit is not None and len(out) == limit:
            await stream.aclose()  # type: ignore[attr-defined]
            break
    return out


async def test_a_finished_partition_reads_again_the_same_without_new_credit() -> None:
    inbox = FeedInbox([(A, 1)], credits=8, replay_limit=100)
    assert granted(inbox) == [(8, False)]
    inbox.deliver(units(b"a", b"b", b"c"))
    inbox.deliver(end())
    assert await read(inbox) == [b"a", b"b", b"c"]
    assert granted(inbox) == [(0, True)]  # read to its end: the provider may stop
    assert await read(inbox) == [b"a", b"b", b"c"]
    assert await read(inbox) == [b"a", b"b", b"c"]
    assert granted(inbox) == []  # a replay grants nothing: those units were paid for


async def test_a_reader_that_leaves_early_leaves_the_rest_for_the_next() -> None:
    inbox = FeedInbox([(A, 1)], credits=16, replay_limit=100)
    granted(inbox)
    inbox.deliver(units(b"a", b"b", b"c", b"d"))  # one run: the reader leaves inside it
    assert await read(inbox, limit=2) == [b"a", b"b"]
    assert [finished for _, finished in granted(inbox)] in ([], [False])  # not ended
    inbox.deliver(units(b"e"))
    inbox.deliver(end())
    assert await read(inbox) == [b"a", b"b", b"c", b"d", b"e"]


async def test_a_concurrent_second_read_is_refused_clearly() -> None:
    inbox = FeedInbox([(A, 1)], credits=4, replay_limit=100)
    first = inbox.bodies(A, 0)
    with pytest.raises(FeedError, match="is being read"):
        inbox.bodies(A, 0)
    await first.aclose()  # type: ignore[attr-defined]


async def test_past_the_replay_limit_a_partition_cannot_be_read_again() -> None:
    inbox = FeedInbox([(A, 1)], credits=8, replay_limit=2)
    inbox.deliver(units(b"a", b"b", b"c"))
    inbox.deliver(end())
    assert await read(inbox) == [b"a", b"b", b"c"]  # the first read is unaffected
    with pytest.raises(FeedError, match="past the replay limit"):
        inbox.bodies(A, 0)


@settings(max_examples=50)
@given(
    runs=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    stops=st.lists(st.integers(0, 20), max_size=4),
)
async def test_any_sequence_of_early_exits_reads_the_same_units(
    runs: list[int], stops: list[int]
) -> None:
    inbox = FeedInbox([(A, 1)], credits=64, replay_limit=1000)
    expected: list[bytes] = []
    for n, size in enumerate(runs):
        bodies = [f"{n}.{i}".encode() for i in range(size)]
        expected += bodies
        inbox.deliver(units(*bodies))
    inbox.deliver(end())
    for stop in stops:
        got = await read(inbox, limit=stop or None)
        assert got == expected[: len(got)]
    assert await read(inbox) == expected
