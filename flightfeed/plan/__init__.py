"""The plan layer: ExecutionPlan, built-in nodes over Arrow C++, expressions and codecs."""

from __future__ import annotations

from .aggregate import AggregateExpr, agg
from .base import (
    ExecutionPlan,
    PlanNodeBase,
    TaskContext,
    UnaryNode,
    check_partition,
    closing,
    pre_order,
)
from .codec import (
    CodecRegistry,
    DecodeContext,
    PlanCodec,
    decode_plan,
    encode_plan,
    parse_payload,
)
from .display import format_plan
from .execution import collect, collect_partition, open_task_context
from .expr import Call, Column, Expr, Literal, call, col, evaluate, lit, output_type
from .expr_proto import expr_from_proto, expr_to_proto
from .functions import (
    BUILTINS,
    AggregateUdf,
    FunctionRegistry,
    PlanSession,
    ScalarUdf,
)
from .hash_partition import hash_partition, hash_rows, partition_ids
from .metrics import (
    Instrumented,
    MetricsRegistry,
    NodeMetrics,
    PartitionMetrics,
    instrument,
    metrics_to_proto,
    plan_metrics,
    unwrap,
)
from .nodes import (
    AggregateMode,
    Coalesce,
    Filter,
    HashAggregate,
    HashJoin,
    Limit,
    MemoryScan,
    Projection,
    Repartition,
    Sort,
    SortKey,
    Union,
)
from .partitioning import Partitioning, decode_partitioning, encode_partitioning

__all__ = [
    "BUILTINS",
    "AggregateExpr",
    "AggregateMode",
    "AggregateUdf",
    "Call",
    "Coalesce",
    "CodecRegistry",
    "Column",
    "DecodeContext",
    "ExecutionPlan",
    "Expr",
    "Filter",
    "FunctionRegistry",
    "HashAggregate",
    "HashJoin",
    "Instrumented",
    "Limit",
    "Literal",
    "MemoryScan",
    "MetricsRegistry",
    "NodeMetrics",
    "PartitionMetrics",
    "Partitioning",
    "PlanCodec",
    "PlanNodeBase",
    "PlanSession",
    "Projection",
    "Repartition",
    "ScalarUdf",
    "Sort",
    "SortKey",
    "TaskContext",
    "UnaryNode",
    "Union",
    "agg",
    "call",
    "check_partition",
    "closing",
    "col",
    "collect",
    "collect_partition",
    "decode_partitioning",
    "decode_plan",
    "encode_partitioning",
    "encode_plan",
    "evaluate",
    "expr_from_proto",
    "expr_to_proto",
    "format_plan",
    "hash_partition",
    "hash_rows",
    "instrument",
    "lit",
    "metrics_to_proto",
    "open_task_context",
    "output_type",
    "parse_payload",
    "partition_ids",
    "plan_metrics",
    "pre_order",
    "unwrap",
]
