"""HoraeDB's read predicates: DataFusion logical expressions, translated to flightfeed's.

HoraeDB sends each filter it pushes into a remote read as datafusion-proto's LogicalExprNode
(`Expr::to_bytes`), and plans the pushdown as Exact: it does not filter those rows again. A
worker must therefore evaluate every predicate with DataFusion's meaning or refuse the read;
ignoring one would return wrong rows. What a SQL filter on a table becomes after DataFusion's
analyzer is translated here: columns, literals, AND/OR/NOT, comparisons, IS [NOT] NULL,
IS [NOT] TRUE/FALSE/UNKNOWN, [NOT] BETWEEN, [NOT] IN, [NOT] [I]LIKE, regex matches, + - * /,
unary minus, bitwise and/or/xor, string concatenation, CASE, casts and the scalar functions
of datafusion_functions.py. Anything else (other functions, modulo, shifts, TRY_CAST, ...) is
an InvalidArgument naming it.

SQL's three-valued logic is kept: AND and OR are Kleene, and `x IN (...)` is NULL when x is
NULL or when x is not found and the list holds a NULL, so NOT of it stays NULL. Where only a
filter's outcome matters (a predicate itself, or an AND/OR in one), NULL and false drop a row
alike, and IN becomes a plain set lookup the scan can push into DuckDB.

Float comparisons order NaN as DataFusion does, above every number and equal to itself
(datafusion_floats.py). Casts are Arrow C++'s checked casts; a float cast to an integer
truncates, as in arrow-rs, and NaN, an infinity or a value out of range is an error
(datafusion_casts.py). Integer arithmetic wraps on overflow in both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from .._generated.datafusion import (
    AliasNode,
    BetweenNode,
    BinaryExprNode,
    CaseNode,
    CastNode,
    InListNode,
    LikeNode,
    LogicalExprNode,
    ScalarFunctionNode,
    ScalarUdfExprNode,
)
from .._generated.datafusion import (
    Column as ColumnNode,
)
from ..errors import InvalidArgument
from ..messages import oneof_member
from ..plan.expr import Call, Column, Expr, Literal
from ..plan.expr_proto import MAX_EXPR_DEPTH
from ..plan.protobuf import parse_message
from .datafusion_casts import FLOAT_TO_INTEGER
from .datafusion_floats import FloatOrder
from .datafusion_functions import DATAFUSION_33_FUNCTIONS, function_call
from .datafusion_scalar import (
    FALSE,
    NULL_BOOL,
    TRUE,
    arrow_type,
    plain_values,
    scalar,
    string_option,
)

_COMPARISONS: Final = {
    "Eq": "equal",
    "NotEq": "not_equal",
    "Lt": "less",
    "LtEq": "less_equal",
    "Gt": "greater",
    "GtEq": "greater_equal",
}
_ARITHMETIC: Final = {
    # DataFusion's + - * wrap on integer overflow (add_wrapping, ...), as Arrow's unchecked
    # kernels do; / truncates integers and fails on a zero divisor in both.
    "Plus": "add",
    "Minus": "subtract",
    "Multiply": "multiply",
    "Divide": "divide",
    "BitwiseAnd": "bit_wise_and",
    "BitwiseOr": "bit_wise_or",
    "BitwiseXor": "bit_wise_xor",
}
_KLEENE: Final = {"And": "and_kleene", "Or": "or_kleene"}
_REGEX: Final = {
    # operator: (ignore case, negated)
    "RegexMatch": (False, False),
    "RegexIMatch": (True, False),
    "RegexNotMatch": (False, True),
    "RegexNotIMatch": (True, True),
}
_LIKE_ESCAPES: Final = ("", "\\")
"""DataFusion runs LIKE with no escape or with `\\` (any other is refused at its planning);
Arrow's match_like escapes with `\\`."""


def predicate_from_datafusion(data: bytes, schema: pa.Schema | None = None) -> Expr:
    """A predicate from untrusted LogicalExprNode bytes over a table of `schema` (its float
    comparisons take DataFusion's order: datafusion_floats.py); InvalidArgument naming what is
    malformed or not supported."""
    node = parse_message(LogicalExprNode, data, "DataFusion expression")
    return _translate(node, filtering=True, depth=0, order=FloatOrder(schema))


def _translate(
    node: LogicalExprNode | None, *, filtering: bool, depth: int, order: FloatOrder
) -> Expr:
    """`filtering`: only whether the value is true matters (NULL may become false)."""
    if node is None:
        raise InvalidArgument("a DataFusion expression is missing an operand")
    if depth > MAX_EXPR_DEPTH:
        raise InvalidArgument(f"a DataFusion expression nested deeper than {MAX_EXPR_DEPTH}")
    member, value = oneof_member(node, "ExprType")

    def inner(child: LogicalExprNode | None, keep_filtering: bool = False) -> Expr:
        return _translate(
            child, filtering=filtering and keep_filtering, depth=depth + 1, order=order
        )

    if isinstance(value, ColumnNode):
        if not value.name:
            raise InvalidArgument("a DataFusion column has no name")
        return Column(value.name)  # its relation qualifies it by table: there is one
    if member == "literal":
        return Literal(scalar(value))
    if isinstance(value, AliasNode):
        return inner(value.expr, keep_filtering=True)
    if isinstance(value, BinaryExprNode):
        return _binary(value, inner, order)
    if isinstance(value, BetweenNode):
        return _between(value, inner, order)
    if isinstance(value, InListNode):
        return _in_list(value, inner, order, filtering=filtering)
    if isinstance(value, LikeNode):
        return _like(value, inner, ignore_case=member == "ilike")
    if isinstance(value, CaseNode):
        return _case(value, inner, order)
    if isinstance(value, CastNode):
        return _cast(inner(value.expr), arrow_type(value.arrow_type), order)
    if isinstance(value, ScalarFunctionNode):
        name = DATAFUSION_33_FUNCTIONS.get(value.fun)
        if name is None:
            raise InvalidArgument(
                f"DataFusion's scalar function number {value.fun} (datafusion.ScalarFunction)"
                " is not supported in a predicate here"
            )
        return function_call(name, [inner(arg) for arg in value.args], order)
    if isinstance(value, ScalarUdfExprNode):
        return function_call(value.fun_name, [inner(arg) for arg in value.args], order)
    unary = _UNARY.get(member)
    if unary is not None:
        return unary(inner(getattr(value, "expr", None)))
    raise InvalidArgument(f"{_describe(member, value)} is not supported in a predicate here")


_UNARY: Final[dict[str, Callable[[Expr], Expr]]] = {
    "not_expr": lambda x: Call("invert", (x,)),
    "negative": lambda x: Call("negate", (x,)),
    "is_null_expr": lambda x: Call("is_null", (x,)),
    "is_not_null_expr": lambda x: Call("is_valid", (x,)),
    "is_unknown": lambda x: Call("is_null", (x,)),
    "is_not_unknown": lambda x: Call("is_valid", (x,)),
    "is_true": lambda x: Call("coalesce", (x, FALSE)),
    "is_not_false": lambda x: Call("coalesce", (x, TRUE)),
    "is_false": lambda x: Call("coalesce", (Call("invert", (x,)), FALSE)),
    "is_not_true": lambda x: Call("coalesce", (Call("invert", (x,)), TRUE)),
}
"""Unary nodes (each with one `expr`) and their meaning; IS TRUE and the like are never NULL."""


def _describe(member: str, value: object) -> str:
    if not member:
        return "a DataFusion expression with no kind set"
    return f"DataFusion expression {member.rstrip('_')!r}"


Translate = Callable[..., Expr]


def _binary(node: BinaryExprNode, inner: Translate, order: FloatOrder) -> Expr:
    """DataFusion flattens a left-deep chain of one operator into one node; an associative
    AND/OR chain becomes a balanced tree (a 10,000-term AND stays 14 deep), the others are
    folded left as DataFusion evaluates them."""
    operands, op = node.operands, node.op
    if len(operands) < 2:
        raise InvalidArgument(f"DataFusion's {op!r} needs 2 operands or more, got {len(operands)}")
    if op in _KLEENE:
        return _balanced(_KLEENE[op], [inner(o, keep_filtering=True) for o in operands])
    if len(operands) > MAX_EXPR_DEPTH:
        raise InvalidArgument(f"a chain of {len(operands)} {op!r} is deeper than {MAX_EXPR_DEPTH}")
    combine = _binary_operator(op, order)
    result = inner(operands[0])
    for operand in operands[1:]:
        result = combine(result, inner(operand))
    return result


def _binary_operator(op: str, order: FloatOrder) -> Callable[[Expr, Expr], Expr]:
    if op in _COMPARISONS:
        function = _COMPARISONS[op]
        return lambda left, right: order.compare(function, left, right)
    if op in _ARITHMETIC:
        arithmetic = _ARITHMETIC[op]
        return lambda left, right: Call(arithmetic, (left, right))
    if op == "IsNotDistinctFrom":
        return lambda left, right: _not_distinct(left, right, order)
    if op == "IsDistinctFrom":
        return lambda left, right: Call("invert", (_not_distinct(left, right, order),))
    if op == "StringConcat":
        return lambda left, right: Call("binary_join_element_wise", (left, right, _EMPTY))
    if op in _REGEX:
        ignore_case, negated = _REGEX[op]
        return lambda left, right: _matches(
            "match_substring_regex", left, right, op, ignore_case, negated
        )
    raise InvalidArgument(f"DataFusion operator {op!r} is not supported in a predicate here")


_EMPTY: Final = Literal(pa.scalar(""))


def _not_distinct(left: Expr, right: Expr, order: FloatOrder) -> Expr:
    """Equal, with NULL equal to NULL and unequal to any value: never NULL."""
    both_null = Call("and", (Call("is_null", (left,)), Call("is_null", (right,))))
    return Call("coalesce", (order.compare("equal", left, right), both_null))


def _balanced(function: str, args: Sequence[Expr]) -> Expr:
    if len(args) == 1:
        return args[0]
    middle = len(args) // 2
    return Call(function, (_balanced(function, args[:middle]), _balanced(function, args[middle:])))


def _between(node: BetweenNode, inner: Translate, order: FloatOrder) -> Expr:
    """`x BETWEEN a AND b` is `x >= a AND x <= b`; NOT BETWEEN is `x < a OR x > b`, its
    Kleene negation."""
    value, low, high = inner(node.expr), inner(node.low), inner(node.high)
    if node.negated:
        below, above = order.compare("less", value, low), order.compare("greater", value, high)
        return Call("or_kleene", (below, above))
    from_low = order.compare("greater_equal", value, low)
    return Call("and_kleene", (from_low, order.compare("less_equal", value, high)))


def _in_list(node: InListNode, inner: Translate, order: FloatOrder, *, filtering: bool) -> Expr:
    value = inner(node.expr)
    literals = [item.literal for item in node.list]
    if literals and all(literal is not None for literal in literals):
        # A long list is literals of one type: one Arrow array, not a scalar each (100,000
        # took 1.2 s).
        array = plain_values([literal for literal in literals if literal is not None])
        if array is not None:
            holds_null = array.null_count > 0
            present = array.drop_null()
            return _value_set(value, present, holds_null, node.negated, filtering)
    items = [inner(item) for item in node.list]
    if not all(isinstance(item, Literal) for item in items):
        # Computed items: `x IN (a, b)` is `x = a OR x = b` in SQL's logic, NULLs included.
        found = _balanced("or_kleene", [order.compare("equal", value, item) for item in items])
        return _negated(found, node.negated) if items else FALSE
    scalars = [item.value for item in items if isinstance(item, Literal)]
    present = [s for s in scalars if s.is_valid]
    try:
        array = pa.array(present) if present else None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgument(f"the values of a DataFusion IN list differ in type: {exc}") from None
    holds_null = len(present) < len(scalars)
    return _value_set(value, array, holds_null, node.negated, filtering)


def _value_set(
    value: Expr,
    present: pa.Array | None,
    holds_null: bool,
    negated: bool,
    filtering: bool,
) -> Expr:
    """`value [NOT] IN` the `present` values (and NULL if `holds_null`) in SQL's logic: NULL
    when value is NULL, or when it is not found and the list holds a NULL. Where only a
    filter's outcome matters, NULL and false alike drop the row, and a positive IN is a plain
    set lookup (DuckDB's scan takes it). Arrow's lookup of floats is DataFusion's: NaN finds
    NaN, and -0.0 does not find 0.0 (DataFusion's `=` finds it, and so does the OR its
    optimizer makes of a list of three or fewer)."""
    lookup: Expr = FALSE
    if present is not None and len(present):
        lookup = Call("is_in", (value,), pc.SetLookupOptions(present))
    if filtering and not negated:
        return lookup
    if filtering and holds_null:
        return FALSE  # NOT IN a list holding NULL is never true
    if filtering:
        return Call("and_kleene", (Call("is_valid", (value,)), Call("invert", (lookup,))))
    exact = Call("if_else", (Call("is_null", (value,)), NULL_BOOL, lookup))
    if holds_null:
        exact = Call("or_kleene", (exact, NULL_BOOL))
    return _negated(exact, negated)


def _like(node: LikeNode, inner: Translate, *, ignore_case: bool) -> Expr:
    if node.escape_char not in _LIKE_ESCAPES:
        raise InvalidArgument(
            f"LIKE with escape character {node.escape_char!r} is not supported: only '\\\\'"
        )
    word = "ILIKE" if ignore_case else "LIKE"
    value, pattern = inner(node.expr), inner(node.pattern)
    text = string_option(pattern, f"the pattern of {word}")
    if text is not None and (len(text) - len(text.rstrip("\\"))) % 2:
        # A pattern ending in an escape that escapes nothing: DataFusion matches a backslash
        # there, Arrow would drop it.
        pattern = Literal(pa.scalar(text + "\\", pa.string()))
    return _matches("match_like", value, pattern, word, ignore_case, node.negated)


def _matches(
    function: str, value: Expr, pattern: Expr, what: str, ignore_case: bool, negated: bool
) -> Expr:
    """A LIKE or regex match: Arrow takes the pattern as an option, so it must be a literal.
    A NULL pattern matches as NULL, whatever the value."""
    text = string_option(pattern, f"the pattern of {what}")
    if text is None:
        return NULL_BOOL
    if function == "match_substring_regex":
        _check_regex(text)
    options = pc.MatchSubstringOptions(text, ignore_case=ignore_case)
    return _negated(Call(function, (value,), options), negated)


def _case(node: CaseNode, inner: Translate, order: FloatOrder) -> Expr:
    """Arrow's case_when: the value of the first condition that is true (NULL is not), else the
    ELSE value, else NULL. `CASE x WHEN a` tests `x = a`, which is never true for a NULL."""
    branches = node.when_then_expr
    if not branches:
        raise InvalidArgument("a DataFusion CASE has no WHEN")
    subject = None if node.expr is None else inner(node.expr)
    conditions: list[Expr] = []
    values: list[Expr] = []
    for branch in branches:
        when = inner(branch.when_expr)
        conditions.append(when if subject is None else order.same(subject, when))
        values.append(inner(branch.then_expr))
    if node.else_expr is not None:
        values.append(inner(node.else_expr))
    names = pc.MakeStructOptions([str(i) for i in range(len(conditions))])
    return Call("case_when", (Call("make_struct", tuple(conditions), names), *values))


def _cast(value: Expr, target: pa.DataType, order: FloatOrder) -> Expr:
    source = order.type_of(value)
    if _written_differently(source) and (
        pa.types.is_string(target) or pa.types.is_large_string(target)
    ):
        raise InvalidArgument(
            f"DataFusion's cast of {source} to a string is not supported in a predicate here:"
            " its text differs from Arrow's (1.0 is '1.0' there, '1' here)"
        )
    if source is not None and _float_and_decimal(source, target):
        raise InvalidArgument(
            f"DataFusion's cast of {source} to {target} is not supported in a predicate here:"
            " it rounds otherwise than Arrow's (0.125 is 0.13 there, 0.12 here)"
        )
    to_integer = FLOAT_TO_INTEGER.get(target)
    if to_integer is not None and (source is None or pa.types.is_floating(source)):
        # arrow-rs truncates a float cast to an integer and fails on NaN, an infinity or a
        # value out of range, which Arrow's truncating cast maps silently (datafusion_casts.py).
        return Call(to_integer.name, (value,))
    options = pc.CastOptions.safe(target)
    options.allow_float_truncate = True  # an integer cast to a float rounds, as in arrow-rs
    return Call("cast", (value,), options)


_RUST_ONLY_REGEX: Final = re.compile(
    r"\\[dDwWsSbB]|\[\[|&&|--|~~|\(\?[a-zA-Z]*u|\+\+|\*\+|\?\+|\}\+"
)
"""Where Rust's `regex` (DataFusion's) and RE2 (Arrow's) read a pattern differently: the
Perl classes and word boundaries are Unicode-aware in Rust and ASCII in RE2, Rust nests
classes and has set operations in them (`[[a]b]`, `[a&&b]`), and `(?u)` and possessive
repetitions (`a++`) are Rust's syntax only. Such a pattern is refused, never half-matched."""


def _check_regex(pattern: str) -> None:
    found = _RUST_ONLY_REGEX.search(pattern)
    if found is not None:
        raise InvalidArgument(
            f"a DataFusion regular expression with {found.group()!r} is not supported in a"
            " predicate here: Rust's regex and Arrow's RE2 read it differently"
        )


def _float_and_decimal(source: pa.DataType, target: pa.DataType) -> bool:
    kinds = (source, target)
    return any(pa.types.is_floating(k) for k in kinds) and any(
        pa.types.is_decimal(k) for k in kinds
    )


def _written_differently(kind: pa.DataType | None) -> bool:
    """Types arrow-rs and Arrow C++ write as different text: floats, times, timestamps,
    durations (dates alike, integers, decimals and booleans too)."""
    if kind is None or pa.types.is_date(kind):
        return False
    return bool(pa.types.is_floating(kind) or pa.types.is_temporal(kind))


def _negated(expr: Expr, negated: bool) -> Expr:
    return Call("invert", (expr,)) if negated else expr


__all__ = ["predicate_from_datafusion"]
