"""Expression IR: columns, typed literals and named function calls, evaluated vectorized.

A call names a session scalar UDF or a pyarrow.compute function (session UDFs win, so a
session can override a built-in); evaluation is one kernel call per node of the expression
tree per batch, never a loop over rows. Literals stay `pa.Scalar`s so kernels broadcast them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DataError, ExecutionError, FlightfeedError, InvalidArgument, UnknownUdfError
from .expansion import check_expansion
from .functions import FunctionRegistry, ScalarUdf

_CALLABLE_KINDS = frozenset({"scalar", "vector", "meta"})


@dataclass(frozen=True)
class Column:
    """A column of the input batch, by name."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Literal:
    """A typed scalar constant (any Arrow type)."""

    value: pa.Scalar

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal):
            return NotImplemented
        from .expr_proto import literal_to_ipc

        return bool(self.value.type == other.value.type) and literal_to_ipc(
            self.value
        ) == literal_to_ipc(other.value)

    def __hash__(self) -> int:
        return hash(str(self.value.type))

    def __str__(self) -> str:
        return f"{self.value.as_py()!r}::{self.value.type}"


@dataclass(frozen=True, eq=False)
class Call:
    """A function call: a session UDF or a pyarrow.compute function with optional options."""

    function: str
    args: tuple[Expr, ...] = ()
    options: pc.FunctionOptions | None = None

    def __eq__(self, other: object) -> bool:
        # Options compare by their serialization: pyarrow crashes on `None == options`.
        if not isinstance(other, Call):
            return NotImplemented
        return (
            self.function == other.function
            and self.args == other.args
            and _options_key(self.options) == _options_key(other.options)
        )

    def __hash__(self) -> int:
        return hash((self.function, self.args))

    def __str__(self) -> str:
        return f"{self.function}({', '.join(str(a) for a in self.args)})"


Expr = Column | Literal | Call


def _options_key(options: pc.FunctionOptions | None) -> bytes | None:
    return None if options is None else bytes(options.serialize().to_pybytes())


def col(name: str) -> Column:
    return Column(name)


def lit(value: object, type: pa.DataType | None = None) -> Literal:
    """A literal from a Python value or a pa.Scalar, optionally of an explicit type."""
    if isinstance(value, pa.Scalar):
        return Literal(value if type is None else value.cast(type))
    return Literal(pa.scalar(value, type=type))


def call(function: str, *args: Expr | object, options: pc.FunctionOptions | None = None) -> Call:
    """A call; non-expression arguments become literals."""
    exprs = tuple(a if isinstance(a, Column | Literal | Call) else lit(a) for a in args)
    return Call(function, exprs, options)


@lru_cache(maxsize=1024)
def _builtin(name: str) -> Any:
    """A pyarrow.compute function usable in scalar context (aggregates are not)."""
    try:
        function = pc.get_function(name)
    except (KeyError, pa.ArrowException):
        function = None
    if function is None:
        raise UnknownUdfError(
            f"unknown function {name!r}: neither a session UDF nor a pyarrow.compute function"
        )
    if function.kind not in _CALLABLE_KINDS:
        raise InvalidArgument(
            f"function {name!r} is a {function.kind} function; use it in an aggregate expression"
        )
    return function


def to_dataset_expression(expr: Expr) -> pc.Expression:
    """The expression as pyarrow.dataset evaluates it (a scan's pushed-down filter): only
    pyarrow.compute functions, no session UDFs (UnknownUdfError names the one that is not)."""
    if isinstance(expr, Column):
        return pc.field(expr.name)
    if isinstance(expr, Literal):
        return pc.scalar(expr.value)
    function = _builtin(expr.function)
    args = [to_dataset_expression(arg) for arg in expr.args]
    # Expression._call is what every pyarrow.compute wrapper calls for Expression arguments;
    # the wrappers themselves cannot stand in (pc.and_ builds a call to "and_", which does not
    # exist). tests/unit/plan/test_parquet_scan.py pushes and, or and is_in through it.
    return pc.Expression._call(function.name, args, expr.options)


def calls_udf(exprs: Iterable[Expr], functions: FunctionRegistry) -> bool:
    """Whether any of the expressions calls a session UDF (user code, possibly slow Python)."""
    stack: list[Expr] = list(exprs)
    while stack:
        node = stack.pop()
        if isinstance(node, Call):
            if functions.scalar_udf(node.function) is not None:
                return True
            stack.extend(node.args)
    return False


def resolve_scalar(name: str, functions: FunctionRegistry) -> ScalarUdf | Any:
    """The UDF or pyarrow.compute function a call names; UnknownUdfError if neither."""
    udf = functions.scalar_udf(name)
    return udf if udf is not None else _builtin(name)


def evaluate(
    expr: Expr,
    batch: pa.RecordBatch,
    functions: FunctionRegistry,
    *,
    error: type[FlightfeedError] = ExecutionError,
) -> pa.Array:
    """The expression over `batch`, as an array of `batch.num_rows` values.

    Kernel and UDF failures raise `error` (ExecutionError while running, InvalidArgument while
    planning); unknown functions raise UnknownUdfError.
    """
    value = _eval(expr, batch, functions, error, infer=False)
    array = _as_array(value, batch.num_rows)
    if len(array) != batch.num_rows:
        raise error(f"expression {expr} produced {len(array)} rows for {batch.num_rows}")
    return array


def output_type(expr: Expr, schema: pa.Schema, functions: FunctionRegistry) -> pa.DataType:
    """The type `expr` produces over `schema`, found by evaluating it on zero rows.

    Validates the expression as a side effect: missing columns, unknown functions and
    argument-type errors surface here, at planning time. UDFs are not called.
    """
    empty = pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
    return _eval(expr, empty, functions, InvalidArgument, infer=True).type


def _as_array(value: Any, length: int) -> pa.Array:
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, length)
    return value


def _eval(
    expr: Expr,
    batch: pa.RecordBatch,
    functions: FunctionRegistry,
    error: type[FlightfeedError],
    *,
    infer: bool,
) -> Any:
    if isinstance(expr, Column):
        index = batch.schema.get_field_index(expr.name)
        if index < 0:
            raise error(f"column {expr.name!r} not found (or ambiguous) in {batch.schema.names}")
        return batch.column(index)
    if isinstance(expr, Literal):
        # Inferring types computes nothing: a literal is zero rows of its type, so a call over
        # literals only (binary_repeat of a constant) is not evaluated while planning.
        return pa.nulls(0, expr.value.type) if infer else expr.value
    args = [_eval(arg, batch, functions, error, infer=infer) for arg in expr.args]
    target = resolve_scalar(expr.function, functions)
    if isinstance(target, ScalarUdf):
        if infer:
            return pa.nulls(0, target.return_type)
        return _call_udf(target, args, batch.num_rows)
    if not infer:
        budget = getattr(functions, "memory_budget_bytes", None)
        check_expansion(expr.function, args, expr.options, max(batch.num_rows, 1), budget)
    try:
        # `length` only sizes nullary functions (random); with arguments it must stay unset.
        try:
            return target.call(args, expr.options, length=None if args else batch.num_rows)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            decoded = [_runs_decoded(arg) for arg in args]
            if all(new is old for new, old in zip(decoded, args, strict=True)):
                raise
            # Few kernels take run-end encoded values (comparisons, is_in and casts do not):
            # the function sees their plain values, as it would a column that was never encoded.
            return target.call(decoded, expr.options, length=None)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        if error is ExecutionError and isinstance(exc, pa.ArrowInvalid):
            error = DataError  # (the values' fault: division by zero, a cast, an overflow)
        raise error(f"function {expr.function!r} failed: {exc}") from exc


def _runs_decoded(value: Any) -> Any:
    if isinstance(value, pa.Array | pa.ChunkedArray) and pa.types.is_run_end_encoded(value.type):
        return pc.run_end_decode(value)
    return value


def _call_udf(udf: ScalarUdf, args: list[Any], length: int) -> pa.Array:
    arrays = [_as_array(arg, length) for arg in args]
    try:
        result = udf.func(*arrays)
        if not isinstance(result, pa.Array | pa.ChunkedArray):
            result = pa.array(result, type=udf.return_type)
        result = _as_array(result, length)
        if result.type != udf.return_type:
            result = result.cast(udf.return_type)
    except FlightfeedError:
        raise
    except Exception as exc:
        raise ExecutionError(f"UDF {udf.name!r} failed: {exc}") from exc
    if len(result) != length:
        raise ExecutionError(f"UDF {udf.name!r} returned {len(result)} rows for {length}")
    return result
