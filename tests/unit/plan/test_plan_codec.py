"""Plan codecs: every built-in node round-trips; hostile bytes only ever give clear errors."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import PlanNode
from flightfeed.errors import InvalidArgument, PlanDecodeError, UnknownUdfError
from flightfeed.plan import (
    AggregateMode,
    Coalesce,
    CodecRegistry,
    DecodeContext,
    ExecutionPlan,
    Filter,
    HashAggregate,
    HashJoin,
    Limit,
    MemoryScan,
    MetricsRegistry,
    Partitioning,
    PlanNodeBase,
    Projection,
    Repartition,
    ScalarUdf,
    Sort,
    SortKey,
    TaskContext,
    Union,
    agg,
    call,
    col,
    decode_plan,
    encode_plan,
    instrument,
    lit,
)
from flightfeed.plan.nodes import IsolatedUnion, TaskSpan
from flightfeed.session import Session, SessionStateBuilder

from .helpers import run, sample_table, sorted_rows

REGISTRY = CodecRegistry.builtin()
SESSION = Session()


def scan(partitions: int = 2) -> MemoryScan:
    return MemoryScan.from_table(sample_table(300), partitions, batch_rows=40)


def every_node() -> dict[str, ExecutionPlan]:
    keys = [(col("k"), "k")]
    aggs = [agg("sum", col("v"), name="s"), agg("count", name="c"), agg("mean", col("v"), name="m")]
    partial = HashAggregate(scan(), keys, aggs, mode=AggregateMode.PARTIAL)
    return {
        "MemoryScan": scan(),
        "Filter": Filter(scan(), call("greater", col("v"), lit(1.0))),
        "Projection": Projection(
            scan(), [call("add", col("n"), lit(1, pa.int64())), col("g")], ["n1", "g"]
        ),
        "HashAggregate": HashAggregate(
            Repartition(partial, Partitioning((col("k"),), 3)),
            keys,
            aggs,
            mode=AggregateMode.FINAL,
        ),
        "Sort": Sort(
            Coalesce(scan()), [SortKey(col("v"), True, True), SortKey(col("n"))], fetch=17
        ),
        "Limit": Limit(scan(), 5, 3),
        "Union": Union([scan(1), scan(3)]),
        "IsolatedUnion": IsolatedUnion([scan(3)], [TaskSpan(0, 1)], 1),  # one task: runnable
        "Coalesce": Coalesce(scan(4)),
        "Repartition": Repartition(scan(), Partitioning((col("g"), col("k")), 4)),
        "HashJoin": HashJoin(
            scan(1),
            Projection(scan(3), [col("k"), col("n")], ["rk", "rn"]),
            [("k", "rk")],
            "right outer",
        ),
    }


NETWORK_KINDS = {"NetworkCoalesce", "NetworkShuffle", "NetworkBroadcast"}
"""Read other tasks: their round trips are in test_network_nodes.py."""
TABLE_KINDS = {"TableScan"}
"""Read a worker's tables: their round trips are in test_table_scan.py."""


def test_every_builtin_kind_is_covered() -> None:
    assert set(every_node()) | NETWORK_KINDS | TABLE_KINDS == REGISTRY.kinds


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(every_node()))
async def test_round_trip_preserves_plan_and_results(kind: str) -> None:
    plan = every_node()[kind]
    data = encode_plan(plan, REGISTRY)
    back = decode_plan(data, REGISTRY, SESSION)
    assert type(back) is type(plan)
    assert back.schema == plan.schema
    assert back.output_partitions == plan.output_partitions
    assert encode_plan(back, REGISTRY) == data
    assert sorted_rows(await run(back)) == sorted_rows(await run(plan))


def test_instrumented_plans_encode_like_the_plan() -> None:
    plan = every_node()["HashAggregate"]
    wrapped = instrument(plan, MetricsRegistry())
    assert encode_plan(wrapped, REGISTRY) == encode_plan(plan, REGISTRY)


def test_decode_resolves_udfs_in_the_receiving_session() -> None:
    udf = ScalarUdf("shout", lambda s: s, pa.string())
    with_udf = SessionStateBuilder().with_scalar_udf(udf).build()
    plan = Projection(scan(), [call("shout", col("g"))], ["g"], functions=with_udf)
    data = with_udf.encode_plan(plan)
    assert isinstance(with_udf.decode_plan(data), Projection)
    with pytest.raises(UnknownUdfError, match="shout") as info:
        Session().decode_plan(data)
    assert "plan" in info.value.message  # names where in the plan


def test_unknown_kind_is_a_precise_decode_error() -> None:
    data = bytes(PlanNode(kind="Mystery", children=[]))
    with pytest.raises(PlanDecodeError, match=r"unknown plan node kind 'Mystery' at plan;"):
        decode_plan(data, REGISTRY, SESSION)
    nested = bytes(PlanNode(kind="Coalesce", children=[PlanNode(kind="Nope")]))
    with pytest.raises(PlanDecodeError, match="'Nope' at plan/0"):
        decode_plan(nested, REGISTRY, SESSION)


def test_structural_errors_are_decode_errors() -> None:
    no_child = bytes(PlanNode(kind="Filter", payload=b""))
    with pytest.raises(PlanDecodeError, match="Filter"):
        decode_plan(no_child, REGISTRY, SESSION)
    for payload in (b"\x08", b"\x0a\x05ab"):  # truncated varint; bytes where an int goes
        child = PlanNode.parse(encode_plan(scan(), REGISTRY))
        bad = bytes(PlanNode(kind="Limit", payload=payload, children=[child]))
        with pytest.raises(PlanDecodeError, match="Limit payload is not a valid LimitNode"):
            decode_plan(bad, REGISTRY, SESSION)
    deep = PlanNode(kind="Coalesce")
    for _ in range(200):
        deep = PlanNode(kind="Coalesce", children=[deep])
    with pytest.raises(PlanDecodeError, match="deeper"):
        decode_plan(bytes(deep), REGISTRY, SESSION)


@pytest.mark.parametrize(
    ("kind", "field_key", "message"),
    [
        ("HashAggregate", 0x08, "unknown aggregate mode 99"),
        ("HashJoin", 0x18, "unknown join type 99"),
    ],
)
def test_unknown_enum_values_are_decode_errors(kind: str, field_key: int, message: str) -> None:
    root = PlanNode.parse(encode_plan(every_node()[kind], REGISTRY))
    root.payload += bytes([field_key, 99])  # the varint enum field again: the last value wins
    with pytest.raises(PlanDecodeError, match=message):
        decode_plan(bytes(root), REGISTRY, SESSION)


def test_encoding_a_node_without_codec_fails_clearly() -> None:
    with pytest.raises(InvalidArgument, match="Custom"):
        encode_plan(Custom(), REGISTRY)


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_only_raise_plan_decode_error(data: bytes) -> None:
    with contextlib.suppress(PlanDecodeError):
        decode_plan(data, REGISTRY, SESSION)


def mutations() -> st.SearchStrategy[bytes]:
    """Real plans with bytes flipped, cut or inserted: gets past the envelope into payloads."""
    seeds = [encode_plan(p, REGISTRY) for p in every_node().values()]
    return st.tuples(
        st.sampled_from(seeds),
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
        st.booleans(),
    ).map(_mutate)


def _mutate(args: tuple[bytes, list[tuple[int, int]], bool]) -> bytes:
    data, edits, cut = args
    out = bytearray(data)
    for position, value in edits:
        out[position % len(out)] = value
    return bytes(out[: len(out) // 2] if cut else out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutations())
def test_corrupted_plans_only_raise_invalid_argument(data: bytes) -> None:
    # Both are InvalidArgument: a clear INVALID_ARGUMENT status at the worker.
    with contextlib.suppress(PlanDecodeError, UnknownUdfError):
        decode_plan(data, REGISTRY, SESSION)


# --- user codecs ---

SCHEMA = pa.schema([("x", pa.int64())])


class Custom(PlanNodeBase):
    """A user node: `count` rows of x = 0..count-1 in one partition."""

    name = "example.Custom"

    def __init__(self, count: int = 3) -> None:
        self.count = count

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    @property
    def output_partitions(self) -> int:
        return 1

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array(range(self.count), pa.int64())], schema=SCHEMA)


class CustomCodec:
    kinds = ("example.Custom",)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        assert isinstance(node, Custom)
        return str(node.count).encode()

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        return Custom(int(payload))  # ValueError on junk: the registry wraps it


@pytest.mark.anyio
async def test_user_codec_through_the_session_builder() -> None:
    session = SessionStateBuilder().with_codec(CustomCodec()).build()
    plan = Limit(Custom(5), 2)
    back = session.decode_plan(session.encode_plan(plan))
    assert (await run(back, session)).column("x").to_pylist() == [0, 1]
    with pytest.raises(PlanDecodeError, match=r"unknown plan node kind 'example\.Custom'"):
        Session().decode_plan(session.encode_plan(plan))
    junk = bytes(PlanNode(kind="example.Custom", payload=b"not a number"))
    with pytest.raises(PlanDecodeError, match=r"codec for example.Custom failed at plan"):
        session.decode_plan(junk)


def test_codec_kinds_cannot_collide_by_accident() -> None:
    class Shadow(CustomCodec):
        kinds = ("Filter",)

    with pytest.raises(InvalidArgument, match="Filter"):
        SessionStateBuilder().with_codec(Shadow())
    replaced = SessionStateBuilder().with_codec(Shadow(), replace_existing=True).build()
    assert isinstance(replaced.codecs.get("Filter"), Shadow)
