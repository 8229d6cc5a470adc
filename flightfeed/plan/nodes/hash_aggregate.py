"""HashAggregate: grouped aggregation on Acero's hash group-by, in SINGLE, PARTIAL or FINAL mode.

PARTIAL emits mergeable states (columns `name[label]`, one row per group per partition) that a
FINAL over a Coalesce or a Repartition by the group keys merges and finishes; SINGLE does both
in one node. Like every node it keeps its input's partitioning: each partition is aggregated on
its own, so SINGLE needs one input partition or an input partitioned by the keys. Build PARTIAL
and FINAL with the same keys and aggregates.

Incoming batches are coalesced up to COALESCE_ROWS rows (or COALESCE_BYTES) and each run is
reduced to states in one Acero call, as DataFusion's CoalesceBatchesExec feeds its aggregates:
one Acero call costs more than aggregating a hundred rows, and feeds deliver a batch per work
unit (a partition of 20 units of 100 rows took 22 calls, now one). States are re-merged every
few runs, so memory is bounded by the groups and one run, not by the rows; a single state of a
type-preserving merge needs no merge at all.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial

import pyarrow as pa

from ..._generated.flightfeed.v1 import AggregateExpr as AggregateExprProto
from ..._generated.flightfeed.v1 import AggregateMode as AggregateModeProto
from ..._generated.flightfeed.v1 import HashAggregateNode
from ...errors import FlightfeedError, InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..aggregate import (
    AggregateExpr,
    BuiltinAggregate,
    ResolvedAggregate,
    resolve_aggregate,
    state_names,
)
from ..aggregate_kernel import BuiltinOp, GroupedOp, Op, conform, group_aggregate
from ..base import (
    ExecutionPlan,
    TaskContext,
    UnaryNode,
    closing,
    expect_children,
)
from ..codec import DecodeContext, decode_enum, parse_payload
from ..distribution import Distribution, HashPartitioned, SinglePartition, output_hash_keys
from ..expr import Column, Expr, calls_udf, evaluate, output_type
from ..expr_proto import expr_from_proto, expr_to_proto, named_from_proto, named_to_proto
from ..functions import BUILTINS, FunctionRegistry
from ..memory import MemoryReservation, batch_nbytes
from ..offload import run_compute

MERGE_EVERY_BATCHES = 16
"""States kept before they are merged into one (each is at most the groups of one run)."""
OUTPUT_BATCH_ROWS = 65536
COALESCE_ROWS = 1 << 20
"""Input rows reduced to states in one Acero call. Each call builds an Acero plan: a 50M-row
group-by over Parquet on two workers took 0.69 s in runs of 64k rows, 0.49 s in runs of 1M."""
CHUNK_ROWS = 65536
"""A run whose batches average fewer rows is concatenated before it is reduced (a cheap copy
that spares Acero many small chunks); larger ones are reduced as chunks, never copied."""
COALESCE_BYTES = 16 * 1024 * 1024
"""...or input bytes, whichever comes first: wide rows reach it long before COALESCE_ROWS."""
MERGE_COMBINE_BYTES = 1 << 20
"""States in several chunks are merged as one chunk when they hold at most this (a bounded
copy): Acero pays per chunk, and a final aggregate over 8 one-row partial states took 164 us
in 8 chunks, 107 us in one."""


Inferred = tuple[pa.Schema, bool]
"""A HashAggregate's output schema, and whether one state of it needs no merge."""
INFERRED_CACHE_SIZE = 256
"""Distinct aggregates (by mode, keys, aggregates and input schema) whose inference is kept."""


class AggregateMode(enum.Enum):
    SINGLE = "single"
    PARTIAL = "partial"
    FINAL = "final"


InferenceKey = tuple[
    AggregateMode, tuple[tuple[Expr, str], ...], tuple[AggregateExpr, ...], pa.Schema
]


class _InferenceCache:
    """What inference found per distinct aggregate and input schema, least recently used out.

    Inference runs Acero twice (~230 us a node) and plans are built for every query: on the
    coordinator by clients and planners, on workers by decoding every task's plan. Schemas
    compare without metadata, so the stored input schema is checked with it. Thread-safe:
    large plans are decoded on worker threads.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[InferenceKey, tuple[pa.Schema, Inferred]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: InferenceKey) -> Inferred | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None or not entry[0].equals(key[3], check_metadata=True):
            return None
        return entry[1]

    def put(self, key: InferenceKey, inferred: Inferred) -> None:
        with self._lock:
            self._entries[key] = (key[3], inferred)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_INFERRED = _InferenceCache(INFERRED_CACHE_SIZE)


class HashAggregate(UnaryNode):
    name = "HashAggregate"

    def __init__(
        self,
        child: ExecutionPlan,
        group_by: Sequence[tuple[Expr, str]],
        aggregates: Sequence[AggregateExpr],
        *,
        mode: AggregateMode = AggregateMode.SINGLE,
        functions: FunctionRegistry = BUILTINS,
    ) -> None:
        self.child = child
        self.group_by = tuple(group_by)
        self.aggregates = tuple(aggregates)
        self.mode = mode
        self._functions = functions
        self._resolved = [resolve_aggregate(a, functions) for a in self.aggregates]
        self._keys = [name for _, name in self.group_by]
        self._states = [state_names(a, r) for a, r in zip(aggregates, self._resolved, strict=True)]
        outputs = self._keys + (
            [s for names in self._states for s in names]
            if mode is AggregateMode.PARTIAL
            else [a.name for a in self.aggregates]
        )
        if len(set(outputs)) != len(outputs):
            raise InvalidArgument(f"HashAggregate output names are not unique: {outputs}")
        if mode is AggregateMode.FINAL:
            missing = [c for c in self._keys + self._state_columns() if c not in child.schema.names]
            if missing:
                raise InvalidArgument(f"FINAL HashAggregate input lacks partial columns {missing}")
        # A node of builtins only means the same whatever the session: what inference found
        # for it over the same input schema holds (keys were validated then, too).
        key = None if self._runs_user_code(functions) else _inference_key(self)
        found = None if key is None else _INFERRED.get(key)
        if found is None:
            try:
                found = self._infer(functions)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise InvalidArgument(self._refusal(exc, functions)) from None
            if key is not None:
                _INFERRED.put(key, found)
        self._schema, self._one_state_is_merged = found

    def _infer(self, functions: FunctionRegistry) -> Inferred:
        """Validate the keys and run the node on zero rows (Acero twice: ~230 us)."""
        schema = self.child.schema
        if self.mode is not AggregateMode.FINAL:  # (a missing column: InvalidArgument here)
            for expr, _ in self.group_by:
                output_type(expr, schema, functions)
            for aggregate in self.aggregates:
                for arg in aggregate.args:
                    output_type(arg, schema, functions)
        empty = pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
        states = self._to_states([empty], functions, infer=True)
        merged = self._merge(states, infer=True)
        # One call's states are already grouped: merging them again changes nothing, unless
        # merging changes their types (FINAL's states are its input rows, never grouped yet).
        one_state_is_merged = self.mode is not AggregateMode.FINAL and states.schema.equals(
            merged.schema
        )
        return self._finish(merged).schema, one_state_is_merged

    def _refusal(self, exc: Exception, functions: FunctionRegistry) -> str:
        """Arrow's refusal of the keys or aggregates: the aggregate it names and the types of
        its arguments when Arrow has no kernel for them, else the whole node."""
        found = _NO_KERNEL.search(str(exc))
        kernel = found.group(1) if found else ""
        named = {"min", "max"} if kernel == "min_max" else {kernel}
        culprits = [a for a in self.aggregates if a.function in named]
        if culprits:
            schema = self.child.schema
            described = "; ".join(
                f"{a} over {', '.join(_type_of(arg, schema, functions) for arg in a.args)}"
                for a in culprits
            )
            return (
                f"HashAggregate cannot compute {described}: Arrow's {kernel} has no"
                " kernel for that type"
            )
        keys = ", ".join(f"{expr} AS {name}" for expr, name in self.group_by)
        aggregates = ", ".join(str(a) for a in self.aggregates) or "nothing"
        grouped = f" grouped by {keys}" if keys else ""
        types = {f.name: str(f.type) for f in self.child.schema}
        return f"HashAggregate cannot compute {aggregates}{grouped} over columns {types}: {exc}"

    def _state_columns(self) -> list[str]:
        return [s for names in self._states for s in names]

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def required_input_distribution(self) -> list[Distribution | None]:
        """Finishing groups (SINGLE, FINAL) needs all rows of a group in one partition: on the
        group keys as computed (SINGLE) or as the PARTIAL named them (FINAL)."""
        if self.mode is AggregateMode.PARTIAL:
            return [None]
        if not self.group_by:
            return [SinglePartition()]
        if self.mode is AggregateMode.FINAL:
            return [HashPartitioned(tuple(Column(name) for name in self._keys))]
        return [HashPartitioned(tuple(expr for expr, _ in self.group_by))]

    def output_hash_keys(self) -> tuple[Expr, ...] | None:
        """Groups stay in the partition their rows came in: an input hash-partitioned on some
        of the group keys leaves the output hash-partitioned on those keys' columns (the same
        values, so the same hashes)."""
        below = output_hash_keys(self.child)
        if not below or not self.group_by:
            return None
        if self.mode is AggregateMode.FINAL:  # its keys are the PARTIAL's columns, by name
            computed: list[Expr] = [Column(name) for name in self._keys]
        else:
            computed = [expr for expr, _ in self.group_by]
        out: list[Expr] = []
        for key in below:
            if key not in computed:
                return None
            out.append(Column(self._keys[computed.index(key)]))
        return tuple(out)

    def around_exchange(
        self, exchange: Callable[[ExecutionPlan], ExecutionPlan]
    ) -> ExecutionPlan | None:
        """SINGLE as PARTIAL below `exchange` and FINAL above it: only states cross it, one row
        per group per partition instead of every row. None for the other modes (a PARTIAL
        needs no exchange; a FINAL's input is already states)."""
        if self.mode is not AggregateMode.SINGLE:
            return None
        partial = HashAggregate(
            self.child,
            self.group_by,
            self.aggregates,
            mode=AggregateMode.PARTIAL,
            functions=self._functions,
        )
        return HashAggregate(
            exchange(partial),
            self.group_by,
            self.aggregates,
            mode=AggregateMode.FINAL,
            functions=self._functions,
        )

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        child = children[0]
        if child.schema.equals(self.child.schema, check_metadata=True):  # nothing to infer
            node = copy.copy(self)
            node.child = child
            return node
        return HashAggregate(
            child, self.group_by, self.aggregates, mode=self.mode, functions=self._functions
        )

    def _runs_user_code(self, functions: FunctionRegistry) -> bool:
        """Aggregate UDFs, or scalar UDFs in keys or arguments: always off the loop."""
        if any(not isinstance(r, BuiltinAggregate) for r in self._resolved):
            return True
        exprs = [e for e, _ in self.group_by] + [x for a in self.aggregates for x in a.args]
        return calls_udf(exprs, functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        user_code = self._runs_user_code(ctx.session)
        with ctx.memory.reservation(self.name) as held:
            states: list[pa.Table] = []
            run: list[pa.RecordBatch] = []
            run_rows = run_bytes = 0
            async with closing(self.child.execute(partition, ctx)) as stream:
                async for batch in stream:
                    if not batch.num_rows:
                        continue
                    nbytes = batch_nbytes(batch)
                    held.grow(nbytes)  # kept until its run is reduced
                    run.append(batch)
                    run_rows += batch.num_rows
                    run_bytes += nbytes
                    if run_rows >= COALESCE_ROWS or run_bytes >= COALESCE_BYTES:
                        states.append(await self._reduce(run, run_bytes, held, ctx, user_code))
                        run, run_rows, run_bytes = [], 0, 0
                        if len(states) >= MERGE_EVERY_BATCHES:
                            states = [await self._merge_held(states, held, ctx)]
            if run:
                states.append(await self._reduce(run, run_bytes, held, ctx, user_code))
                del run
            if not states:  # no rows: a global aggregate still yields its one row
                empty = pa.RecordBatch.from_arrays(
                    [pa.nulls(0, f.type) for f in self.child.schema],
                    schema=self.child.schema,
                )
                states = [self._to_states([empty], ctx.session)]
            if len(states) == 1 and self._one_state_is_merged:
                merged = states[0]
            else:
                merged = await self._merge_held(states, held, ctx)
            del states
            size = batch_nbytes(merged)  # (known if it is the state just reduced)
            held.grow(size)
            finish = partial(self._finish, merged)
            out = await run_compute(ctx, size, finish, user_code=user_code)
            held.resize(size if out is merged else batch_nbytes(out))  # PARTIAL's finish is a no-op
            del merged
            for batch in out.to_batches(max_chunksize=OUTPUT_BATCH_ROWS):
                yield batch

    async def _reduce(
        self,
        run: list[pa.RecordBatch],
        run_bytes: int,
        held: MemoryReservation,
        ctx: TaskContext,
        user_code: bool,
    ) -> pa.Table:
        """A coalesced run of batches (`run_bytes` of them reserved in `held`) to states, in
        one call; the run's reservation passes to the states. A run of large batches is not
        concatenated: Acero groups a chunked table as it is (a copy of every row cost 39% of a
        worker's CPU in a Parquet group-by, on its event loop); small ones are, off the loop."""
        consume = partial(self._to_states, run, ctx.session)
        state = await run_compute(ctx, run_bytes, consume, user_code=user_code)
        held.grow(batch_nbytes(state))  # (briefly both)
        held.shrink(run_bytes)
        return state

    async def _merge_held(
        self, states: list[pa.Table], held: MemoryReservation, ctx: TaskContext
    ) -> pa.Table:
        """The states merged into one table; the merged copy is reserved before it is made."""
        size = sum(batch_nbytes(state) for state in states)
        held.grow(size)
        merged = await self._merge_async(states, ctx, self._runs_user_code(ctx.session))
        held.resize(batch_nbytes(merged))
        return merged

    async def _merge_async(
        self, states: list[pa.Table], ctx: TaskContext, user_code: bool
    ) -> pa.Table:
        table = pa.concat_tables(states)
        merge = partial(self._merge, table)
        return await run_compute(ctx, batch_nbytes(table), merge, user_code=user_code)

    def _to_states(
        self,
        batches: Sequence[pa.RecordBatch],
        functions: FunctionRegistry,
        *,
        infer: bool = False,
    ) -> pa.Table:
        """Rows -> states (SINGLE, PARTIAL), or the state columns of partial batches (FINAL):
        expressions are evaluated batch by batch into chunked columns (large batches are
        not copied)."""
        if self.mode is AggregateMode.FINAL:
            names = self._keys + self._state_columns()
            return pa.Table.from_batches([batch.select(names) for batch in batches])
        if len(batches) > 1 and sum(b.num_rows for b in batches) < CHUNK_ROWS * len(batches):
            with contextlib.suppress(pa.ArrowInvalid):  # (dictionaries outgrowing their index)
                batches = [pa.concat_batches(batches)]  # small ones: Acero is faster on one

        def column(expr: Expr) -> pa.ChunkedArray:
            chunks = [evaluate(expr, batch, functions) for batch in batches]
            return pa.chunked_array(chunks, type=chunks[0].type)

        columns: dict[str, pa.ChunkedArray] = {name: column(expr) for expr, name in self.group_by}
        ops: list[Op] = []
        resolved_aggregates = zip(self.aggregates, self._resolved, strict=True)
        for i, (aggregate, resolved) in enumerate(resolved_aggregates):
            sources = []
            prepare = resolved.prepare if isinstance(resolved, BuiltinAggregate) else None
            for j, arg in enumerate(aggregate.args):
                values = column(arg)
                columns[f"__arg{i}_{j}"] = values if prepare is None else prepare(values)
                sources.append(f"__arg{i}_{j}")
            ops += _partial_ops(resolved, sources, self._states[i])
        if not columns:
            empty = pa.Table.from_batches([batch.select([]) for batch in batches])
            return group_aggregate(empty, [], ops, infer=infer)
        return group_aggregate(pa.table(columns), self._keys, ops, infer=infer)

    def _merge(self, states: pa.Table, *, infer: bool = False) -> pa.Table:
        if (
            states.num_columns
            and states.column(0).num_chunks > 1
            and states.get_total_buffer_size() <= MERGE_COMBINE_BYTES
        ):
            states = states.combine_chunks()
        ops: list[Op] = []
        for resolved, names in zip(self._resolved, self._states, strict=True):
            ops += _merge_ops(resolved, names)
        return group_aggregate(states, self._keys, ops, infer=infer)

    def _finish(self, states: pa.Table) -> pa.Table:
        if self.mode is AggregateMode.PARTIAL:
            return states
        columns = [states.column(k) for k in self._keys]
        for resolved, names in zip(self._resolved, self._states, strict=True):
            values = [states.column(n).combine_chunks() for n in names]
            if isinstance(resolved, BuiltinAggregate):
                columns.append(resolved.finish(values))
            else:
                what = f"aggregate UDF {resolved.name!r} finish"
                result = resolved.finish(values)
                columns.append(conform(result, resolved.return_type, states.num_rows, what))
        return pa.Table.from_arrays(columns, names=self._keys + [a.name for a in self.aggregates])

    def __repr__(self) -> str:
        keys = ", ".join(f"{e} AS {n}" for e, n in self.group_by)
        aggs = ", ".join(map(str, self.aggregates))
        return f"HashAggregate({self.mode.value}, keys=[{keys}], aggregates=[{aggs}])"


_NO_KERNEL = re.compile(r"Function '(?:hash_)?(\w+)' has no kernel matching input types")


def _type_of(expr: Expr, schema: pa.Schema, functions: FunctionRegistry) -> str:
    """`expr` and the type it has over `schema`, for a message."""
    try:
        return f"{expr} ({output_type(expr, schema, functions)})"
    except FlightfeedError:
        return str(expr)


def _inference_key(node: HashAggregate) -> InferenceKey:
    return (node.mode, node.group_by, node.aggregates, node.child.schema)


def _partial_ops(resolved: ResolvedAggregate, sources: list[str], outputs: list[str]) -> list[Op]:
    if isinstance(resolved, BuiltinAggregate):
        source = sources[0] if sources else None
        return [
            BuiltinOp(source, s.partial, out, s.partial_options)
            for s, out in zip(resolved.states, outputs, strict=True)
        ]
    return [
        GroupedOp(
            tuple(sources), resolved.update, tuple(outputs), resolved.state_types, resolved.name
        )
    ]


def _merge_ops(resolved: ResolvedAggregate, names: list[str]) -> list[Op]:
    if isinstance(resolved, BuiltinAggregate):
        return [BuiltinOp(n, s.merge, n) for s, n in zip(resolved.states, names, strict=True)]
    return [
        GroupedOp(tuple(names), resolved.merge, tuple(names), resolved.state_types, resolved.name)
    ]


_MODES = {
    AggregateMode.SINGLE: AggregateModeProto.SINGLE,
    AggregateMode.PARTIAL: AggregateModeProto.PARTIAL,
    AggregateMode.FINAL: AggregateModeProto.FINAL,
}


class HashAggregateCodec:
    """Workers decode the same node for every task of every query: the node's inference cache
    spares them Acero (see _InferenceCache)."""

    kinds = (HashAggregate.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, HashAggregate):
            raise InvalidArgument(f"HashAggregateCodec cannot encode {node.name}")
        return encode_message(
            HashAggregateNode(
                mode=_MODES[node.mode],
                group_by=[named_to_proto(e, n) for e, n in node.group_by],
                aggregates=[
                    AggregateExprProto(
                        function=a.function, args=[expr_to_proto(x) for x in a.args], name=a.name
                    )
                    for a in node.aggregates
                ],
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(HashAggregateNode, payload, kind)
        expect_children(kind, children, 1)
        mode = decode_enum(_MODES, msg.mode, "aggregate mode")
        aggregates = []
        for a in msg.aggregates:
            if not a.function or not a.name:
                raise PlanDecodeError("aggregate without a function or a name")
            args = tuple(expr_from_proto(x) for x in a.args)
            aggregates.append(AggregateExpr(a.function, args, a.name))
        group_by = [named_from_proto(g) for g in msg.group_by]
        return HashAggregate(children[0], group_by, aggregates, mode=mode, functions=ctx.session)
