"""Filter, take, sort, join and concatenation of batches in layouts some Arrow kernels lack.

Arrow C++ (pyarrow 26) has no filter, take or sort kernel for string and binary views, nor
take for run-end encoded arrays, and Acero's join takes neither: a Filter over such a column
failed with INTERNAL "Function 'array_take' has no kernel matching input types (string_view,
uint16)". A batch with such columns goes through the plain layouts (large strings and binaries,
decoded runs) and back, once Arrow has refused the fast path: a copy of those columns, paid
only by the batches that have them. A sort key Arrow cannot order as it is (a dictionary among
several keys, a half float) is ordered by its plain values; one it cannot order at all (lists,
maps, intervals) is refused when the plan is built. Batches whose dictionaries differ are
unified before a join (Acero takes one dictionary per column), and batches whose dictionaries
outgrow their index type together are refused by name. Arrow's hash aggregates group by no
runs, and its min and max take no view, dictionary or runs: those get their plain values
(`plain_values`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument

Tabular = TypeVar("Tabular", pa.RecordBatch, pa.Table)
ColumnLike = TypeVar("ColumnLike", pa.Array, pa.ChunkedArray)


def filter_rows(batch: pa.RecordBatch, mask: pa.Array) -> pa.RecordBatch:
    """`batch.filter(mask)`, views and runs included."""
    return _through_plain(batch, lambda rows: rows.filter(mask))


def take_rows(batch: pa.RecordBatch, indices: pa.Array) -> pa.RecordBatch:
    """`batch.take(indices)`, views and runs included."""
    return _through_plain(batch, lambda rows: rows.take(indices))


def sort_indices(keys: pa.RecordBatch, order: Sequence[tuple[str, str, str]]) -> pa.Array:
    """`pc.sort_indices` of the key columns, also of keys Arrow orders only by their plain
    values (the same values sort the same in either layout)."""
    try:
        return pc.sort_indices(keys, sort_keys=order)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        sortable = _converted(keys, _sortable_type)
        if sortable is keys:
            raise
        return pc.sort_indices(sortable, sort_keys=order)


def check_sortable(keys: Sequence[tuple[str, pa.DataType]], what: str) -> None:
    """InvalidArgument naming the (label, type) keys `sort_indices` cannot order, found on
    zero rows (Arrow refuses a type whatever the rows)."""

    def refused(types: Sequence[pa.DataType]) -> bool:
        names = [f"k{i}" for i in range(len(types))]
        empty = pa.RecordBatch.from_arrays([pa.nulls(0, t) for t in types], names=names)
        try:
            sort_indices(empty, [(name, "ascending", "at_end") for name in names])
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return True
        return False

    if refused([t for _, t in keys]):
        alone = [f"{label} ({t})" for label, t in keys if refused([t])] or [
            f"{label} ({t})" for label, t in keys
        ]
        raise InvalidArgument(
            f"{what} cannot sort by {', '.join(alone)}: Arrow has no order for it"
        )


def plain_layouts(data: Tabular) -> Tabular:
    """`data` with its view and run-end encoded columns in the plain layouts; `data` itself if
    it has none."""
    return _converted(data, _plain_type)


def with_layouts_of(data: Tabular, schema: pa.Schema) -> Tabular:
    """`data`'s columns that `schema` names with another layout given it back: what
    `plain_layouts` took them from."""
    wanted = {f.name: f.type for f in schema}
    fields = [f.with_type(wanted.get(f.name, f.type)) for f in data.schema]
    if all(f.type == g.type for f, g in zip(fields, data.schema, strict=True)):
        return data
    columns = [restored(c, f.type) for c, f in zip(data.columns, fields, strict=True)]
    return type(data).from_arrays(columns, schema=pa.schema(fields, metadata=data.schema.metadata))


def plain_values(
    column: ColumnLike, *, dictionaries: bool = True, views: bool = True
) -> ColumnLike:
    """`column`'s values in the layout Arrow's hash aggregates take: runs decoded, and (unless
    told not to) dictionaries decoded and views as large strings or binaries. Arrow's min and
    max take none of those, nor do its group keys take runs. `column` itself if it is plain."""
    type_ = column.type
    if pa.types.is_run_end_encoded(type_):
        decoded = pc.run_end_decode(column)
        return plain_values(decoded, dictionaries=dictionaries, views=views)
    if dictionaries and pa.types.is_dictionary(type_):
        return plain_values(pc.dictionary_decode(column), views=views)
    if views and (pa.types.is_string_view(type_) or pa.types.is_binary_view(type_)):
        return column.cast(_plain_type(type_))
    return column


def one_dictionary_per_column(table: pa.Table, what: str) -> pa.Table:
    """`table` whose dictionary columns each hold one dictionary (Acero's join takes no other:
    'Unifying differing dictionaries')."""
    if not any(pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    try:
        return table.unify_dictionaries()
    except pa.ArrowInvalid:
        raise _outgrown(table.schema, what) from None


def concat_batches(batches: Sequence[pa.RecordBatch], what: str) -> pa.RecordBatch:
    """`pa.concat_batches`, refusing by name dictionaries whose batches together hold more
    values than their index type can index."""
    try:
        return pa.concat_batches(batches)
    except pa.ArrowInvalid:
        if not any(pa.types.is_dictionary(f.type) for f in batches[0].schema):
            raise
        raise _outgrown(batches[0].schema, what) from None


def _outgrown(schema: pa.Schema, what: str) -> InvalidArgument:
    narrow = [f"{f.name} ({f.type})" for f in schema if pa.types.is_dictionary(f.type)]
    return InvalidArgument(
        f"{what}: the dictionaries of {', '.join(narrow)} differ from batch to batch and hold"
        " more values together than their index type can index: cast the column to a"
        " dictionary with int32 indices, or to its values"
    )


def _through_plain(
    batch: pa.RecordBatch, select: Callable[[pa.RecordBatch], pa.RecordBatch]
) -> pa.RecordBatch:
    """`select(batch)`; where Arrow has no kernel for one of its layouts, `select` of the batch
    in the plain layouts, its columns then given their layouts back."""
    try:
        return select(batch)
    except pa.ArrowNotImplementedError:
        plain = plain_layouts(batch)
        if plain is batch:
            raise
    return with_layouts_of(select(plain), batch.schema)


def _converted(data: Tabular, convert: Callable[[pa.DataType], pa.DataType]) -> Tabular:
    types = [convert(f.type) for f in data.schema]
    if all(t == f.type for t, f in zip(types, data.schema, strict=True)):
        return data
    columns = [_to(c, t) for c, t in zip(data.columns, types, strict=True)]
    return type(data).from_arrays(columns, names=data.schema.names)


def _to(column: pa.Array | pa.ChunkedArray, type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if column.type == type_:
        return column
    if pa.types.is_run_end_encoded(column.type):
        column = pc.run_end_decode(column)
    if pa.types.is_dictionary(column.type) and not pa.types.is_dictionary(type_):
        column = pc.dictionary_decode(column)
    return column if column.type == type_ else column.cast(type_)


def restored(column: pa.Array | pa.ChunkedArray, type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """`column` (in a plain layout) given `type_`'s layout back."""
    if column.type == type_:
        return column
    if pa.types.is_run_end_encoded(type_):
        values = restored(column, type_.value_type)
        return pc.run_end_encode(values, run_end_type=type_.run_end_type)
    return column.cast(type_)


def _plain_type(type_: pa.DataType, *, top: bool = True) -> pa.DataType:
    """The layout Arrow's filter, take and join kernels all take for `type_`'s values (runs
    are decoded at the top only, by their own kernel)."""
    if pa.types.is_string_view(type_):
        return pa.large_string()
    if pa.types.is_binary_view(type_):
        return pa.large_binary()
    if pa.types.is_run_end_encoded(type_):
        return _plain_type(type_.value_type) if top else type_

    def plain(f: pa.Field) -> pa.Field:
        return f.with_type(_plain_type(f.type, top=False))

    if pa.types.is_struct(type_):
        return pa.struct([plain(type_.field(i)) for i in range(type_.num_fields)])
    if pa.types.is_list(type_):
        return pa.list_(plain(type_.value_field))
    if pa.types.is_large_list(type_):
        return pa.large_list(plain(type_.value_field))
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(plain(type_.value_field), type_.list_size)
    if pa.types.is_map(type_):
        return pa.map_(plain(type_.key_field), plain(type_.item_field), type_.keys_sorted)
    return type_


def _sortable_type(type_: pa.DataType) -> pa.DataType:
    """What Arrow's sort orders `type_`'s values as: their plain layout, a dictionary's
    values, a half float as a float."""
    if pa.types.is_dictionary(type_):
        return _sortable_type(type_.value_type)
    if pa.types.is_float16(type_):
        return pa.float32()
    return _plain_type(type_)
