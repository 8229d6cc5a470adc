"""Catalog tables called as SQL table functions (flightfeed.spark.sql): the sqlglot rewrite into
views, the literal arguments it accepts, its errors, and the options each view's read gets."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import sqlglot
from hypothesis import given, settings
from sqlglot import exp

from flightfeed.errors import InvalidArgument
from flightfeed.spark.source import SOURCE_NAME, TableOptions
from flightfeed.spark.sql import TableCall, error_message, rewrite, sql

from .strategies import table_arguments

SEED_QUERY = (
    "SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task ORDER BY task"
)
SEED_ARGUMENTS = (2, "3,1", "2", "4", "1,1")
VIEW = re.compile(r"__flightfeed_scan_[0-9a-f]{12}")


def tables_in(query: str) -> list[str]:
    return [t.name for t in sqlglot.parse_one(query, read="spark").find_all(exp.Table)]


def same_sql(a: str, b: str) -> bool:
    return bool(sqlglot.parse_one(a, read="spark") == sqlglot.parse_one(b, read="spark"))


def test_seed_query_reads_a_view_of_the_call() -> None:
    rewritten, calls = rewrite(SEED_QUERY, ["scan"])
    [found] = calls
    assert VIEW.fullmatch(found.view)
    assert found == TableCall(found.view, "scan", SEED_ARGUMENTS)
    assert rewritten == (
        f"SELECT count(*) AS cnt, task FROM {found.view} GROUP BY task ORDER BY task"
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY id) AS p, to_char(x, '99.00') FROM",
            "",
        ),
        ("SELECT count(*) FROM t JOIN (SELECT * FROM", ") ON true"),
        ("SELECT name FROM t WHERE name = 'O''Brien' UNION ALL SELECT x /* scan(2) */ FROM", ""),
    ],
)
def test_only_the_calls_text_is_replaced(before: str, after: str) -> None:
    """The query went to Spark as sqlglot rendered it, which is not always what Spark reads:
    percentile_cont became percentile_approx (another value, another type), to_char a cast
    that dropped its format, 'O''Brien' CONCAT('O', 'Brien') (found by a probe)."""
    call = "scan(2,\n 'a''b' , 3)"
    query = f"{before} {call} AS s{after} WHERE s.x > 1"
    rewritten, [found] = rewrite(query, ["scan"])
    assert found.arguments == (2, "a'b", 3)
    assert rewritten == query.replace(call, found.view)


def test_views_are_unique_per_rewrite() -> None:
    """Two sessions may run the same query at once: their temporary views must not collide."""
    views = {rewrite(SEED_QUERY, ["scan"])[1][0].view for _ in range(20)}
    assert len(views) == 20


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM other(1)",  # not a catalog table
        "SELECT * FROM range(10)",  # Spark's own table function
        "SELECT scan(1) FROM t",  # a scalar call, not in FROM
        "WITH scan AS (SELECT 1 AS a) SELECT * FROM scan",  # a CTE of the same name
        "SELECT * FROM scan",  # a plain table of the same name
        "SELECT * FROM t WHERE a = 'scan(1)'",
    ],
)
def test_other_tables_and_calls_are_left_alone(query: str) -> None:
    rewritten, calls = rewrite(query, ["scan"])
    assert calls == []
    assert same_sql(rewritten, query)


def test_names_match_case_insensitively_and_keep_the_catalog_spelling() -> None:
    _, calls = rewrite("SELECT * FROM SCAN(1) JOIN Scan(2)", ["sCaN"])
    assert [(c.table, c.arguments) for c in calls] == [("sCaN", (1,)), ("sCaN", (2,))]


def test_every_call_gets_its_own_view_and_aliases_stay() -> None:
    query = (
        "SELECT a.task, b.task FROM scan(1) AS a JOIN scan(2) b ON a.task = b.task"
        " WHERE a.task IN (SELECT task FROM (SELECT * FROM other(3, 'x')) UNION ALL"
        " SELECT task FROM other(4))"
    )
    rewritten, calls = rewrite(query, ["scan", "other"])
    view_of = {(c.table, *c.arguments): c.view for c in calls}  # order: sqlglot's traversal
    assert sorted(view_of, key=str) == [("other", 3, "x"), ("other", 4), ("scan", 1), ("scan", 2)]
    assert len(set(view_of.values())) == 4
    scan1, scan2 = view_of["scan", 1], view_of["scan", 2]
    other3, other4 = view_of["other", 3, "x"], view_of["other", 4]
    expected = (
        f"SELECT a.task, b.task FROM {scan1} AS a JOIN {scan2} b ON a.task = b.task WHERE a.task"
        f" IN (SELECT task FROM (SELECT * FROM {other3}) UNION ALL SELECT task FROM {other4})"
    )
    assert same_sql(rewritten, expected)


def test_a_call_without_arguments() -> None:
    _, [found] = rewrite("SELECT * FROM scan()", ["scan"])
    assert found.arguments == ()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("-7", -7),
        ("1234567890123456789", 1234567890123456789),
        ("1.5", 1.5),
        ("-1.5e3", -1500.0),
        ("1e3", 1000.0),
        (".5", 0.5),
        ("true", True),
        ("FALSE", False),
        ("'3,1'", "3,1"),
        ('"double quoted"', "double quoted"),  # a string in Spark's dialect
        ("''", ""),
    ],
)
def test_literal_arguments(text: str, value: Any) -> None:
    _, [found] = rewrite(f"SELECT * FROM scan({text})", ["scan"])
    [argument] = found.arguments
    assert type(argument) is type(value)
    assert argument == value


def render(value: int | float | str | bool) -> str:
    """`value` as a Spark SQL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return str(exp.Literal.string(value).sql(dialect="spark"))
    return repr(value)


@settings(max_examples=150, deadline=None)
@given(table_arguments)
def test_arguments_round_trip(values: list[int | float | str | bool]) -> None:
    query = f"SELECT * FROM scan({', '.join(render(v) for v in values)}) WHERE x > 1"
    _, [found] = rewrite(query, ["scan"])
    assert [type(a) for a in found.arguments] == [type(v) for v in values]
    assert list(found.arguments) == values
    assert [math.copysign(1, a) for a in found.arguments if isinstance(a, float)] == [
        math.copysign(1, v) for v in values if isinstance(v, float)
    ]  # -0.0 stays negative


@pytest.mark.parametrize(
    ("call", "index"),
    [
        ("scan(NULL)", 0),
        ("scan(1, a)", 1),  # a column
        ("scan(1, 2, 1 + 1)", 2),
        ("scan(-'x')", 0),
        ("scan(-true)", 0),
        ("scan(upper('x'))", 0),
        ("scan(1, (SELECT 2))", 1),
    ],
)
def test_non_literal_arguments_are_refused(call: str, index: int) -> None:
    with pytest.raises(
        InvalidArgument, match=rf"argument {index} of scan\(\.\.\.\) must be a literal"
    ):
        rewrite(f"SELECT * FROM {call}", ["scan"])


@pytest.mark.parametrize(
    ("call", "value"),
    [
        ("scan('it''s')", "it's"),  # a doubled quote is one quote (Spark 4.x, SPARK-52545)
        ("scan('a' 'b' 'c')", "abc"),  # adjacent literals apart, joined as Spark joins them
        ("scan('a''' 'b')", "a'b"),
        ('scan("say ""hi""")', 'say "hi"'),
        ("scan('a'\"b\")", "ab"),  # touching, but quoted differently: two literals
        ("scan(2L)", 2),
        ("scan(-2L)", -2),
        ("scan(3S)", 3),
        ("scan(4Y)", 4),
        ("scan(2D)", 2.0),
        ("scan(1.5F)", 1.5),
        ("scan(-9223372036854775808)", -(2**63)),
        ("scan(9223372036854775807)", 2**63 - 1),
        ("scan(r'2')", "2"),  # (a raw string: it was refused as not a literal)
        ("scan(R'a\\b')", "a\\b"),
    ],
)
def test_spark_literal_forms_are_taken(call: str, value: Any) -> None:
    """They were refused as CONCAT('it', 's') or CAST(2 AS BIGINT): SQL the user never wrote."""
    _, [found] = rewrite(f"SELECT * FROM {call}", ["scan"])
    assert found.arguments == (value,)
    assert type(found.arguments[0]) is type(value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("scan(9223372036854775808)", "is 9223372036854775808, outside the 64-bit integers"),
        ("scan(-9223372036854775809)", "is -9223372036854775809, outside the 64-bit integers"),
        ("scan(18446744073709551615)", "is 18446744073709551615, outside the 64-bit"),
        ("scan(DATE '2024-01-01')", "is a DATE literal: pass it as a string"),
        ("scan(1.5BD)", "is a DECIMAL literal: a table argument is an integer, a double"),
        ("scan(n => 2)", r"is named \(n => 2\): table arguments are positional"),
        ("scan(1e400)", r"is 1e400, outside the doubles"),  # (it was passed on as inf)
    ],
)
def test_arguments_no_table_takes_are_refused_by_what_they_are(call: str, message: str) -> None:
    """2**64 - 1 reached the table as -1 (wrapped to 64 bits), 2**63 + 5 as a negative number."""
    with pytest.raises(InvalidArgument, match=rf"argument 0 of scan\(\.\.\.\) {message}"):
        rewrite(f"SELECT * FROM {call}", ["scan"])


def test_a_call_qualified_by_a_database_is_left_to_spark() -> None:
    """`default.scan(2)` became `default.__flightfeed_scan_...`, a view no database has."""
    rewritten, calls = rewrite("SELECT * FROM default.scan(2)", ["scan"])
    assert calls == []
    assert same_sql(rewritten, "SELECT * FROM default.scan(2)")


@pytest.mark.parametrize(
    ("query", "where"),
    [
        ("SELECT * FROM scan(1", "at line 1, column 20, after 'SELECT \\* FROM scan\\(1': "),
        ("SELEC * FROM scan(1)", "at line 1, column 12, after 'SELEC \\* FROM': .* for Mul$"),
        ("SELECT a\nFROM SCAN (1) WHERE (", "at line 2, column \\d+, after '.*WHERE \\(':"),
    ],
)
def test_unparsable_sql_that_calls_a_table_is_an_invalid_argument_saying_where(
    query: str, where: str
) -> None:
    """The place in plain words: sqlglot's own message marked it with terminal escape codes
    and named its classes ("<class 'sqlglot.expressions.core.Mul'>")."""
    with pytest.raises(InvalidArgument, match=f"^cannot parse the SQL {where}") as info:
        rewrite(query, ["scan"])
    assert "\x1b" not in str(info.value)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM",
        "SELEC 1",
        "SELECT * FROM other_scan(1) WHERE (",  # another name ending in the table's
        "SELECT * FROM t WHERE x.scan (1",
    ],
)
def test_unparsable_sql_that_calls_no_table_is_left_to_spark(query: str) -> None:
    """Spark's parser is the authority on Spark SQL, which sqlglot's lags behind."""
    assert rewrite(query, ["scan"]) == (query, [])


def test_sql_that_calls_no_table_goes_to_spark_as_written() -> None:
    query = "select  a  -- the column\nfrom t tablesample (bucket 3 out of 32 on rand()) s"
    assert rewrite(query, ["scan"]) == (query, [])


@pytest.mark.parametrize("statement", ["EXPLAIN", "EXPLAIN EXTENDED", "EXPLAIN COST"])
def test_a_call_inside_a_statement_sqlglot_cannot_read_is_refused(statement: str) -> None:
    """sqlglot reads EXPLAIN (and others) as an opaque command. Before, such a query went to
    Spark as written, and the call reached Spark's own parser, which knows no catalog table."""
    with pytest.raises(InvalidArgument, match="as an opaque command, and a catalog table's call"):
        rewrite(f"{statement} SELECT * FROM scan(1, '2')", ["scan"])
    assert rewrite(f"{statement} SELECT 1", ["scan"]) == (f"{statement} SELECT 1", [])


def test_empty_sql_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="expected one statement, got 0"):
        rewrite("", ["scan"])


def test_unterminated_string_is_an_invalid_argument() -> None:
    # sqlglot's TokenError is not a ParseError: it escaped unchanged before.
    with pytest.raises(InvalidArgument, match="cannot parse the SQL"):
        rewrite("SELECT * FROM scan('3,1)", ["scan"])


@pytest.mark.parametrize("query", ["SELECT 1; SELECT 2", ";"])
def test_one_statement_exactly(query: str) -> None:
    with pytest.raises(InvalidArgument, match="expected one statement"):
        rewrite(query, ["scan"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "x.py", line 1\n'
            "flightfeed.errors.NotFound: GetSchema at grpc://h:1: no table 'nope'  \n"
            "\tat org.apache.spark...",
            "NotFound: GetSchema at grpc://h:1: no table 'nope'",
        ),
        (
            "pyspark.errors.exceptions.captured.PythonException:\n  An exception was thrown from"
            " the Python worker. Please see the stack trace below.\nTraceback (most recent call"
            ' last):\n  File "writer.py", line 9, in write\nflightfeed.errors.InvalidArgument:'
            " first\n\nDuring handling of the above exception, another exception occurred:\n\n"
            "flightfeed.spark.writer.TableWriteRefused: column 'ts' has sub-millisecond digits\n",
            "TableWriteRefused: column 'ts' has sub-millisecond digits",
        ),
        (
            "a flightfeed.errors.NotFound: mid-line is not a traceback's",
            "a flightfeed.errors.NotFound: mid-line is not a traceback's",
        ),
        ("first line\nsecond line", "first line"),
        ("  \n  ", "RuntimeError"),
    ],
)
def test_error_message(text: str, message: str) -> None:
    assert error_message(RuntimeError(text)) == message


class Reader:
    """Spark's DataFrameReader as far as `sql` uses it: records the options of each load."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.options: dict[str, str] = {}

    def format(self, name: str) -> Reader:
        self.options["__format__"] = name
        return self

    def option(self, key: str, value: str) -> Reader:
        self.options[key] = value
        return self

    def load(self) -> Frame:
        return Frame(self.session, dict(self.options))


class Frame:
    def __init__(self, session: Session, options: dict[str, str]) -> None:
        self.session = session
        self.options = options

    def createOrReplaceTempView(self, name: str) -> None:
        self.session.views[name] = self.options


class Session:
    """The part of a SparkSession `sql` talks to."""

    def __init__(self) -> None:
        self.views: dict[str, dict[str, str]] = {}
        self.queries: list[str] = []

    @property
    def read(self) -> Reader:
        return Reader(self)

    def sql(self, query: str) -> str:
        self.queries.append(query)
        return "DataFrame"


def test_sql_registers_each_call_as_a_flightfeed_read() -> None:
    """The options each view's read gets are what the data source parses back into the call."""
    spark = Session()
    query = "SELECT * FROM scan(2, '3,1', true, -1.5) JOIN scan(3) USING (task)"
    result = sql(spark, "grpc://h:1", query, tables=["scan"], options={"header.x-tenant": "a"})
    assert result == "DataFrame"
    [ran] = spark.queries
    views = tables_in(ran)
    assert sorted(views) == sorted(spark.views)
    parsed = {view: TableOptions.of(spark.views[view]) for view in views}
    assert [(p.uri, p.table, p.arguments) for p in parsed.values()] == [
        ("grpc://h:1", "scan", (2, "3,1", True, -1.5)),
        ("grpc://h:1", "scan", (3,)),
    ]
    assert all(p.headers == {"x-tenant": "a"} for p in parsed.values())
    assert all(spark.views[v]["__format__"] == SOURCE_NAME for v in views)
    assert json.loads(spark.views[views[1]]["args"]) == [3]
