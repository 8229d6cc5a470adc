"""WorkUnitFeed handles (local and remote), their proto form, and finding feeds in plans."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa
import pytest

from flightfeed._generated.flightfeed.v1 import Label, WorkUnitFeedProto
from flightfeed.errors import FeedError, InvalidArgument
from flightfeed.feeds import FEED_INBOX_KEY, FeedInbox, FeedRegistry, WorkUnitFeed
from flightfeed.plan import Coalesce, ExecutionPlan, MetricsRegistry, PlanNodeBase, instrument
from flightfeed.plan.base import TaskContext, expect_children
from flightfeed.testing.feeds import UnitProvider, UnitScan

from .harness import task_context

SCHEMA = pa.schema([("n", pa.int64())])


class Pair(PlanNodeBase):
    name = "Pair"

    def __init__(self, left: ExecutionPlan, right: ExecutionPlan) -> None:
        self._children = (left, right)

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    @property
    def output_partitions(self) -> int:
        return 1

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return self._children

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 2)
        return Pair(children[0], children[1])

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        for child in self._children:
            async for batch in child.execute(partition, ctx):
                yield batch


def test_a_new_feed_is_local_and_its_proto_form_is_only_the_id() -> None:
    provider = UnitProvider(units=[[b"a"]])
    feed = WorkUnitFeed.new(provider)
    other = WorkUnitFeed.new(provider)
    assert len(feed.id) == 16
    assert feed.id != other.id
    assert feed.inner() is provider
    assert feed.try_inner() is provider
    assert not feed.is_remote
    proto = WorkUnitFeedProto.parse(bytes(feed.to_proto()))
    remote = WorkUnitFeed.from_proto(proto, bytes)
    assert remote == feed
    assert remote.is_remote
    assert remote.inner() is None
    with pytest.raises(FeedError, match="remote"):
        remote.try_inner()
    with pytest.raises(InvalidArgument, match="16 UUID bytes"):
        WorkUnitFeed.from_proto(WorkUnitFeedProto(id=b"short"), bytes)
    with pytest.raises(TypeError):
        WorkUnitFeed(feed.id, int)


@pytest.mark.anyio
async def test_a_remote_feed_reads_the_task_inbox_and_fails_without_one() -> None:
    remote = WorkUnitFeed.from_proto(WorkUnitFeedProto(id=b"F" * 16), Label)
    with pytest.raises(FeedError, match="no feed inbox"):
        remote.feed(0, task_context())
    inbox = FeedInbox([(remote.id, 1)], credits=2)
    ctx = task_context()
    ctx.extensions[FEED_INBOX_KEY] = inbox
    stream = remote.feed(0, ctx)
    with pytest.raises(FeedError, match="already has a consumer"):
        remote.feed(0, ctx)
    inbox.fail(FeedError("gone"))
    with pytest.raises(FeedError, match="gone"):
        await anext(stream)


@pytest.mark.anyio
async def test_a_local_feed_decodes_pre_encoded_units() -> None:
    provider = UnitProvider(units=[[Label(name="a"), bytes(Label(name="b"))]], unit_type=Label)
    feed = WorkUnitFeed.new(provider)
    assert [u.name async for u in feed.feed(0, task_context())] == ["a", "b"]


def test_the_registry_finds_feeds_through_wrappers_in_pre_order() -> None:
    first = WorkUnitFeed.new(UnitProvider(units=[[]]))
    second = WorkUnitFeed.new(UnitProvider(units=[[]]))
    unread = WorkUnitFeed.new(UnitProvider(units=[[]]))
    left, right, middle = UnitScan(first, 1), UnitScan(second, 1), UnitScan(unread, 1, every=0)
    plan = instrument(Coalesce(Pair(left, Pair(middle, right))), MetricsRegistry())
    registry = FeedRegistry()
    assert registry.feeds_in(plan) == []
    # A getter may say a node has no feed (here: the counting scans).
    registry.register(UnitScan, lambda node: node.feed if node.every else None)
    assert registry.feeds_in(plan) == [(left, first), (right, second)]
    with pytest.raises(InvalidArgument, match="already"):
        registry.register(UnitScan, lambda node: None)
    registry.register(UnitScan, lambda node: None, replace=True)
    assert registry.feeds_in(plan) == []
