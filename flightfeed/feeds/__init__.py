"""Work-unit feeds: work discovered on the coordinator at runtime, streamed to workers.

- `WorkUnitFeedProvider` (user code, coordinator only) and the `WorkUnitFeed` handle nodes store;
- `FeedRegistry`: how planners find the feeds inside user nodes;
- `FeedDispatcher` (coordinator, one per task channel) and `FeedInbox` (worker, one per task):
  transport-agnostic ends of the credit-controlled stream, wired to CoordinatorChannel;
- `codec`: the packed WorkUnitBatch wire form.
"""

from __future__ import annotations

from .codec import DecodedBatch, DecodedRun, UnitRun, decode_batch, encode_batch
from .dispatcher import (
    DEFAULT_DELIVERY_LOG_BYTES,
    DEFAULT_DELIVERY_LOG_LIMIT,
    DEFAULT_LINGER_SECONDS,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_UNITS,
    FeedAssignment,
    FeedDispatcher,
    PartitionSendMetrics,
)
from .handle import FEED_INBOX_KEY, WorkUnitFeed
from .inbox import (
    DEFAULT_CREDITS,
    CreditGrants,
    FeedInbox,
    PartitionFeedMetrics,
    ReceivedUnit,
)
from .latency import LatencyHistogram, Percentiles
from .provider import WorkUnitFeedProvider
from .registry import FeedRegistry

__all__ = [
    "DEFAULT_DELIVERY_LOG_BYTES",
    "DEFAULT_DELIVERY_LOG_LIMIT",
    "DEFAULT_CREDITS",
    "DEFAULT_LINGER_SECONDS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BATCH_UNITS",
    "FEED_INBOX_KEY",
    "CreditGrants",
    "DecodedBatch",
    "DecodedRun",
    "FeedAssignment",
    "FeedDispatcher",
    "FeedInbox",
    "FeedRegistry",
    "LatencyHistogram",
    "PartitionFeedMetrics",
    "PartitionSendMetrics",
    "Percentiles",
    "ReceivedUnit",
    "UnitRun",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "decode_batch",
    "encode_batch",
]
