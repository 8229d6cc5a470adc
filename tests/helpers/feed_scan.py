"""Feed-backed plans for the tests: the shared UnitScan (flightfeed.testing.feeds) and the
seed's work_unit_feed example (flightfeed.examples.chunk_scan), wired into one cluster.

- `scan(task_count, '3,1', '2', ...)` builds the seed's RemoteScan: a ChunkFeedProvider
  "discovers" chunks of n rows per partition; the node turns each chunk into n rows.
- `unit_scan(UnitProvider(...), probe=...)` reads raw units; a `probe` gates, slows down and
  observes its consumers on the workers (which run in the test's process).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flightfeed.coordinator import Coordinator, TaskEstimator
from flightfeed.examples.chunk_scan import (  # the seed example lives in the package
    SCAN_SCHEMA,
    Chunk,
    ChunkFeedProvider,
    RemoteScan,
    RemoteScanCodec,
    RemoteScanEstimator,
    parse_chunks,
    scan,
    scan_rows,
)
from flightfeed.feeds import FeedRegistry
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing import start_cluster
from flightfeed.testing.feeds import (
    COUNT_AT_END,
    Probe,
    UnitProvider,
    UnitScan,
    UnitScanCodec,
    UnitScanEstimator,
    Waiters,
    probe,
    unit_scan,
)
from flightfeed.worker import Worker, WorkerConfig

__all__ = [
    "COUNT_AT_END",
    "ESTIMATORS",
    "SCAN_SCHEMA",
    "Chunk",
    "ChunkFeedProvider",
    "Probe",
    "RemoteScan",
    "RemoteScanCodec",
    "RemoteScanEstimator",
    "UnitProvider",
    "UnitScan",
    "UnitScanCodec",
    "UnitScanEstimator",
    "Waiters",
    "coordinator_options",
    "feed_cluster",
    "feed_registry",
    "feed_session_builder",
    "parse_chunks",
    "probe",
    "scan",
    "scan_rows",
    "unit_scan",
]


def feed_registry() -> FeedRegistry:
    """Where planners find both nodes' feeds (the seed's with_distributed_work_unit_feed)."""
    registry = FeedRegistry()
    registry.register(RemoteScan, lambda node: node.feed)
    registry.register(UnitScan, lambda node: node.feed)
    return registry


ESTIMATORS: dict[str | type, TaskEstimator] = {
    RemoteScan.name: RemoteScanEstimator(),
    UnitScan: UnitScanEstimator(),
}


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
    workers: int = 2, *, config: WorkerConfig | None = None, **options: Any
) -> AsyncIterator[tuple[Coordinator, list[Worker]]]:
    """Real workers that know both nodes, and a Coordinator that distributes them."""
    async with start_cluster(
        workers,
        session_builder=feed_session_builder,
        config=config,
        **coordinator_options(**options),
    ) as (coordinator, found):
        yield coordinator, found
