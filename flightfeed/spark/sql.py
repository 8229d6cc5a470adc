"""Catalog tables as SQL table functions in Spark: `SELECT ... FROM scan(2, '3,1', '2')`.

Spark SQL has no Python table functions that run distributed, so the query is rewritten first
(with sqlglot, in Spark's dialect): each call of a catalog table in a FROM or JOIN becomes a
temporary view over the `flightfeed` data source with those arguments, which Spark reads in
parallel, one partition per endpoint. The rest of the SQL is Spark's own.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import sqlglot
from sqlglot import Token, exp
from sqlglot import TokenType as TT
from sqlglot.dialects.spark import Spark

from ..coordinator.table_query import INT64_MAX, INT64_MIN, table_command
from ..errors import InvalidArgument
from . import client
from .client import flight_error
from .source import SOURCE_NAME

Argument = int | float | str | bool


@dataclass(frozen=True)
class TableCall:
    """One call of a catalog table in a query, and the view that stands for it."""

    view: str
    table: str
    arguments: tuple[Argument, ...]


def rewrite(query: str, tables: Collection[str]) -> tuple[str, list[TableCall]]:
    """The query with every call of a table in `tables` replaced by a view, and the calls.

    A query that calls none is Spark's alone and goes to it as written, unparsed if sqlglot
    cannot parse it (Spark's parser is the authority on Spark SQL)."""
    try:
        statements = [s for s in sqlglot.parse(query, read="spark") if s is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as exc:
        if not _may_call(query, tables):
            return query, []
        raise InvalidArgument(f"cannot parse the SQL{_where(exc)}") from None
    if len(statements) != 1:
        raise InvalidArgument(
            f"cannot parse the SQL: expected one statement, got {len(statements)}"
        )
    (tree,) = statements
    if isinstance(tree, exp.Command) and _may_call(query, tables):
        raise InvalidArgument(  # (its text is kept whole: a call in it would reach Spark as is)
            f"cannot parse the SQL: sqlglot reads {tree.name.upper()} ... as an opaque command,"
            " and a catalog table's call in it cannot be run; run the query itself"
        )
    known = {name.lower(): name for name in tables}
    tokens = _tokens(query)
    calls: list[TableCall] = []
    spans: list[tuple[int, int, str]] = []
    for table in list(tree.find_all(exp.Table)):
        function = table.this
        if not isinstance(function, exp.Anonymous) or function.name.lower() not in known:
            continue
        if table.args.get("db") or table.args.get("catalog"):
            continue  # `db.scan(...)` is some database's function, not the catalog's table
        name = known[function.name.lower()]
        start, end, strings = _call_span(query, tokens, function, name)
        arguments = tuple(
            strings[i] if i in strings else _argument(name, i, arg)
            for i, arg in enumerate(function.expressions)
        )
        view = f"__flightfeed_{name}_{uuid.uuid4().hex[:12]}"  # unique: queries may overlap
        spans.append((start, end, view))
        calls.append(TableCall(view, name, arguments))
    # Only the calls' text is replaced: the rest goes to Spark as written, since sqlglot's
    # rendering of it can differ from what Spark reads (percentile_cont became
    # percentile_approx, to_char a cast that dropped its format).
    for start, end, view in sorted(spans, reverse=True):
        query = query[:start] + view + query[end:]
    return query, calls


def _tokens(query: str) -> list[Token]:
    try:
        return list(Spark().tokenize(query))
    except sqlglot.errors.TokenError as exc:  # (parsed already: not expected)
        raise InvalidArgument(f"cannot parse the SQL{_where(exc)}") from None


def _call_span(
    query: str, tokens: list[Token], function: exp.Anonymous, table: str
) -> tuple[int, int, dict[int, str]]:
    """Where a table call's text is, [start, end), and the value of each argument written as
    adjacent strings, read as Spark reads them: with no space between, the second quote is an
    escaped one ('O''Brien' is O'Brien); apart, they are joined ('a' 'b' is ab)."""
    start = function.meta.get("start")
    first = next((i for i, t in enumerate(tokens) if t.start == start), None)
    if first is None or first + 1 >= len(tokens) or tokens[first + 1].token_type != TT.L_PAREN:
        raise InvalidArgument(f"cannot find the text of the call of {table}(...) in the SQL")
    depth, argument = 0, 0
    strings: dict[int, str] = {}
    run: list[Token] = []
    for token in tokens[first + 1 :]:
        if token.token_type in (TT.L_PAREN, TT.L_BRACKET):
            depth += 1
        elif token.token_type in (TT.R_PAREN, TT.R_BRACKET):
            depth -= 1
        if depth == 0 or (depth == 1 and token.token_type == TT.COMMA):
            if len(run) > 1 and all(t.token_type == TT.STRING for t in run):
                strings[argument] = _adjacent_strings(query, run)
            if depth == 0:
                return tokens[first].start, token.end + 1, strings
            argument, run = argument + 1, []
        elif depth >= 1 and not (depth == 1 and token.token_type == TT.L_PAREN):
            run.append(token)
    raise InvalidArgument(f"the call of {table}(...) is not closed")


def _adjacent_strings(query: str, run: list[Token]) -> str:
    value = run[0].text
    for before, token in itertools.pairwise(run):
        quote = query[before.start]  # (a token's start is its opening quote)
        escaped = token.start == before.end + 1 and query[token.start] == quote
        value += (quote if escaped else "") + token.text
    return value


def _may_call(query: str, tables: Collection[str]) -> bool:
    """Whether the query's text may call one of `tables` (a name, then an opening bracket)."""
    return any(
        re.search(rf"(?<![\w.`]){re.escape(name)}\s*\(", query, re.IGNORECASE) for name in tables
    )


_SQLGLOT_CLASS = re.compile(r"<class '(?:\w+\.)*(\w+)'>")
"""How sqlglot names an expression in its messages; `Mul` is enough."""


def _class_name(match: re.Match[str]) -> str:
    return match.group(1)


def _where(exc: sqlglot.errors.ParseError | sqlglot.errors.TokenError) -> str:
    """Where and why sqlglot could not parse a query, in plain text (its own message marks the
    place with terminal escape codes)."""
    if isinstance(exc, sqlglot.errors.TokenError):
        return f": {exc} (an unclosed quote or comment?)"
    first = exc.errors[0] if exc.errors else None
    if first is None:
        return f": {exc}"
    near = f"{first['start_context']}{first['highlight']}".strip()[-40:]
    return (
        f" at line {first['line']}, column {first['col']}, after {near!r}:"
        f" {_SQLGLOT_CLASS.sub(_class_name, first['description'])}"
    )


_INTEGER_SUFFIXES = frozenset({"BIGINT", "INT", "SMALLINT", "TINYINT"})
"""What Spark's 2L, 2S and 2Y literals (and a plain INT cast) come to, as sqlglot parses them."""
_FLOAT_SUFFIXES = frozenset({"DOUBLE", "FLOAT"})


def _argument(table: str, index: int, node: exp.Expression) -> Argument:
    """A literal argument's value: numbers (Spark's L, S, Y, D and F suffixes too), strings
    (adjacent ones joined, as Spark joins them), booleans, negative numbers."""
    where = f"argument {index} of {table}(...)"
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if isinstance(inner, exp.Boolean) and not negative:
        return bool(inner.this)
    if isinstance(inner, exp.Concat) and not negative:
        parts = inner.expressions
        if parts and all(isinstance(p, exp.Literal) and p.is_string for p in parts):
            return "".join(str(p.this) for p in parts)
    suffix = None
    if isinstance(inner, exp.Cast) and isinstance(inner.this, exp.Literal):  # (TryCast too)
        suffix = inner.to.this.name
        if suffix in ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "TIMESTAMPLTZ", "TIMESTAMPNTZ"):
            raise InvalidArgument(f"{where} is a {suffix} literal: pass it as a string")
        if suffix not in _INTEGER_SUFFIXES | _FLOAT_SUFFIXES or inner.this.is_string:
            raise InvalidArgument(
                f"{where} is a {suffix} literal: a table argument is an integer, a double, a"
                " string or a boolean"
            )
        inner = inner.this
    if isinstance(inner, exp.RawString) and not negative:  # (r'...')
        return str(inner.this)
    if isinstance(inner, exp.Literal):
        if inner.is_string and not negative:
            return str(inner.this)
        if not inner.is_string:
            text = str(inner.this)
            floating = suffix in _FLOAT_SUFFIXES or any(c in text for c in ".eE")
            value: int | float = float(text) if floating else int(text)
            if suffix in _INTEGER_SUFFIXES and isinstance(value, float):
                raise InvalidArgument(f"{where} is {node.sql(dialect='spark')}: not an integer")
            value = -value if negative else value
            if isinstance(value, float) and not math.isfinite(value):  # (1e400)
                raise InvalidArgument(f"{where} is {text}, outside the doubles")
            if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
                raise InvalidArgument(
                    f"{where} is {value}, outside the 64-bit integers a table argument holds"
                )
            return value
    if isinstance(node, exp.Kwarg):
        raise InvalidArgument(
            f"{where} is named ({node.sql(dialect='spark')}): table arguments are positional"
        )
    raise InvalidArgument(f"{where} must be a literal, got {node.sql(dialect='spark')}")


def catalog_tables(uri: str, *, connection: client.Connection = client.PLAIN) -> list[str]:
    """The table names a coordinator serves (ListFlights)."""
    try:
        with connection.connect(uri) as flight:
            call = fl.FlightCallOptions(headers=connection.headers())
            return [info.descriptor.path[0].decode() for info in flight.list_flights(b"", call)]
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "ListFlights", exc) from None


def sql(
    spark: Any,
    uri: str,
    query: str,
    *,
    tables: Collection[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> Any:
    """Run Spark SQL in which the coordinator's tables are called as table functions; returns
    the DataFrame. `options` go to every flightfeed read (headers as `header.NAME`; the token
    and TLS options reach the coordinator's table list too)."""
    connection = _connection(options)
    rewritten, calls = rewrite(
        query, catalog_tables(uri, connection=connection) if tables is None else tables
    )
    for call in calls:
        reader = spark.read.format(SOURCE_NAME).option("uri", uri).option("table", call.table)
        reader = reader.option("args", json.dumps(list(call.arguments)))
        for key, value in (options or {}).items():
            reader = reader.option(key, value)
        reader.load().createOrReplaceTempView(call.view)
    return spark.sql(rewritten)


def explain(
    uri: str,
    query: str,
    *,
    tables: Collection[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> str:
    """flightfeed's part of a query's plan: each table call's stages, tasks and workers
    (`options`: the token and TLS options, as for `sql`)."""
    connection = _connection(options)
    _, calls = rewrite(
        query, catalog_tables(uri, connection=connection) if tables is None else tables
    )
    parts = []
    for call_ in calls:
        command = table_command(call_.table, call_.arguments)
        text = client.explain(uri, command, {}, connection=connection)
        arguments = ", ".join(json.dumps(a) for a in call_.arguments)
        parts.append(f"{call_.table}({arguments}) on flightfeed:\n{text}")
    return "\n\n".join(parts)


def _connection(options: Mapping[str, str] | None) -> client.Connection:
    return client.Connection.of({str(k).lower(): str(v) for k, v in (options or {}).items()})


_FLIGHTFEED_ERROR = re.compile(r"^[ \t]*flightfeed(?:\.\w+)*\.([A-Z]\w*): ([^\n]*)", re.MULTILINE)


def error_message(exc: BaseException) -> str:
    """The flightfeed error inside an exception Spark raised (a Python data source's failure
    travels as text inside Java's: the last `flightfeed.<module>.<Error>: message` line of its
    traceback, as `flightfeed.errors.NotFound` or `flightfeed.spark.writer.TableWriteRefused`),
    or the exception's own first line."""
    found = _FLIGHTFEED_ERROR.findall(str(exc))
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
