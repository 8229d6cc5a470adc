"""Filter, take and sort for batches with string or binary view columns.

Arrow C++ (pyarrow 26) has no filter, take or sort kernel for the view layouts: a Filter over a
string_view column failed with INTERNAL "Function 'array_take' has no kernel matching input
types (string_view, uint16)". Such a batch goes through the plain layouts (string, binary) and
back: a copy of its view columns, paid only by batches that have them, once Arrow has refused
the fast path.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc


def filter_rows(batch: pa.RecordBatch, mask: pa.Array) -> pa.RecordBatch:
    """`batch.filter(mask)`, views included."""
    return _views_through_plain(batch, lambda rows: rows.filter(mask))


def take_rows(batch: pa.RecordBatch, indices: pa.Array) -> pa.RecordBatch:
    """`batch.take(indices)`, views included."""
    return _views_through_plain(batch, lambda rows: rows.take(indices))


def sort_indices(keys: pa.RecordBatch, order: list[tuple[str, str, str]]) -> pa.Array:
    """`pc.sort_indices` of the key columns, views included (the same bytes sort the same in
    either layout)."""
    try:
        return pc.sort_indices(keys, sort_keys=order)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        plain = _plain(keys)
        if plain is keys:
            raise
        return pc.sort_indices(plain, sort_keys=order)


def _views_through_plain(
    batch: pa.RecordBatch, select: Callable[[pa.RecordBatch], pa.RecordBatch]
) -> pa.RecordBatch:
    """`select(batch)`; where Arrow has no kernel for its view columns, `select` of the batch
    in the plain layouts, its columns then cast back to `batch`'s."""
    try:
        return select(batch)
    except pa.ArrowNotImplementedError:
        plain = _plain(batch)
        if plain is batch:
            raise
    out = select(plain)
    columns = [
        column if column.type == field.type else column.cast(field.type)
        for column, field in zip(out.columns, batch.schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with its view columns in the plain layouts; `batch` itself if it has none."""
    types = [_plain_type(field.type) for field in batch.schema]
    if all(t == field.type for t, field in zip(types, batch.schema, strict=True)):
        return batch
    columns = [
        column if column.type == t else column.cast(t)
        for column, t in zip(batch.columns, types, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _plain_type(type_: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(type_):
        return pa.large_string()
    if pa.types.is_binary_view(type_):
        return pa.large_binary()
    if pa.types.is_struct(type_):
        return pa.struct(
            [
                type_.field(i).with_type(_plain_type(type_.field(i).type))
                for i in range(type_.num_fields)
            ]
        )
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        value = type_.value_field.with_type(_plain_type(type_.value_type))
        return pa.list_(value) if pa.types.is_list(type_) else pa.large_list(value)
    return type_
