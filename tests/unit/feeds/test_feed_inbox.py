"""FeedInbox alone: credits, ends and errors per partition, protocol violations, failure."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from anyio.abc import TaskStatus

from flightfeed._generated.flightfeed.v1 import (
    ErrorCode,
    ErrorDetail,
    FeedCredits,
    FeedPartitionEnd,
    FeedPartitionError,
    SetPlanRequestWorkUnitFeedDeclaration,
    TaskKey,
    WorkUnitBatch,
)
from flightfeed.errors import FeedError, InvalidArgument
from flightfeed.feeds import FeedInbox, UnitRun, encode_batch
from flightfeed.feeds.inbox import MAX_FEED_WINDOW

pytestmark = pytest.mark.anyio

A = b"A" * 16
B = b"B" * 16


def units(feed: bytes, partition: int, *bodies: bytes, created: int = 1) -> WorkUnitBatch:
    run = UnitRun(feed, partition, list(bodies), [created] * len(bodies))
    return encode_batch([run], sent_ns=2)


def end(feed: bytes, partition: int) -> WorkUnitBatch:
    return WorkUnitBatch(ends=[FeedPartitionEnd(id=feed, partition=partition)])


def grants(credits: FeedCredits | None) -> dict[tuple[bytes, int], tuple[int, bool]]:
    assert credits is not None
    return {(c.id, c.partition): (c.credits, c.finished) for c in credits.credits}


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [body async for body in stream]


async def test_initial_window_is_granted_for_every_declared_partition() -> None:
    inbox = FeedInbox.from_declarations(
        [
            SetPlanRequestWorkUnitFeedDeclaration(id=A, partitions=2),
            SetPlanRequestWorkUnitFeedDeclaration(id=B, partitions=1),
        ],
        credits=8,
    )
    assert grants(await inbox.credit_grants.receive()) == {
        (A, 0): (8, False),
        (A, 1): (8, False),
        (B, 0): (8, False),
    }
    assert inbox.credit_grants.take_nowait() is None


async def test_a_presumed_window_is_granted_only_in_part_and_units_arrive_before_any_grant() -> (
    None
):
    inbox = FeedInbox([(A, 1), (B, 1)], credits=8, presumed=6)
    inbox.deliver(units(A, 0, *[b"%d" % i for i in range(8)]))  # 6 presumed + 2 granted
    assert grants(inbox.credit_grants.take_nowait()) == {(A, 0): (2, False), (B, 0): (2, False)}
    with pytest.raises(FeedError, match=r"9 units .* with only 8 credits"):
        FeedInbox([(A, 1)], credits=8, presumed=8).deliver(
            units(A, 0, *[b"%d" % i for i in range(9)])
        )
    whole = FeedInbox([(A, 1)], credits=8, presumed=8)
    assert whole.credit_grants.take_nowait() is None  # nothing left to grant up front


async def test_units_come_in_order_and_credit_returns_in_half_windows() -> None:
    inbox = FeedInbox([(A, 1)], credits=4)
    inbox.credit_grants.take_nowait()
    inbox.deliver(units(A, 0, b"u0", b"u1", b"u2"))
    inbox.deliver(units(A, 0, b"u3"))
    stream = inbox.units(A, 0)
    first = await anext(stream)
    assert (first.body, first.created_ns, first.sent_ns) == (b"u0", 1, 2)
    assert first.received_ns > 0
    assert first.processed_ns > 0
    assert inbox.credit_grants.take_nowait() is None  # one free slot: not yet half the window
    assert (await anext(stream)).body == b"u1"
    assert grants(inbox.credit_grants.take_nowait()) == {(A, 0): (2, False)}
    assert [(await anext(stream)).body for _ in range(2)] == [b"u2", b"u3"]
    inbox.deliver(end(A, 0))
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    # The last grant and the partition's finish travel together; then the stream of grants ends.
    assert grants(inbox.credit_grants.take_nowait()) == {(A, 0): (2, True)}
    assert [c async for c in inbox.credit_grants] == []
    metrics = inbox.partition_metrics(A, 0)
    assert (metrics.received, metrics.consumed, metrics.buffered) == (4, 4, 0)
    assert metrics.created_to_processed.count == 4
    assert metrics.created_to_received.count == 4
    assert inbox.to_metrics()


async def test_units_beyond_credit_are_a_protocol_violation_that_fails_the_inbox() -> None:
    inbox = FeedInbox([(A, 1)], credits=2)
    inbox.deliver(units(A, 0, b"1"))
    with pytest.raises(FeedError, match=r"2 units .* only 1 credits"):
        inbox.deliver(units(A, 0, b"2", b"3"))
    with pytest.raises(FeedError, match="protocol violation"):
        await anext(inbox.bodies(A, 0))
    with pytest.raises(FeedError):
        inbox.deliver(units(A, 0, b"again"))


@pytest.mark.parametrize(
    "batches",
    [
        [units(B, 0, b"x")],
        [units(A, 5, b"x")],
        [end(A, 3)],
        [end(A, 0), units(A, 0, b"x")],
        [end(A, 0), end(A, 0)],
        [WorkUnitBatch(ends=[FeedPartitionEnd(id=A, partition=0)] * 2)],
        [WorkUnitBatch(errors=[FeedPartitionError(id=A, partition=1)]), end(A, 1)],
    ],
    ids=[
        "undeclared-feed",
        "undeclared-partition",
        "end-undeclared",
        "units-after-end",
        "end-twice",
        "end-twice-in-one-batch",
        "end-after-error",
    ],
)
async def test_protocol_violations_raise_feed_error(batches: list[WorkUnitBatch]) -> None:
    inbox = FeedInbox([(A, 2)], credits=4)
    *accepted, violation = batches
    for batch in accepted:
        inbox.deliver(batch)
    with pytest.raises(FeedError, match="protocol violation"):
        inbox.deliver(violation)


async def test_a_partition_error_reaches_only_its_consumer_after_its_units() -> None:
    inbox = FeedInbox([(A, 2)], credits=4)
    detail = ErrorDetail(
        code=ErrorCode.EXECUTION,
        message="page 7 is gone",
        error_type="KeyError",
        worker_url="grpc://coordinator",
        task_key=TaskKey(query_id=b"q", stage_id=1, task_number=2, attempt=3),
    )
    inbox.deliver(units(A, 0, b"a"))
    inbox.deliver(units(A, 1, b"b"))
    inbox.deliver(WorkUnitBatch(errors=[FeedPartitionError(id=A, partition=0, error=detail)]))
    inbox.deliver(end(A, 1))
    stream = inbox.bodies(A, 0)
    assert await anext(stream) == b"a"
    with pytest.raises(FeedError) as info:
        await anext(stream)
    assert info.value.message == "page 7 is gone"
    assert info.value.error_type == "KeyError"
    assert info.value.origin is not None
    assert (info.value.origin.worker_url, info.value.origin.attempt) == ("grpc://coordinator", 3)
    assert await collect(inbox.bodies(A, 1)) == [b"b"]


async def test_fail_wakes_every_waiting_consumer_with_feed_error() -> None:
    inbox = FeedInbox([(A, 3)], credits=4)
    inbox.deliver(units(A, 2, b"buffered"))
    outcomes: dict[int, str] = {}

    async def consume(partition: int, *, task_status: TaskStatus[None]) -> None:
        stream = inbox.bodies(A, partition)
        task_status.started()
        try:
            async for _ in stream:
                outcomes[partition] = "unit"
        except FeedError as error:
            outcomes[partition] = error.message

    async with anyio.create_task_group() as tg:
        for partition in range(2):
            await tg.start(consume, partition)  # each is now waiting for units
        inbox.fail(ConnectionError("stream reset"))
    assert outcomes == {p: "work-unit feed channel failed: stream reset" for p in range(2)}
    with pytest.raises(FeedError, match="stream reset"):
        inbox.bodies(A, 2)  # buffered units are dropped: the task is failing
    assert [c async for c in inbox.credit_grants] == []


async def test_one_consumer_per_partition_and_only_declared_ones() -> None:
    inbox = FeedInbox([(A, 1)], credits=2)
    inbox.bodies(A, 0)
    with pytest.raises(FeedError, match="already has a consumer"):
        inbox.bodies(A, 0)
    with pytest.raises(FeedError, match="not declared"):
        inbox.bodies(A, 1)


async def test_a_consumer_that_stops_early_finishes_its_partition() -> None:
    inbox = FeedInbox([(A, 1)], credits=4)
    inbox.credit_grants.take_nowait()
    inbox.deliver(units(A, 0, b"1", b"2", b"3"))
    stream = inbox.bodies(A, 0)
    assert await anext(stream) == b"1"
    await stream.aclose()  # type: ignore[attr-defined]
    assert inbox.buffered_units == 0
    assert grants(inbox.credit_grants.take_nowait()) == {(A, 0): (0, True)}
    inbox.deliver(units(A, 0, b"late"))  # still in flight when the worker finished: dropped
    assert inbox.buffered_units == 0


@pytest.mark.parametrize(
    ("declarations", "credits"),
    [([(A, 1)], 0), ([(A, 1), (A, 2)], 4), ([(b"", 1)], 4), ([(A, 1 << 20)], 4)],
    ids=["no-credit", "duplicate", "empty-id", "too-many-partitions"],
)
def test_bad_declarations_are_invalid_arguments(
    declarations: list[tuple[bytes, int]], credits: int
) -> None:
    with pytest.raises(InvalidArgument):
        FeedInbox(declarations, credits=credits)


@pytest.mark.parametrize(("credits", "presumed"), [(4, 5), (4, -1), (MAX_FEED_WINDOW + 1, 0)])
def test_a_window_or_presumption_out_of_range_is_an_invalid_argument(
    credits: int, presumed: int
) -> None:
    with pytest.raises(InvalidArgument, match="must be in"):
        FeedInbox([(A, 1)], credits=credits, presumed=presumed)


@pytest.mark.anyio
async def test_sender_done_fails_only_unended_partitions_after_draining() -> None:
    from flightfeed._generated.flightfeed.v1 import FeedPartitionEnd, WorkUnit, WorkUnitBatch
    from flightfeed.errors import FeedError
    from flightfeed.feeds import FeedInbox

    feed = b"f" * 16
    inbox = FeedInbox([(feed, 2)], credits=8)
    inbox.deliver(
        WorkUnitBatch(
            batch=[
                WorkUnit(id=feed, partition=0, body=b"a"),
                WorkUnit(id=feed, partition=1, body=b"b"),
                WorkUnit(id=feed, partition=1, body=b"c"),
            ],
            ends=[FeedPartitionEnd(id=feed, partition=0)],
        )
    )
    inbox.sender_done()  # the coordinator half-closed: partition 1 never got its end
    assert [body async for body in inbox.bodies(feed, 0)] == [b"a"]
    received: list[bytes] = []

    async def consume() -> None:
        async for body in inbox.bodies(feed, 1):
            received.append(body)  # noqa: PERF401 - keep what arrived before the error

    with pytest.raises(FeedError, match="closed the channel before the feed ended"):
        await consume()
    assert received == [b"b", b"c"]  # buffered units drained first
