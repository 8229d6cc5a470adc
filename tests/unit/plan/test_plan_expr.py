"""Expression IR: evaluation against Python references, UDF resolution, proto round trips."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import Expr as ExprProto
from flightfeed.errors import ExecutionError, InvalidArgument, PlanDecodeError, UnknownUdfError
from flightfeed.plan import (
    BUILTINS,
    Call,
    Column,
    Expr,
    Literal,
    ScalarUdf,
    call,
    col,
    evaluate,
    expr_from_proto,
    expr_to_proto,
    lit,
    output_type,
)
from flightfeed.plan.expr_proto import literal_from_ipc, literal_to_ipc
from flightfeed.session import SessionStateBuilder

BATCH = pa.record_batch(
    {
        "a": pa.array([1, -5, None, 2**62, 0], pa.int64()),
        "b": pa.array([3, 7, 2, None, -1], pa.int64()),
    }
)

MASK = 2**64


def wrap(value: int) -> int:
    value %= MASK
    return value - MASK if value >= 2**63 else value


REFERENCE: dict[str, Callable[..., int]] = {
    "add": lambda x, y: wrap(x + y),
    "subtract": lambda x, y: wrap(x - y),
    "multiply": lambda x, y: wrap(x * y),
    "negate": lambda x: wrap(-x),
}

int_leaves = st.one_of(
    st.sampled_from([col("a"), col("b")]),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: lit(v, pa.int64())),
)


def int_calls(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    binary = st.tuples(st.sampled_from(["add", "subtract", "multiply"]), children, children)
    return st.one_of(
        binary.map(lambda t: call(t[0], t[1], t[2])),
        children.map(lambda c: call("negate", c)),
    )


int_exprs = st.recursive(int_leaves, int_calls, max_leaves=12)


def reference(expr: Expr, row: dict[str, int | None]) -> int | None:
    if isinstance(expr, Column):
        return row[expr.name]
    if isinstance(expr, Literal):
        value: int = expr.value.as_py()
        return value
    assert isinstance(expr, Call)
    args = [reference(a, row) for a in expr.args]
    return None if None in args else REFERENCE[expr.function](*args)


@settings(max_examples=80, deadline=None)
@given(expr=int_exprs)
def test_evaluation_matches_python_reference(expr: Expr) -> None:
    got = evaluate(expr, BATCH, BUILTINS).to_pylist()
    assert got == [reference(expr, row) for row in BATCH.to_pylist()]
    assert output_type(expr, BATCH.schema, BUILTINS) == pa.int64()


def test_unknown_function_names_it() -> None:
    with pytest.raises(UnknownUdfError, match="frobnicate"):
        evaluate(call("frobnicate", col("a")), BATCH, BUILTINS)
    with pytest.raises(UnknownUdfError, match="frobnicate"):
        output_type(call("add", call("frobnicate"), lit(1)), BATCH.schema, BUILTINS)


def test_aggregate_function_in_scalar_context_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="aggregate"):
        evaluate(call("sum", col("a")), BATCH, BUILTINS)


def test_options_and_literal_broadcast() -> None:
    as_text = Call("cast", (col("b"),), pc.CastOptions(pa.string()))
    assert evaluate(as_text, BATCH, BUILTINS).to_pylist() == ["3", "7", "2", None, "-1"]
    assert evaluate(lit("x"), BATCH, BUILTINS).to_pylist() == ["x"] * 5


def test_session_udfs_resolve_per_session_and_shadow_builtins() -> None:
    double = ScalarUdf("double", lambda x: pc.multiply(x, 2), pa.int64())
    listy = ScalarUdf("listy", lambda x: [1] * len(x), pa.int8())
    shadow = ScalarUdf("negate", lambda x: x, pa.int64())
    session = (
        SessionStateBuilder().with_scalar_udfs([double, listy]).with_scalar_udf(shadow).build()
    )
    assert evaluate(call("double", col("b")), BATCH, session).to_pylist() == [6, 14, 4, None, -2]
    out = evaluate(call("listy", col("b")), BATCH, session)
    assert out.type == pa.int8()
    assert out.to_pylist() == [1] * 5
    assert evaluate(call("negate", col("b")), BATCH, session).equals(BATCH.column("b"))
    with pytest.raises(UnknownUdfError, match="double"):
        evaluate(call("double", col("b")), BATCH, SessionStateBuilder().build())


def test_misbehaving_udfs_are_execution_errors() -> None:
    short = ScalarUdf("short", lambda x: x.slice(1), pa.int64())
    boom = ScalarUdf("boom", lambda x: 1 / 0, pa.int64())
    session = SessionStateBuilder().with_scalar_udfs([short, boom]).build()
    with pytest.raises(ExecutionError, match="short"):
        evaluate(call("short", col("a")), BATCH, session)
    with pytest.raises(ExecutionError, match="division by zero"):
        evaluate(call("boom", col("a")), BATCH, session)


def test_missing_column() -> None:
    with pytest.raises(ExecutionError, match="nope"):
        evaluate(col("nope"), BATCH, BUILTINS)
    with pytest.raises(InvalidArgument, match="nope"):
        output_type(col("nope"), BATCH.schema, BUILTINS)


# --- wire form ---

scalars = st.one_of(
    st.none().map(lambda _: pa.scalar(None)),
    st.booleans().map(pa.scalar),
    st.integers(-128, 127).map(lambda v: pa.scalar(v, pa.int8())),
    st.integers(0, 2**64 - 1).map(lambda v: pa.scalar(v, pa.uint64())),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: pa.scalar(v, pa.int64())),
    st.floats(width=32).map(lambda v: pa.scalar(v, pa.float32())),
    st.floats().map(lambda v: pa.scalar(v, pa.float64())),
    st.text().map(pa.scalar),
    st.text().map(lambda v: pa.scalar(v, pa.large_string())),
    st.binary().map(pa.scalar),
    st.dates().map(pa.scalar),
    st.datetimes(timezones=st.just(datetime.UTC)).map(
        lambda v: pa.scalar(v, pa.timestamp("us", "UTC"))
    ),
    st.decimals(places=2, min_value=-(10**6), max_value=10**6, allow_nan=False).map(
        lambda v: pa.scalar(decimal.Decimal(v), pa.decimal128(12, 2))
    ),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: pa.scalar(v, pa.duration("us"))),
    st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=4).map(
        lambda v: pa.scalar(v, pa.list_(pa.int32()))
    ),
    st.fixed_dictionaries({"x": st.integers(0, 9), "y": st.text(max_size=3)}).map(pa.scalar),
    st.just(pa.scalar(None, pa.int32())),
)

options = st.sampled_from(
    [None, pc.CastOptions(pa.string()), pc.RoundOptions(2), pc.ScalarAggregateOptions()]
)

leaves = st.one_of(st.text(min_size=1, max_size=8).map(col), scalars.map(Literal))


def calls(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    return st.builds(
        Call,
        st.text(min_size=1, max_size=10),
        st.lists(children, max_size=3).map(tuple),
        options,
    )


exprs = st.recursive(leaves, calls, max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(value=scalars)
def test_literal_ipc_round_trip(value: pa.Scalar) -> None:
    back = literal_from_ipc(literal_to_ipc(value))
    assert back.type == value.type
    assert literal_to_ipc(back) == literal_to_ipc(value)
    assert Literal(back) == Literal(value)


@settings(max_examples=150, deadline=None)
@given(expr=exprs)
def test_expression_proto_round_trip(expr: Expr) -> None:
    data = bytes(expr_to_proto(expr))
    back = expr_from_proto(ExprProto.parse(data))
    assert back == expr
    assert bytes(expr_to_proto(back)) == data


def test_malformed_expressions_are_plan_decode_errors() -> None:
    with pytest.raises(PlanDecodeError, match="none of"):
        expr_from_proto(ExprProto())
    with pytest.raises(PlanDecodeError, match="missing"):
        expr_from_proto(None)
    bad_literal = ExprProto.parse(bytes(expr_to_proto(lit(1))))
    assert bad_literal.literal is not None
    bad_literal.literal.arrow_ipc = b"\x00garbage"
    with pytest.raises(PlanDecodeError, match="literal"):
        expr_from_proto(bad_literal)
    two_rows = pa.RecordBatch.from_arrays([pa.array([1, 2])], names=["literal"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, two_rows.schema) as writer:
        writer.write_batch(two_rows)
    bad_literal.literal.arrow_ipc = sink.getvalue().to_pybytes()
    with pytest.raises(PlanDecodeError, match="1 row"):
        expr_from_proto(bad_literal)
    deep: Expr = col("a")
    for _ in range(300):
        deep = call("negate", deep)
    with pytest.raises(PlanDecodeError, match="deeper"):
        expr_from_proto(expr_to_proto(deep))
