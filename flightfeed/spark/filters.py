"""Spark's pushed filters as flightfeed expressions, which the workers evaluate with Arrow C++.

A filter is pushed only when its meaning is the same in both engines, SQL's three-valued
logic included: a comparison of a top-level column with a literal that Arrow can cast to the
column's type, IN, IS (NOT) NULL, string prefix/suffix/substring tests, and NOT of those that
propagate NULLs as SQL does (not of IN or <=>, where Arrow's answer for a NULL differs).
Anything else (a nested column, a literal of the wrong type) stays with Spark, which then
filters those rows itself. So do comparisons and IN on floating-point columns: Spark orders
NaN above every number and has NaN = NaN, and its IN has -0.0 = 0.0, where Arrow follows
IEEE 754 and hashes the bits; only IS (NOT) NULL is pushed for them. A decimal literal of 28
significant digits or more stays too: PySpark may have rounded it on its way here. So does a
date or timestamp literal at Spark's calendar switch: PySpark hands the ten days before
1582-10-15 over as that day.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ..plan import Expr, call, col, lit

_COMPARISONS: dict[str, str] = {
    "EqualTo": "equal",
    "GreaterThan": "greater",
    "GreaterThanOrEqual": "greater_equal",
    "LessThan": "less",
    "LessThanOrEqual": "less_equal",
}
_STRING_TESTS: dict[str, str] = {
    "StringStartsWith": "starts_with",
    "StringEndsWith": "ends_with",
    "StringContains": "match_substring",
}
ROUNDED_DECIMAL_DIGITS: Final = 28
"""PySpark hands a filter's decimal literal over in Python's default 28-digit context: one of
that many significant digits may be a longer one rounded, and is not pushed."""
CALENDAR_SWITCH: Final = datetime.date(1582, 10, 15)
"""Spark's first Gregorian day. PySpark turns a literal of the ten days before it (1582-10-05
to 14, which its Julian conversion never had) into this day: `dt = DATE '1582-10-10'` arrived
as 1582-10-15 and the pushed filter kept that day's rows. A date literal of this day, or a
timestamp literal within a day of it (a time zone away), may be another day: not pushed."""
_NEGATABLE = frozenset({*_COMPARISONS, *_STRING_TESTS, "IsNull", "IsNotNull"})
"""Filters whose NOT means the same in Arrow as in SQL (NULL in, NULL or a definite answer out)."""


def to_expr(
    spark_filter: Any,
    schema: pa.Schema,
    *,
    exact_types: bool = True,
    own_types: pa.Schema | None = None,
) -> Expr | None:
    """The flightfeed expression of a pyspark.sql.datasource Filter, or None if it cannot be
    pushed (Spark keeps it). `exact_types`: `schema` holds the columns' own types; otherwise it
    is Spark's view of them (a query's columns), and a timestamp, string or binary column is
    cast to that view before it is compared (a query's timestamp[ms, tz=America/New_York]
    column met a literal of Spark's timestamp[us, tz=UTC], a dictionary or string_view one a
    string test: Arrow has no kernel for those). Other widened columns (`arrow_types.py`)
    compare as they are: Arrow casts an unsigned integer to the literal's type. `own_types`,
    the columns' own types when `schema` is Spark's view: a nanosecond timestamp is floored to
    Spark's microseconds, as the read floors it (Arrow's cast truncates toward zero: 1 ns
    before the epoch compared as the epoch)."""
    kind = type(spark_filter).__name__
    if kind == "Not":
        if type(spark_filter.child).__name__ not in _NEGATABLE:
            return None
        inner = to_expr(spark_filter.child, schema, exact_types=exact_types, own_types=own_types)
        return call("invert", inner) if inner is not None else None
    column = _column(spark_filter, schema)
    if column is None:
        return None
    name, field = column
    if kind == "IsNull":
        return call("is_null", col(name))
    if kind == "IsNotNull":
        return call("is_valid", col(name))
    if pa.types.is_floating(field.type):
        return None  # NaN and -0.0 mean other things to Spark (module docstring)
    own = own_types.field(name).type if own_types is not None and name in own_types.names else None
    values = _column_values(name, field.type, exact_types, own)
    if kind in _COMPARISONS:
        value = _literal(spark_filter.value, field.type)
        return call(_COMPARISONS[kind], values, value) if value is not None else None
    if kind == "EqualNullSafe":  # NULL <=> x is false for x not null: equal, then filtered
        if spark_filter.value is None:
            return call("is_null", col(name))
        value = _literal(spark_filter.value, field.type)
        return call("equal", values, value) if value is not None else None
    if kind == "In":
        return _is_in(values, field, spark_filter.value)
    if kind in _STRING_TESTS and pa.types.is_string(field.type):
        pattern = spark_filter.value
        if not isinstance(pattern, str):
            return None
        options = pc.MatchSubstringOptions(pattern)
        return call(_STRING_TESTS[kind], values, options=options)
    return None


def _column_values(
    name: str, seen_as: pa.DataType, exact_types: bool, own: pa.DataType | None
) -> Expr:
    """A column as the pushed filter compares it (see `to_expr`)."""
    if exact_types or not (
        pa.types.is_timestamp(seen_as) or pa.types.is_string(seen_as) or pa.types.is_binary(seen_as)
    ):
        return col(name)
    values: Expr = col(name)
    if own is not None and pa.types.is_timestamp(own) and own.unit == "ns":
        wall = call("cast", values, options=pc.CastOptions(pa.timestamp("ns")))  # (no zone)
        values = call("floor_temporal", wall, options=pc.RoundTemporalOptions(unit="microsecond"))
    options = pc.CastOptions(seen_as, allow_time_truncate=True)  # as Spark read the values
    return call("cast", values, options=options)


def _column(spark_filter: Any, schema: pa.Schema) -> tuple[str, pa.Field] | None:
    attribute = getattr(spark_filter, "attribute", None)
    if not isinstance(attribute, tuple) or len(attribute) != 1:
        return None  # a nested field: not pushed
    name = attribute[0]
    index = schema.get_field_index(name)
    if index < 0:
        return None
    return name, schema.field(index)


def _literal(value: Any, type_: pa.DataType) -> Expr | None:
    """`value` as a literal of the column's type, or None if Arrow cannot make it one."""
    scalar = _scalar(value, type_)
    return lit(scalar) if scalar is not None else None


def _scalar(value: Any, type_: pa.DataType) -> pa.Scalar | None:
    if value is None:
        return None
    if isinstance(value, Decimal) and len(value.as_tuple().digits) >= ROUNDED_DECIMAL_DIGITS:
        return None  # perhaps rounded on its way from Spark: Spark compares the exact value
    if _at_calendar_switch(value):
        return None  # perhaps another day on its way from Spark (CALENDAR_SWITCH)
    try:
        return pa.scalar(value).cast(type_)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def _at_calendar_switch(value: Any) -> bool:
    if isinstance(value, datetime.datetime):  # (a date too: tested first)
        day = (value.astimezone(datetime.UTC) if value.tzinfo else value).date()
        return abs((day - CALENDAR_SWITCH).days) <= 1
    return isinstance(value, datetime.date) and value == CALENDAR_SWITCH


def _is_in(column: Expr, field: pa.Field, values: Any) -> Expr | None:
    if not isinstance(values, tuple | list) or not values:
        return None
    given = [v for v in values if v is not None]  # a NULL in the list never matches
    scalars = [s for s in (_scalar(v, field.type) for v in given) if s is not None]
    if not scalars or len(scalars) != len(given):
        return None
    value_set = pa.array([s.as_py() for s in scalars], type=field.type)
    return call("is_in", column, options=pc.SetLookupOptions(value_set))


def split_filters(
    filters: list[Any],
    schema: pa.Schema,
    *,
    exact_types: bool = True,
    own_types: pa.Schema | None = None,
) -> tuple[list[Expr], list[Any]]:
    """(what flightfeed runs, what Spark must still run); the options as for `to_expr`."""
    pushed: list[Expr] = []
    kept: list[Any] = []
    for spark_filter in filters:
        expr = to_expr(spark_filter, schema, exact_types=exact_types, own_types=own_types)
        if expr is None:
            kept.append(spark_filter)
        else:
            pushed.append(expr)
    return pushed, kept
