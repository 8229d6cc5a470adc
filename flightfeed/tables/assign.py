"""Which written values a column takes, and how: values of its own kind, converted exactly.

The rule is `value_kinds`' (shared with the Spark writer, which casts by it before it sends):
a number into a number, a string into a string, a timestamp of any unit or zone into a
timestamp, a dictionary as its values; between kinds a write is refused, and a value out of its
column's range too. This module holds every client to it and words the refusal for a gRPC
client: the column, its table type and what was sent.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pt

from ..errors import InvalidArgument
from ..value_kinds import convert, converts


def assign(
    name: str, type_name: str, target: pa.DataType, values: pa.ChunkedArray
) -> pa.ChunkedArray:
    """`values` as column `name` (of table type `type_name`) stores them, or InvalidArgument
    naming the column and why."""
    if values.type == target:
        return values
    if pt.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if not converts(values.type, target):
        raise InvalidArgument(
            f"column {name!r} is {type_name}: it does not take {values.type} values (a write"
            f" converts values only within a kind, a number into a number, say: convert"
            f" them before writing)"
        )
    try:
        return convert(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidArgument(
            f"column {name!r} is {type_name}: cannot store {values.type} values ({exc})"
        ) from exc


__all__ = ["assign"]
