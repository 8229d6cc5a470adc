"""TableScan: a durable table of a worker (flightfeed/tables/), read with its projection,
predicates and time range pushed into the table store.

A leaf with one output partition: the store splits the read into `parallelism` row ranges read
at once. `worker` names the worker that holds the table, so a distributed plan runs the scan
there; the task reads through the TableSource of its context (plan/table_source.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import TableScanNode
from ...errors import InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..arrow_ipc import read_ipc_schema
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr_proto import expr_from_proto, expr_to_proto
from ..table_source import TablePartition, TableReadSpec, table_source

MAX_PARALLELISM = 64
MAX_PREDICATES = 1024


class TableScan(PlanNodeBase):
    name = "TableScan"

    def __init__(
        self,
        spec: TableReadSpec,
        schema: pa.Schema,
        *,
        worker: str = "",
        partition: TablePartition | None = None,
    ) -> None:
        """`schema`: what the read returns (a source's `table_schema(spec)`). `partition`: the
        table is one partition of a partitioned table (the planner prunes by it)."""
        if not spec.table:
            raise InvalidArgument("TableScan needs a table name")
        if not 1 <= spec.parallelism <= MAX_PARALLELISM:
            raise InvalidArgument(f"TableScan parallelism must be 1 to {MAX_PARALLELISM}")
        if spec.columns and list(spec.columns) != schema.names:
            raise InvalidArgument(
                f"TableScan columns {list(spec.columns)} differ from its schema {schema.names}"
            )
        self.spec = spec
        self._schema = schema
        self.worker = worker
        self.partition = partition

    def with_spec(self, spec: TableReadSpec, schema: pa.Schema) -> TableScan:
        return TableScan(spec, schema, worker=self.worker, partition=self.partition)

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def output_partitions(self) -> int:
        return 1

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        source = table_source(ctx, self.spec)
        found = source.table_schema(self.spec)
        if not found.equals(self._schema):
            raise InvalidArgument(
                f"table {self.spec.qualified} has changed since the plan was made: it returns"
                f" {found}, the plan expects {self._schema}"
            )
        async with closing(source.read_table(self.spec)) as batches:
            async for batch in batches:
                yield batch

    def __repr__(self) -> str:
        spec = self.spec
        shown = f", columns={list(spec.columns)}" if spec.columns else ""
        if spec.predicates:
            shown += f", predicates=[{', '.join(str(p) for p in spec.predicates)}]"
        if spec.time_range is not None:
            shown += f", time_range=[{spec.time_range[0]}, {spec.time_range[1]})"
        if self.partition is not None:
            shown += f", partition={self.partition.index}/{self.partition.count}"
        shown += f", worker={self.worker}" if self.worker else ""
        return f"TableScan({spec.qualified}{shown})"


class TableScanCodec:
    kinds = (TableScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, TableScan):
            raise InvalidArgument(f"TableScanCodec cannot encode {node.name}")
        spec = node.spec
        start, end = spec.time_range if spec.time_range is not None else (None, None)
        return encode_message(
            TableScanNode(
                catalog=spec.catalog,
                schema_name=spec.schema,
                table=spec.table,
                schema=node.schema.serialize().to_pybytes(),
                columns=list(spec.columns),
                predicates=[expr_to_proto(p) for p in spec.predicates],
                start_ms=start,
                end_ms=end,
                parallelism=spec.parallelism,
                worker=node.worker,
                partition_keys=list(node.partition.keys) if node.partition else [],
                partition_index=node.partition.index if node.partition else 0,
                partition_count=node.partition.count if node.partition else 0,
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(TableScanNode, payload, kind)
        expect_children(kind, children, 0)
        if len(msg.predicates) > MAX_PREDICATES:
            raise PlanDecodeError(f"TableScan: at most {MAX_PREDICATES} predicates")
        time_range = None
        if msg.start_ms is not None or msg.end_ms is not None:
            time_range = (
                msg.start_ms if msg.start_ms is not None else -(1 << 62),
                msg.end_ms if msg.end_ms is not None else 1 << 62,
            )
        spec = TableReadSpec(
            catalog=msg.catalog,
            schema=msg.schema_name,
            table=msg.table,
            columns=tuple(msg.columns),
            predicates=tuple(expr_from_proto(p) for p in msg.predicates),
            time_range=time_range,
            parallelism=msg.parallelism or 1,
        )
        try:
            partition = None
            if msg.partition_keys or msg.partition_count:
                keys = tuple(msg.partition_keys)
                partition = TablePartition(keys, msg.partition_index, msg.partition_count)
            schema = read_ipc_schema(msg.schema, "TableScan schema")
            return TableScan(spec, schema, worker=msg.worker, partition=partition)
        except InvalidArgument as exc:
            raise PlanDecodeError(exc.message) from exc


__all__ = ["TableScan", "TableScanCodec"]
