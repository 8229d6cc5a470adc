"""One cluster for the feed tests: workers and a Coordinator that know both feed-backed leaves,
the shared UnitScan (flightfeed.testing.feeds) and the seed example's RemoteScan
(flightfeed.examples.chunk_scan). Tests import the nodes and providers from those modules."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flightfeed._generated.flightfeed.v1 import (
    SetPlanRequest,
    SetPlanRequestWorkUnitFeedDeclaration,
    TaskKey,
)
from flightfeed.coordinator import Coordinator, TaskEstimator
from flightfeed.examples.chunk_scan import RemoteScan, RemoteScanCodec, RemoteScanEstimator
from flightfeed.feeds import FeedRegistry
from flightfeed.plan import CodecRegistry, encode_plan
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing import start_cluster
from flightfeed.testing.feeds import (
    UnitProvider,
    UnitScan,
    UnitScanCodec,
    UnitScanEstimator,
    unit_scan,
)
from flightfeed.worker import Worker, WorkerConfig

ESTIMATORS: dict[str | type, TaskEstimator] = {
    RemoteScan.name: RemoteScanEstimator(),
    UnitScan: UnitScanEstimator(),
}


def feed_registry() -> FeedRegistry:
    """Where planners find both nodes' feeds (the seed's with_distributed_work_unit_feed)."""
    registry = FeedRegistry()
    registry.register(RemoteScan, lambda node: node.feed)
    registry.register(UnitScan, lambda node: node.feed)
    return registry


def feed_task(partitions: int) -> tuple[bytes, SetPlanRequest]:
    """A SetPlanRequest for a task reading a feed of `partitions` partitions (no coordinator:
    the test sends the units itself), and the feed's id."""
    node = unit_scan(UnitProvider([1] * partitions))
    codecs = CodecRegistry.builtin().with_codec(UnitScanCodec())
    request = SetPlanRequest(
        task_key=TaskKey(query_id=uuid.uuid4().bytes, stage_id=1),
        task_count=1,
        plan_proto=encode_plan(node, codecs),
        work_unit_feed_declarations=[
            SetPlanRequestWorkUnitFeedDeclaration(id=node.feed.id, partitions=partitions)
        ],
    )
    return node.feed.id, request


async def feed_session_builder(ctx: WorkerQueryContext) -> Session:
    """Workers must decode both nodes (and so their remote feeds)."""
    return ctx.builder.with_codec(RemoteScanCodec()).with_codec(UnitScanCodec()).build()


def coordinator_session() -> Session:
    return SessionStateBuilder().with_codec(RemoteScanCodec()).with_codec(UnitScanCodec()).build()


def coordinator_options(**overrides: Any) -> dict[str, Any]:
    """Coordinator arguments that plan and encode both nodes; `overrides` win."""
    options: dict[str, Any] = {
        "session": coordinator_session(),
        "feed_registry": feed_registry(),
        "task_estimators": ESTIMATORS,
    }
    return options | overrides


@asynccontextmanager
async def feed_cluster(
    workers: int = 2,
    *,
    config: WorkerConfig | None = None,
    in_process: bool = False,
    **options: Any,
) -> AsyncIterator[tuple[Coordinator, list[Worker]]]:
    """Real workers that know both nodes (over gRPC, or in this process's memory), and a
    Coordinator that distributes them."""
    async with start_cluster(
        workers,
        session_builder=feed_session_builder,
        config=config,
        in_process=in_process,
        **coordinator_options(**options),
    ) as (coordinator, found):
        yield coordinator, found
