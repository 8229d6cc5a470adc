"""The coordinator: distributed planning, task dispatch to workers, feeds, metrics.

- `Coordinator` (an async context manager): `async for batch in c.execute(plan)`;
- `DistributedPlanner` cuts plans into stages (`Stage`) at network boundaries (`NetworkCoalesce`,
  `NetworkShuffle`, `NetworkBroadcast`), sized by `TaskEstimator`s; `format_distributed_plan`
  shows the result as text, `format_distributed_plan_dot` as Graphviz DOT;
- `WorkerResolver`s list workers; `ChannelResolver` keeps one connection per worker and refuses
  workers of another version (`check_worker_version`);
- `MetricsStore` keeps per-query task and feed metrics.
"""

from __future__ import annotations

from ..plan.nodes import NetworkBroadcast, NetworkCoalesce, NetworkShuffle
from ..plan.stage_input import STAGE_READER_KEY, StageInput, StageReader
from ..protocol.resolver import ChannelResolver
from ..protocol.version import check_worker_version
from .catalog import Catalog, TableDefinition, load_catalog
from .coordinator import Coordinator, QueryStream
from .display import format_distributed_plan
from .display_dot import format_distributed_plan_dot
from .estimator import TaskEstimation, TaskEstimator, TaskEstimators
from .held import Endpoint, HeldQuery
from .metrics import FeedPartitionMetrics, MetricsStore, QueryMetrics, TaskRecord
from .parquet_estimator import ParquetScanEstimator
from .planner import PARTITION_MIXING_KINDS, DistributedPlanner, distribute
from .resolver import InProcessWorkerResolver, StaticWorkerResolver, WorkerResolver
from .service import CoordinatorService
from .stage import DistributedPlan, Stage, StageTask
from .table_query import ParsedTableQuery, parse_table_query, query_plan, table_command
from .task_runner import DispatchOptions

__all__ = [
    "PARTITION_MIXING_KINDS",
    "STAGE_READER_KEY",
    "Catalog",
    "ChannelResolver",
    "Coordinator",
    "CoordinatorService",
    "DispatchOptions",
    "DistributedPlan",
    "DistributedPlanner",
    "Endpoint",
    "FeedPartitionMetrics",
    "HeldQuery",
    "InProcessWorkerResolver",
    "MetricsStore",
    "NetworkBroadcast",
    "NetworkCoalesce",
    "NetworkShuffle",
    "ParsedTableQuery",
    "QueryMetrics",
    "QueryStream",
    "Stage",
    "StageInput",
    "StageReader",
    "StageTask",
    "StaticWorkerResolver",
    "TableDefinition",
    "TaskEstimation",
    "TaskEstimator",
    "TaskEstimators",
    "ParquetScanEstimator",
    "TaskRecord",
    "WorkerResolver",
    "check_worker_version",
    "distribute",
    "format_distributed_plan",
    "format_distributed_plan_dot",
    "load_catalog",
    "parse_table_query",
    "query_plan",
    "table_command",
]
