"""Expressions ⇄ flightfeed.v1.Expr. Literals travel as Arrow IPC (every Arrow type round-trips),
options as Arrow's FunctionOptions serialization checked by options_codec.py; nothing is pickled."""

from __future__ import annotations

import betterproto2
import pyarrow as pa
import pyarrow.compute as pc

from .._generated.flightfeed.v1 import ColumnRef, FunctionCall, LiteralValue, NamedExpr
from .._generated.flightfeed.v1 import Expr as ExprProto
from ..errors import PlanDecodeError
from .arrow_ipc import read_ipc_stream, write_ipc_stream
from .expr import Call, Column, Expr, Literal
from .options_codec import decode_options, encode_options
from .protobuf import parse_message

MAX_EXPR_DEPTH = 256
"""Deeper expression trees are rejected: they only come from bugs or hostile peers."""

_LITERAL_FIELD = "literal"
LITERAL_MIN_DECODED_LIMIT = 1 << 20
"""A literal may decode to its size on the wire, or this much if that is more."""


def literal_to_ipc(value: pa.Scalar) -> bytes:
    """A scalar as an Arrow IPC stream of one batch, one column, one row."""
    batch = pa.RecordBatch.from_arrays([pa.repeat(value, 1)], names=[_LITERAL_FIELD])
    return write_ipc_stream(batch.schema, [batch])


def literal_from_ipc(data: bytes) -> pa.Scalar:
    """Inverse of `literal_to_ipc`; PlanDecodeError unless it is exactly one valid value."""
    limit = max(len(data), LITERAL_MIN_DECODED_LIMIT)  # ours are never compressed
    schema, batches = read_ipc_stream(data, "literal", max_decoded_bytes=limit)
    rows = sum(b.num_rows for b in batches)
    if len(schema) != 1 or rows != 1:
        raise PlanDecodeError(f"literal must hold 1 column and 1 row, got {len(schema)}x{rows}")
    return next(b for b in batches if b.num_rows).column(0)[0]


def expr_to_proto(expr: Expr) -> ExprProto:
    if isinstance(expr, Column):
        return ExprProto(column=ColumnRef(name=expr.name))
    if isinstance(expr, Literal):
        return ExprProto(literal=LiteralValue(arrow_ipc=literal_to_ipc(expr.value)))
    options = b"" if expr.options is None else encode_options(expr.options)
    return ExprProto(
        call=FunctionCall(
            function=expr.function,
            args=[expr_to_proto(a) for a in expr.args],
            options=options,
        )
    )


def expr_from_proto(msg: ExprProto | None, *, depth: int = 0) -> Expr:
    """Decode an expression; PlanDecodeError if it is missing, empty, too deep or malformed."""
    if msg is None:
        raise PlanDecodeError("missing expression")
    if depth > MAX_EXPR_DEPTH:
        raise PlanDecodeError(f"expression nested deeper than {MAX_EXPR_DEPTH}")
    field, value = betterproto2.which_one_of(msg, "expr")
    if field == "column" and isinstance(value, ColumnRef):
        return Column(value.name)
    if field == "literal" and isinstance(value, LiteralValue):
        return Literal(literal_from_ipc(value.arrow_ipc))
    if field == "call" and isinstance(value, FunctionCall):
        if not value.function:
            raise PlanDecodeError("function call without a function name")
        args = tuple(expr_from_proto(a, depth=depth + 1) for a in value.args)
        return Call(value.function, args, _options_from_bytes(value.function, value.options))
    raise PlanDecodeError("expression has none of column, literal, call set")


def _options_from_bytes(function: str, data: bytes) -> pc.FunctionOptions | None:
    if not data:
        return None
    try:
        return decode_options(data)
    except PlanDecodeError as exc:
        raise PlanDecodeError(f"options of function {function!r}: {exc.message}") from exc


def named_to_proto(expr: Expr, name: str) -> NamedExpr:
    return NamedExpr(expr=expr_to_proto(expr), name=name)


def named_from_proto(msg: NamedExpr) -> tuple[Expr, str]:
    if not msg.name:
        raise PlanDecodeError("named expression without a name")
    return expr_from_proto(msg.expr), msg.name


def encode_expr(expr: Expr) -> bytes:
    """An expression as flightfeed.v1.Expr bytes."""
    return bytes(expr_to_proto(expr))


def decode_expr(data: bytes) -> Expr:
    """An expression from untrusted flightfeed.v1.Expr bytes; PlanDecodeError if malformed."""
    return expr_from_proto(parse_message(ExprProto, data, "expression bytes"))
