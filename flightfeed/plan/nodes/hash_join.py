"""HashJoin: an equi-join on Acero's hash join, per output partition.

Two modes, as in DataFusion: `collect_left` collects the whole left input once per task (shared
by every output partition) and joins it with each right partition, so join types that must see
every right row for a left row (left outer/semi/anti, full outer) need a single right partition;
partitioned mode joins left partition i with right partition i (both hash-partitioned on the
keys) and supports every join type. Each output partition collects its right input, then runs
one join off the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial

import anyio
import pyarrow as pa

from ..._generated.flightfeed.v1 import HashJoinNode
from ..._generated.flightfeed.v1 import JoinType as JoinTypeProto
from ...errors import InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..base import (
    ExecutionPlan,
    PlanNodeBase,
    TaskContext,
    closing,
    expect_children,
)
from ..codec import DecodeContext, decode_enum, parse_payload
from ..distribution import Distribution, HashPartitioned, SinglePartition
from ..expr import Column
from ..float_keys import needs_normalizing, normalized
from ..join_size import estimate_join_bytes
from ..layouts import one_dictionary_per_column, plain_layouts, with_layouts_of
from ..memory import MemoryReservation, batch_nbytes
from ..merge import merge
from ..offload import run_compute

OUTPUT_BATCH_ROWS = 65536

JOIN_TYPES: dict[str, JoinTypeProto] = {
    "inner": JoinTypeProto.INNER,
    "left outer": JoinTypeProto.LEFT_OUTER,
    "right outer": JoinTypeProto.RIGHT_OUTER,
    "full outer": JoinTypeProto.FULL_OUTER,
    "left semi": JoinTypeProto.LEFT_SEMI,
    "left anti": JoinTypeProto.LEFT_ANTI,
    "right semi": JoinTypeProto.RIGHT_SEMI,
    "right anti": JoinTypeProto.RIGHT_ANTI,
}
_NEEDS_ALL_RIGHT_ROWS = frozenset({"left outer", "full outer", "left semi", "left anti"})


def needs_all_right_rows(join_type: str) -> bool:
    """Whether a join collecting its left side must see every right row in one partition."""
    return join_type in _NEEDS_ALL_RIGHT_ROWS


class HashJoin(PlanNodeBase):
    name = "HashJoin"

    def __init__(
        self,
        left: ExecutionPlan,
        right: ExecutionPlan,
        on: Sequence[tuple[str, str]],
        join_type: str = "inner",
        *,
        collect_left: bool = True,
    ) -> None:
        if join_type not in JOIN_TYPES:
            raise InvalidArgument(f"unknown join type {join_type!r}; one of {list(JOIN_TYPES)}")
        if not on:
            raise InvalidArgument("HashJoin needs at least one key pair")
        for lk, rk in on:
            if lk not in left.schema.names or rk not in right.schema.names:
                raise InvalidArgument(f"join key {lk!r} = {rk!r} not in the inputs")
        if collect_left and join_type in _NEEDS_ALL_RIGHT_ROWS and right.output_partitions != 1:
            raise InvalidArgument(
                f"a {join_type} join collecting the left side needs one right partition"
            )
        if not collect_left and left.output_partitions != right.output_partitions:
            raise InvalidArgument("a partitioned join needs as many left as right partitions")
        if "semi" not in join_type and "anti" not in join_type:
            shared = set(left.schema.names) & set(right.schema.names)
            if shared:
                raise InvalidArgument(f"join inputs share column names {sorted(shared)}")
        self.left, self.right = left, right
        self.on = tuple(on)
        self.join_type = join_type
        self.collect_left = collect_left
        try:
            joined = self._join(left.schema.empty_table(), right.schema.empty_table())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            pairs = [
                (lk, left.schema.field(lk).type, rk, right.schema.field(rk).type) for lk, rk in on
            ]
            keys = ", ".join(f"{lk} ({lt}) = {rk} ({rt})" for lk, lt, rk, rt in pairs)
            hint = (
                " (cast one side's key to the other's type in a projection first)"
                if any(lt != rt for _, lt, _, rt in pairs)
                else ""
            )
            raise InvalidArgument(f"cannot {join_type} join on {keys}: {exc}{hint}") from None
        self._schema = joined.schema

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def output_partitions(self) -> int:
        return self.right.output_partitions

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return (self.left, self.right)

    def required_input_distribution(self) -> list[Distribution | None]:
        """collect_left: every right row once if the join type must see them all; partitioned:
        both sides hash-partitioned alike on their keys."""
        if self.collect_left:
            return [None, SinglePartition() if self.join_type in _NEEDS_ALL_RIGHT_ROWS else None]
        left = tuple(Column(key) for key, _ in self.on)
        right = tuple(Column(key) for _, key in self.on)
        return [
            HashPartitioned(left, co_partitioned=True),
            HashPartitioned(right, co_partitioned=True),
        ]

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 2)
        return HashJoin(
            children[0], children[1], self.on, self.join_type, collect_left=self.collect_left
        )

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        with ctx.memory.reservation(self.name) as held:
            if self.collect_left:
                build = await ctx.node_state(self, _Build).get(self.left, ctx)
            else:
                build = await _collect(self.left, [partition], ctx, held)
            probe = await _collect(self.right, [partition], ctx, held)
            join = partial(self._sized_join, build, probe, held)
            out = await run_compute(ctx, build.nbytes + probe.nbytes, join)
            del probe
            for batch in out.to_batches(max_chunksize=OUTPUT_BATCH_ROWS):
                yield batch

    def _sized_join(self, left: pa.Table, right: pa.Table, held: MemoryReservation) -> pa.Table:
        """The join, after reserving what its output and hash table will take (Acero builds
        the whole output at once: a few thousand rows per side can ask for gigabytes)."""
        held.grow(
            estimate_join_bytes(
                left, right, [lk for lk, _ in self.on], [rk for _, rk in self.on], self.join_type
            )
        )
        return self._join(left, right)

    def _join(self, left: pa.Table, right: pa.Table) -> pa.Table:
        """Acero's join: view and run-end encoded columns in the plain layouts (Acero takes
        neither) and back, each dictionary column with one dictionary (Acero takes no more).
        Float keys join on normalized copies (float_keys.py), the rows keeping their values."""
        left_keys = [lk for lk, _ in self.on]
        right_keys = [rk for _, rk in self.on]
        hidden: list[str] = []
        for i, (lk, rk) in enumerate(self.on):
            if needs_normalizing(left.schema.field(lk).type) or needs_normalizing(
                right.schema.field(rk).type
            ):
                left_keys[i], right_keys[i] = f"__ff_join_l{i}", f"__ff_join_r{i}"
                left = left.append_column(left_keys[i], normalized(left.column(lk)))
                right = right.append_column(right_keys[i], normalized(right.column(rk)))
                hidden += [left_keys[i], right_keys[i]]
        joined = one_dictionary_per_column(plain_layouts(left), "HashJoin's left input").join(
            one_dictionary_per_column(plain_layouts(right), "HashJoin's right input"),
            keys=left_keys,
            right_keys=right_keys,
            join_type=self.join_type,
            coalesce_keys=False,
            use_threads=False,
        )
        if hidden:
            joined = joined.drop_columns([c for c in hidden if c in joined.column_names])
            left = left.drop_columns([c for c in hidden if c in left.column_names])
            right = right.drop_columns([c for c in hidden if c in right.column_names])
        return with_layouts_of(with_layouts_of(joined, left.schema), right.schema)

    def __repr__(self) -> str:
        keys = ", ".join(f"{lk} = {rk}" for lk, rk in self.on)
        mode = "collect_left" if self.collect_left else "partitioned"
        return f"HashJoin({self.join_type}, [{keys}], {mode})"


async def _collect(
    plan: ExecutionPlan, partitions: Sequence[int], ctx: TaskContext, held: MemoryReservation
) -> pa.Table:
    """The partitions as one table, each batch reserved before it is kept. Read concurrently:
    the outputs of a fan-out such as Repartition are bounded, so reading them one after the
    other could stall."""
    batches: list[pa.RecordBatch] = []
    sources = {partition: plan.execute(partition, ctx) for partition in partitions}
    async with closing(merge(sources)) as stream:
        async for _, batch in stream:
            held.grow(batch_nbytes(batch))
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=plan.schema)


class _Build:
    """The left input of a collect_left join, collected once per task for all partitions (its
    reservation lasts as long as the task)."""

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.table: pa.Table | None = None

    async def get(self, left: ExecutionPlan, ctx: TaskContext) -> pa.Table:
        async with self.lock:
            if self.table is None:
                held = ctx.memory.reservation("HashJoin build side")
                self.table = await _collect(left, range(left.output_partitions), ctx, held)
            return self.table


class HashJoinCodec:
    kinds = (HashJoin.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, HashJoin):
            raise InvalidArgument(f"HashJoinCodec cannot encode {node.name}")
        return encode_message(
            HashJoinNode(
                left_keys=[lk for lk, _ in node.on],
                right_keys=[rk for _, rk in node.on],
                join_type=JOIN_TYPES[node.join_type],
                collect_left=node.collect_left,
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(HashJoinNode, payload, kind)
        expect_children(kind, children, 2)
        join_type = decode_enum(JOIN_TYPES, msg.join_type, "join type")
        if len(msg.left_keys) != len(msg.right_keys):
            raise PlanDecodeError("HashJoin needs as many left keys as right keys")
        on = list(zip(msg.left_keys, msg.right_keys, strict=True))
        return HashJoin(children[0], children[1], on, join_type, collect_left=msg.collect_left)
