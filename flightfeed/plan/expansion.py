"""Functions whose output can dwarf their input, sized before they run.

`binary_repeat` turns a few bytes of plan into a gigabyte value, and the padding functions do
the same through their options; a function that writes a scalar into every row (a join with a
literal, coalesce, if_else, case_when) turns a large literal into that many copies. Each is
sized here from its arguments (Arrow C++ kernels, no per-row Python) and refused when the
output would not fit in the task's memory budget. Functions missing from this table produce
output of about their input's size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ResourceExhausted

_UTF8_MAX_CHAR_BYTES = 4


def _total(value: Any, length: int) -> float:
    """Sum of a numeric array, or a scalar counted once per row."""
    if isinstance(value, pa.Scalar):
        return float(value.as_py() or 0) * length
    total = pc.sum(value).as_py()
    return float(total or 0)


def _as_float(value: Any) -> Any:
    return pc.max_element_wise(pc.cast(value, pa.float64()), 0.0)


def _repeat_bytes(args: Sequence[Any], options: Any, length: int) -> float:
    values, repeats = args
    sizes = pc.multiply(_as_float(pc.binary_length(values)), _as_float(repeats))
    return _total(sizes, length)


def _pad_bytes(args: Sequence[Any], options: Any, length: int) -> float:
    # pyarrow exposes no accessors on FunctionOptions; the width is an integer in its repr.
    found = re.search(r"\bwidth=(\d+)", repr(options))
    width = int(found.group(1)) if found else 0
    return float(width) * _UTF8_MAX_CHAR_BYTES * length


def _replace_bytes(args: Sequence[Any], options: Any, length: int) -> float:
    """At most one replacement per input byte and one at each end of every value."""
    # The replacement string is part of the serialized options: their size bounds it.
    replacement = options.serialize().size if options is not None else 0
    sizes = _as_float(pc.binary_length(args[0]))
    return _total(sizes, length) * (1 + replacement) + 2.0 * replacement * length


def _broadcast_bytes(args: Sequence[Any], options: Any, length: int) -> float:
    """Every argument's bytes, a scalar's once per row: a bound for what the output holds."""
    total = 0.0
    for arg in args:
        if isinstance(arg, pa.Scalar):
            total += float(pa.repeat(arg, 1).nbytes) * length
        else:
            total += float(arg.nbytes)
    return total


_SIZERS: dict[str, Callable[[Sequence[Any], Any, int], float]] = {
    "binary_repeat": _repeat_bytes,
    "ascii_center": _pad_bytes,
    "ascii_lpad": _pad_bytes,
    "ascii_rpad": _pad_bytes,
    "utf8_center": _pad_bytes,
    "utf8_lpad": _pad_bytes,
    "utf8_rpad": _pad_bytes,
    "utf8_zero_fill": _pad_bytes,
    "replace_substring": _replace_bytes,
    "replace_substring_regex": _replace_bytes,
    "binary_join_element_wise": _broadcast_bytes,
    "coalesce": _broadcast_bytes,
    "if_else": _broadcast_bytes,
    "case_when": _broadcast_bytes,
    "choose": _broadcast_bytes,
}


def check_expansion(
    function: str, args: Sequence[Any], options: Any, length: int, limit: int | None
) -> None:
    """ResourceExhausted when `function` over `args` would produce more than `limit` bytes."""
    sizer = _SIZERS.get(function)
    if sizer is None or limit is None:
        return
    try:
        estimate = sizer(args, options, length)
    except (pa.ArrowException, TypeError, ValueError):
        return  # wrong argument types: the call itself reports them precisely
    if estimate > limit:
        raise ResourceExhausted(
            f"function {function!r} would produce about {estimate:.0f} bytes, over the task's"
            f" memory budget of {limit} bytes"
        )
