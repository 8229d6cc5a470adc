"""Predicates split between DuckDB and Arrow: whatever is pushed, a read returns exactly the
rows pyarrow.compute keeps (a property over random data and predicates), literals travel as
parameters, and what DuckDB would evaluate differently stays with Arrow."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.plan.expr import Call, Expr, Literal, call, col, lit
from flightfeed.plan.expr import Column as Col
from flightfeed.tables.engine import TableEngine, TableRead
from flightfeed.tables.predicate import split_predicates
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import SqlPredicate, TableName, TableStore

pytestmark = pytest.mark.anyio

ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("ms"), nullable=False),
        pa.field("i", pa.int64()),
        pa.field("f", pa.float64()),
        pa.field("g", pa.float32()),
        pa.field("s", pa.string()),
        pa.field("t", pa.timestamp("ms")),
        pa.field("b", pa.bool_()),
        pa.field("d", pa.date32()),
        pa.field("y", pa.binary()),
    ]
)
SCHEMA = TableSchema.from_arrow(ARROW, timestamp="ts", primary_key=["id", "ts"])
NAME = TableName.of("data")
COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
FLOAT_COLUMNS = ("f", "g")

# --- data ----------------------------------------------------------------------------------

SMALL_INTS = st.integers(-4, 4)
TIMES = st.integers(-3, 3).map(lambda v: v * 1000)  # whole seconds, in milliseconds
STRINGS = st.text(alphabet="ab\x00é😀", max_size=3)
BYTES = st.binary(max_size=2)


NEGATIVE_NAN: Final = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0000))[0]


def floats(nan: bool) -> st.SearchStrategy[float]:
    values = st.sampled_from([-2.5, -1.0, 0.0, 0.5, 1.0, 3.0, float("inf"), float("-inf")])
    if nan:  # a NaN, and one with its sign bit set (as 0/0 gives on x86)
        values = values | st.sampled_from([float("nan"), NEGATIVE_NAN])
    return values | st.floats(-4, 4, allow_nan=False, width=32).map(lambda v: v + 0.0)


def nullable(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


@st.composite
def tables(draw: st.DrawFn, nan: bool) -> pa.Table:
    rows = draw(st.integers(0, 40))

    def column(values: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(values, min_size=rows, max_size=rows))

    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "ts": pa.array(column(TIMES), pa.timestamp("ms")),
            "i": pa.array(column(nullable(SMALL_INTS)), pa.int64()),
            "f": pa.array(column(nullable(floats(nan))), pa.float64()),
            "g": pa.array(column(nullable(floats(nan))), pa.float32()),
            "s": pa.array(column(nullable(STRINGS)), pa.string()),
            "t": pa.array(column(nullable(TIMES)), pa.timestamp("ms")),
            "b": pa.array(column(nullable(st.booleans())), pa.bool_()),
            "d": pa.array(column(nullable(SMALL_INTS)), pa.date32()),
            "y": pa.array(column(nullable(BYTES)), pa.binary()),
        },
        schema=ARROW,
    )


# --- predicates ----------------------------------------------------------------------------


def literals(name: str, nan: bool) -> st.SearchStrategy[pa.Scalar]:
    """Scalars a column `name` compares with (sometimes of another width, sometimes null)."""
    null = st.just(pa.scalar(None, ARROW.field(name).type))
    if name in ("id", "i"):
        typed = st.tuples(SMALL_INTS, st.sampled_from([pa.int64(), pa.int8(), pa.int32()]))
        found = typed.map(lambda v: pa.scalar(v[0], v[1]))
        if name == "i":
            found |= st.floats(-3, 3).map(lambda v: pa.scalar(v))  # int vs a fraction: Arrow's
    elif name in FLOAT_COLUMNS:
        found = floats(nan).map(pa.scalar) | SMALL_INTS.map(lambda v: pa.scalar(v, pa.int64()))
        found |= floats(nan).map(lambda v: pa.scalar(v, pa.float32()))
    elif name in ("ts", "t"):
        found = st.one_of(
            TIMES.map(lambda v: pa.scalar(v, pa.timestamp("ms"))),
            TIMES.map(lambda v: pa.scalar(v * 1000, pa.timestamp("us"))),
            TIMES.map(lambda v: pa.scalar(v // 1000, pa.timestamp("s"))),
            # finer than a millisecond: Arrow's to evaluate
            TIMES.map(lambda v: pa.scalar(v * 1000 + 1, pa.timestamp("us"))),
        )
    elif name == "s":
        found = STRINGS.map(pa.scalar) | STRINGS.map(lambda v: pa.scalar(v, pa.large_string()))
    elif name == "b":
        found = st.booleans().map(pa.scalar)
    elif name == "d":
        found = SMALL_INTS.map(lambda v: pa.scalar(v, pa.date32()))
    else:
        found = BYTES.map(pa.scalar)
    return found | null


NAMES = tuple(ARROW.names)


@st.composite
def comparisons(draw: st.DrawFn, nan: bool) -> Expr:
    name = draw(st.sampled_from(NAMES))
    if name == "b":
        function = draw(st.sampled_from(["equal", "not_equal"]))
    else:
        function = draw(st.sampled_from(COMPARISONS))
    if draw(st.integers(0, 9)) == 0:
        other = draw(st.sampled_from(["i", "id"])) if name in ("i", "id") else name
        return call(function, col(name), col(other))  # two columns: Arrow's
    literal = lit(draw(literals(name, nan)))
    if draw(st.booleans()):
        return call(function, literal, col(name))
    return call(function, col(name), literal)


@st.composite
def null_tests(draw: st.DrawFn, nan: bool) -> Expr:
    name = draw(st.sampled_from(NAMES))
    function = draw(st.sampled_from(["is_null", "is_valid"]))
    if function == "is_null" and name in FLOAT_COLUMNS and draw(st.booleans()):
        # nan_is_null=True only without NaN data: see test_is_null_with_nan_is_null below
        nan_is_null = draw(st.booleans()) and not nan
        return call(function, col(name), options=pc.NullOptions(nan_is_null=nan_is_null))
    return call(function, col(name))


@st.composite
def set_lookups(draw: st.DrawFn, nan: bool) -> Expr:
    name = draw(st.sampled_from(["i", "s", "t", "d", "f", "y"]))
    kind = ARROW.field(name).type
    values: st.SearchStrategy[Any]
    if name == "f":
        # no 0.0 in the set: Arrow's is_in tells -0.0 from 0.0 (see test_is_in_of_zero below)
        values = st.sampled_from([-2.5, 1.0, 3.0, float("inf")]) | SMALL_INTS.filter(bool)
        if nan:
            values |= st.just(float("nan"))
        kind = pa.float64()
    elif name == "i":
        values = SMALL_INTS
    elif name == "s":
        values = STRINGS
    elif name == "t":
        values = TIMES
    elif name == "d":
        values = SMALL_INTS
    else:
        values = BYTES
    found = draw(st.lists(nullable(values), max_size=4))
    if name == "f" and draw(st.booleans()):
        kind = pa.int64()
        found = [int(v) if isinstance(v, float) and v in (1.0, 3.0) else None for v in found]
    options = pc.SetLookupOptions(pa.array(found, kind), skip_nulls=draw(st.booleans()))
    return call("is_in", col(name), options=options)


def starts_with() -> st.SearchStrategy[Expr]:
    prefix = st.sampled_from(["a", "b", "", "é"])
    return prefix.map(lambda p: call("starts_with", col("s"), options=pc.MatchSubstringOptions(p)))


def predicates(nan: bool) -> st.SearchStrategy[Expr]:
    comparison = comparisons(nan)
    leaves = st.one_of(
        comparison,
        comparison.map(lambda e: call("invert", e)),
        null_tests(nan),
        st.sampled_from(FLOAT_COLUMNS).map(lambda name: call("is_nan", col(name))),
        st.sampled_from(FLOAT_COLUMNS).map(lambda name: call("signbit", col(name))),
        set_lookups(nan),
        starts_with(),
        st.just(col("b")),
    )

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        pair = st.tuples(
            st.sampled_from(["and_kleene", "or_kleene", "and", "or"]), children, children
        )
        return pair.map(lambda p: call(p[0], p[1], p[2])) | children.map(
            lambda e: call("invert", e)
        )

    return st.recursive(leaves, extend, max_leaves=5)


# --- the reference -------------------------------------------------------------------------


def reference(expr: Expr, table: pa.Table) -> Any:
    """The expression as pyarrow.compute evaluates it over the whole table."""
    if isinstance(expr, Col):
        return table.column(expr.name)
    if isinstance(expr, Literal):
        return expr.value
    assert isinstance(expr, Call)
    args = [reference(arg, table) for arg in expr.args]
    if expr.function == "signbit":  # no Arrow kernel (datafusion_floats.SIGNBIT): numpy's
        (values,) = args
        return pa.chunked_array(
            [
                pa.array(
                    np.signbit(chunk.to_numpy(zero_copy_only=False)),
                    mask=chunk.is_null().to_numpy(zero_copy_only=False),
                )
                for chunk in values.chunks
            ],
            pa.bool_(),
        )
    return pc.call_function(expr.function, args, expr.options)


def expected_ids(table: pa.Table, exprs: Sequence[Expr]) -> list[int]:
    mask = pa.chunked_array([pa.array([True] * table.num_rows, pa.bool_())])
    for expr in exprs:
        value = reference(expr, table)
        if isinstance(value, pa.Scalar):
            value = pa.repeat(value, table.num_rows)
        mask = pc.and_(mask, pc.fill_null(value, False))
    ids: list[int] = table.filter(mask).column("id").to_pylist()
    return sorted(ids)


_TABLE_NUMBERS = itertools.count()


async def read_rows(
    table: pa.Table, exprs: Sequence[Expr], store: TableStore | None = None, **read: Any
) -> pa.Table:
    """`table` written to a new table (of `store`, else of a fresh in-memory engine) and read
    back through TableEngine.read with `exprs`."""
    engine = TableEngine(store) if store is not None else await TableEngine.open(None)
    name = TableName.of(f"data_{next(_TABLE_NUMBERS)}")
    try:
        await engine.create(name, SCHEMA, {"update_mode": "APPEND"})
        if table.num_rows:
            await engine.write([(name, table)])
        batches = [b async for b in engine.read(TableRead(name, predicates=tuple(exprs), **read))]
        return pa.Table.from_batches(batches, schema=engine.read_schema(TableRead(name, **read)))
    finally:
        if store is None:
            await engine.aclose()


@pytest.fixture(scope="module")
def shared() -> Iterator[TableStore]:
    """One in-memory store for every example of a property (a table each): opening a store
    per example would triple their time."""
    store = TableStore.open(None)
    try:
        yield store
    finally:
        store.close()


def rows_by_id(table: pa.Table) -> list[str]:
    """Rows in id order, NaN-safe (repr compares NaN equal to NaN)."""
    return [repr(r) for r in table.sort_by("id").to_pylist()]


async def check(table: pa.Table, exprs: Sequence[Expr], store: TableStore | None = None) -> None:
    got = await read_rows(table, exprs, store)
    ids = expected_ids(table, exprs)
    assert sorted(got.column("id").to_pylist()) == ids, [str(e) for e in exprs]
    wanted = table.filter(pc.is_in(table.column("id"), pa.array(ids, pa.int64())))
    assert rows_by_id(got.select(table.column_names)) == rows_by_id(wanted)


ONE_LOOP = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio")]
)
"""For the tests of DuckDB against Arrow, which no event loop changes: one loop is enough (and
keeps the folder fast)."""


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@ONE_LOOP
@PROPERTY
@given(table=tables(nan=False), exprs=st.lists(predicates(nan=False), min_size=1, max_size=3))
async def test_a_read_returns_exactly_the_rows_arrow_keeps(
    shared: TableStore, table: pa.Table, exprs: list[Expr]
) -> None:
    await check(table, exprs, shared)


@ONE_LOOP
@PROPERTY
@given(table=tables(nan=True), exprs=st.lists(predicates(nan=True), min_size=1, max_size=3))
async def test_with_nan_in_the_data_a_read_returns_exactly_the_rows_arrow_keeps(
    shared: TableStore, table: pa.Table, exprs: list[Expr]
) -> None:
    """NaN in the data and in the literals (DuckDB orders NaN above every number and equal to
    itself, Arrow compares it false); -0.0 in is_in sets and nan_is_null have tests below."""
    await check(table, exprs, shared)


# --- where the engines differ: NaN, -0.0, nan_is_null ------------------------------------

NAN_TABLE = pa.table(
    {
        "id": pa.array([0, 1, 2, 3], pa.int64()),
        "ts": pa.array([0, 0, 0, 0], pa.timestamp("ms")),
        "f": pa.array([float("nan"), 1.0, -1.0, None]),
        "g": pa.array([float("nan"), 1.0, -1.0, None], pa.float32()),
    }
)


async def read_ids(table: pa.Table, expr: Expr, store: TableStore) -> list[int]:
    got = await read_rows(table, [expr], store)
    return sorted(got.column("id").to_pylist())


NAN_CASES: list[tuple[Callable[[str], Expr], list[int]]] = [
    # (predicate on column c, the ids Arrow keeps of NAN_TABLE)
    (lambda c: call("greater", col(c), lit(0.5)), [1]),  # NaN > 0.5 is false
    (lambda c: call("greater_equal", col(c), lit(0)), [1]),
    (lambda c: call("less", lit(0.5), col(c)), [1]),
    (lambda c: call("invert", call("greater", col(c), lit(0.5))), [0, 2]),  # not false: true
    (lambda c: call("less", col(c), lit(float("nan"))), []),  # nothing is < NaN
    (lambda c: call("equal", col(c), lit(float("nan"))), []),  # NaN == NaN is false
    (lambda c: call("not_equal", col(c), lit(float("nan"))), [0, 1, 2]),
]
NAN_IDS = ["gt", "ge-int", "flipped", "invert", "lt-nan", "eq-nan", "ne-nan"]


@pytest.mark.parametrize("column", FLOAT_COLUMNS)
@pytest.mark.parametrize(("make", "ids"), NAN_CASES, ids=NAN_IDS)
def test_the_reference_for_nan(column: str, make: Callable[[str], Expr], ids: list[int]) -> None:
    """What the test below expects is what pyarrow.compute answers."""
    assert expected_ids(NAN_TABLE, [make(column)]) == ids


@ONE_LOOP
@pytest.mark.parametrize("column", FLOAT_COLUMNS)
@pytest.mark.parametrize(("make", "ids"), NAN_CASES, ids=NAN_IDS)
async def test_float_comparisons_with_nan_match_arrow(
    shared: TableStore, column: str, make: Callable[[str], Expr], ids: list[int]
) -> None:
    assert await read_ids(NAN_TABLE, make(column), shared) == ids


ZEROS = pa.table(
    {
        "id": pa.array([0, 1], pa.int64()),
        "ts": pa.array([0, 0], pa.timestamp("ms")),
        "f": pa.array([-0.0, 0.0]),
    }
)


@pytest.mark.parametrize(("value", "ids"), [(0.0, [1]), (-0.0, [0])])
def test_the_reference_for_is_in_of_zero(value: float, ids: list[int]) -> None:
    expr = call("is_in", col("f"), options=pc.SetLookupOptions(pa.array([value])))
    assert expected_ids(ZEROS, [expr]) == ids


@ONE_LOOP
@pytest.mark.parametrize(("value", "ids"), [(0.0, [1]), (-0.0, [0])])
async def test_is_in_of_zero_matches_arrow(
    shared: TableStore, value: float, ids: list[int]
) -> None:
    expr = call("is_in", col("f"), options=pc.SetLookupOptions(pa.array([value])))
    assert await read_ids(ZEROS, expr, shared) == ids


NAN_IS_NULL = call("is_null", col("f"), options=pc.NullOptions(nan_is_null=True))


def test_the_reference_for_nan_is_null() -> None:
    assert expected_ids(NAN_TABLE, [NAN_IS_NULL]) == [0, 3]


def test_is_null_with_nan_is_null_stays_with_arrow() -> None:
    assert split(NAN_IS_NULL) == ((), (NAN_IS_NULL,))


@ONE_LOOP
async def test_is_null_with_nan_is_null_reads_nan_rows(shared: TableStore) -> None:
    assert await read_ids(NAN_TABLE, NAN_IS_NULL, shared) == [0, 3]


@ONE_LOOP
async def test_is_in_of_zero_agrees_without_negative_zero(shared: TableStore) -> None:
    """Without -0.0 in the data, 0.0 matches the one row either way."""
    zero = call("is_in", col("f"), options=pc.SetLookupOptions(pa.array([0.0])))
    assert await read_ids(ZEROS.slice(1), zero, shared) == [1]


# --- what is pushed ------------------------------------------------------------------------


def split(*exprs: Expr) -> tuple[tuple[SqlPredicate, ...], tuple[Expr, ...]]:
    found = split_predicates(exprs, ARROW)
    return found.pushed, found.remaining


@pytest.mark.parametrize(
    ("function", "op"),
    [
        ("equal", "="),
        ("not_equal", "<>"),
        ("less", "<"),
        ("less_equal", "<="),
        ("greater", ">"),
        ("greater_equal", ">="),
    ],
)
def test_comparisons_are_pushed_with_parameters(function: str, op: str) -> None:
    flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
    assert split(call(function, col("i"), lit(3))) == ((SqlPredicate(f'"i" {op} ?', (3,)),), ())
    assert split(call(function, lit(3), col("i"))) == (
        (SqlPredicate(f'"i" {flipped} ?', (3,)),),
        (),
    )


def test_literals_are_parameters_never_sql_text() -> None:
    sneaky = "x' OR 1=1; DROP TABLE t_1; --"
    pushed, remaining = split(
        call("equal", col("s"), lit(sneaky)),
        call("greater", col("f"), lit(2.5)),
        call("less", col("t"), lit(pa.scalar(5_000_000, pa.timestamp("us")))),
        call("equal", col("y"), lit(b"\x00'")),
        call("equal", col("b"), lit(True)),
        call("equal", col("d"), lit(pa.scalar(3, pa.date32()))),
        call("is_in", col("s"), options=pc.SetLookupOptions(pa.array(["a'", sneaky]))),
    )
    assert remaining == ()
    assert '"f" > ?::DOUBLE' in pushed[1].sql  # with a NaN guard, in whatever form
    assert [p.sql for p in pushed[:1] + pushed[2:]] == [
        '"s" = ?',
        '"t" < epoch_ms(?::BIGINT)',
        '"y" = ?::BLOB',
        '"b" = ?',
        '"d" = ?',
        '"s" IN (?, ?)',
    ]
    assert [p.params for p in pushed] == [
        (sneaky,),
        (2.5,),
        (5000,),
        (b"\x00'",),
        (True,),
        (pa.scalar(3, pa.date32()).as_py(),),
        ("a'", sneaky),
    ]
    for predicate in pushed:
        assert "'" not in predicate.sql
        assert predicate.sql.count("?") == len(predicate.params)
        for value in predicate.params:
            assert str(value) not in predicate.sql


def test_null_tests_invert_and_kleene_connectives_are_pushed() -> None:
    pushed, remaining = split(
        call("is_null", col("i")),
        call("is_valid", col("s")),
        call("invert", call("greater", col("i"), lit(1))),
        call("or_kleene", call("equal", col("s"), lit("a")), call("is_null", col("t"))),
    )
    assert remaining == ()
    assert pushed == (
        SqlPredicate('"i" IS NULL'),
        SqlPredicate('"s" IS NOT NULL'),
        SqlPredicate('NOT ("i" > ?)', (1,)),
        SqlPredicate('("s" = ?) OR ("t" IS NULL)', ("a",)),
    )


def test_is_nan_of_a_float_column_is_pushed_as_a_nan_ordering_comparison_needs() -> None:
    """HoraeDB's `v > 0.5` keeps NaN rows (datafusion_floats.py): is_nan OR the comparison,
    all of it in DuckDB's scan."""
    nan_or_above = call("or_kleene", call("is_nan", col("f")), call("greater", col("f"), lit(0.5)))
    pushed, remaining = split(nan_or_above, call("is_nan", call("negate", col("f"))))
    assert pushed == (
        SqlPredicate('(isnan("f")) OR (("f" > ?::DOUBLE AND NOT isnan("f")))', (0.5,)),
    )
    assert remaining == (call("is_nan", call("negate", col("f"))),)  # not of a column


def test_top_level_conjunctions_split_into_conjuncts() -> None:
    starts = call("starts_with", col("s"), options=pc.MatchSubstringOptions("a"))
    for conjunction in ("and", "and_kleene"):
        pushed, remaining = split(
            call(conjunction, call("less", col("i"), lit(2)), call(conjunction, starts, col("b")))
        )
        assert pushed == (SqlPredicate('"i" < ?', (2,)),)
        assert remaining == (starts, col("b"))


def test_what_duckdb_could_evaluate_differently_stays_with_arrow() -> None:
    starts = call("starts_with", col("s"), options=pc.MatchSubstringOptions("a"))
    kept: list[Expr] = [
        call("less", col("f"), lit(float("nan"))),  # a NaN literal: DuckDB orders NaN
        call("not_equal", lit(float("nan")), col("g")),
        call("or", call("equal", col("i"), lit(1)), call("is_null", col("s"))),  # non-Kleene
        call("or_kleene", call("equal", col("i"), lit(1)), starts),  # half unknown
        starts,
        call("less", col("i"), col("id")),  # two columns
        call("equal", col("i"), lit(1.5)),  # an integer against a fraction
        call("equal", col("i"), lit(None, pa.int64())),  # a null literal
        call("less", col("t"), lit(pa.scalar(1_500, pa.timestamp("us")))),  # sub-millisecond
        call("is_in", col("i"), options=pc.SetLookupOptions(pa.array([1, None]))),
        call("is_in", col("i"), options=pc.SetLookupOptions(pa.array([], pa.int64()))),
        call("invert", call("is_null", col("i"))),  # only comparisons are inverted in SQL
        call("invert", starts),
        col("b"),
    ]
    for expr in kept:
        pushed, remaining = split(expr)
        assert pushed == (), str(expr)
        assert remaining == (expr,), str(expr)
    assert split_predicates(kept, ARROW).columns == {"f", "g", "i", "s", "id", "t", "b"}
    plain = call("is_null", col("f"), options=pc.NullOptions(nan_is_null=False))
    assert split(plain) == ((SqlPredicate('"f" IS NULL'),), ())


def test_quoted_column_names_are_escaped() -> None:
    schema = pa.schema([('we"ird', pa.int64())])
    found = split_predicates([call("equal", col('we"ird'), lit(1))], schema)
    assert found.pushed == (SqlPredicate('"we""ird" = ?', (1,)),)


async def test_a_quoted_column_name_is_read_through_a_pushed_predicate() -> None:
    arrow = pa.schema([pa.field("ts", pa.timestamp("ms")), pa.field('a"b', pa.int64())])
    schema = TableSchema.from_arrow(arrow, timestamp="ts")
    engine = await TableEngine.open(None)
    try:
        await engine.create(NAME, schema, {"update_mode": "APPEND"})
        data = pa.table({"ts": pa.array([1, 2, 3], pa.timestamp("ms")), 'a"b': [1, 2, 3]})
        await engine.write([(NAME, data)])
        read = TableRead(NAME, predicates=(call("greater", col('a"b'), lit(1)),))
        got = pa.Table.from_batches([b async for b in engine.read(read)])
        assert sorted(got.column('a"b').to_pylist()) == [2, 3]
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    "expr",
    [
        col("i"),
        call("add", col("i"), lit(1)),
        lit(1),
        call("utf8_upper", col("s")),
    ],
    ids=["column", "add", "literal", "string"],
)
def test_a_non_boolean_predicate_is_invalid(expr: Expr) -> None:
    with pytest.raises(InvalidArgument, match="must be boolean"):
        split_predicates([expr], ARROW)


def test_a_predicate_on_a_missing_column_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="nope"):
        split_predicates([call("equal", col("nope"), lit(1))], ARROW)


async def test_a_read_with_a_non_boolean_predicate_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="must be boolean"):
        await read_rows(NAN_TABLE.slice(0, 0), [call("add", col("i"), lit(1))])


async def test_remaining_predicates_read_columns_the_projection_leaves_out() -> None:
    table = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "ts": pa.array([0] * 6, pa.timestamp("ms")),
            "s": ["a", "b", "ab", None, "ba", "a"],
            "i": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        }
    )
    starts = call("starts_with", col("s"), options=pc.MatchSubstringOptions("a"))
    got = await read_rows(table, [starts, call("greater", col("i"), lit(1))], columns=("ts", "i"))
    assert got.column_names == ["ts", "i"]
    assert sorted(got.column("i").to_pylist()) == [3, 6]


def test_every_comparison_has_a_flipped_form() -> None:
    for function, other in itertools.product(COMPARISONS, ("i", "f", "s", "t")):
        literal = {
            "i": lit(1),
            "f": lit(1.0),
            "s": lit("a"),
            "t": lit(pa.scalar(0, pa.timestamp("ms"))),
        }
        pushed, remaining = split(call(function, literal[other], col(other)))
        assert len(pushed) == 1
        assert remaining == ()


def test_signbit_of_a_float_column_is_pushed_as_duckdbs() -> None:
    """HoraeDB's `v < 0.5` keeps the NaNs with their sign bit set (datafusion_floats.py): the
    sign test goes into DuckDB's scan, which keeps a NaN's sign as Arrow does."""
    negative_nan = call("and_kleene", call("is_nan", col("f")), call("signbit", col("f")))
    below = call("or_kleene", negative_nan, call("less", col("f"), lit(0.5)))
    pushed, remaining = split(below, call("invert", call("signbit", col("g"))))
    assert pushed == (
        SqlPredicate('((isnan("f")) AND (signbit("f"))) OR ("f" < ?::DOUBLE)', (0.5,)),
        SqlPredicate('NOT (signbit("g"))'),
    )
    assert remaining == ()
