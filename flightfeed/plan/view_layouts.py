"""Filter, take and sort for batches with string or binary view columns.

Arrow C++ (pyarrow 26) has no filter, take or sort kernel for the view layouts: a Filter over a
string_view column failed with INTERNAL "Function 'array_take' has no kernel matching input
types (string_view, uint16)". Such a batch goes through the plain layouts (string, binary) and
back: a copy of its view columns, paid only by batches that have them, once Arrow has refused
the fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

Tabular = TypeVar("Tabular", pa.RecordBatch, pa.Table)


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
        plain = plain_layouts(keys)
        if plain is keys:
            raise
        return pc.sort_indices(plain, sort_keys=order)


def plain_layouts(data: Tabular) -> Tabular:
    """`data` with its view columns in the plain layouts; `data` itself if it has none."""
    plain = pa.schema([field.with_type(_plain_type(field.type)) for field in data.schema])
    return data if plain.equals(data.schema) else data.cast(plain)


def with_layouts_of(data: Tabular, schema: pa.Schema) -> Tabular:
    """`data`'s columns named in `schema` cast back to its view layouts (the others as they
    are): what `plain_layouts` took them from."""
    views = {f.name: f.type for f in schema if _plain_type(f.type) != f.type}
    if not views:
        return data
    return data.cast(pa.schema([f.with_type(views.get(f.name, f.type)) for f in data.schema]))


def _views_through_plain(
    batch: pa.RecordBatch, select: Callable[[pa.RecordBatch], pa.RecordBatch]
) -> pa.RecordBatch:
    """`select(batch)`; where Arrow has no kernel for its view columns, `select` of the batch
    in the plain layouts, its columns then cast back to `batch`'s."""
    try:
        return select(batch)
    except pa.ArrowNotImplementedError:
        plain = plain_layouts(batch)
        if plain is batch:
            raise
    return with_layouts_of(select(plain), batch.schema)


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
