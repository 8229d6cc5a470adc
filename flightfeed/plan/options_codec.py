"""pyarrow.compute FunctionOptions on the wire, made safe for untrusted bytes.

The bytes are Arrow's own FunctionOptions.serialize(): an IPC file holding one struct value
whose fields are the options and whose `_type_name` names the options class. Arrow's
deserializer trusts that struct's layout and crashes the process when it is wrong, so decoding
first validates the IPC fully and checks the struct's type field by field against a reference
instance of the named class (fields whose type varies with their value, like
CastOptions.to_type, are checked by a predicate instead). Only a clean re-serialization
of the checked value reaches Arrow.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument, PlanDecodeError
from .arrow_ipc import check_schema

_TYPE_NAME = "_type_name"


def _any(_: pa.DataType) -> bool:
    return True


_REFERENCES: dict[str, tuple[pc.FunctionOptions, dict[str, Callable[[pa.DataType], bool]]]] = {
    "CastOptions": (pc.CastOptions(pa.int8()), {"to_type": _any}),
    "SetLookupOptions": (pc.SetLookupOptions(pa.array([0])), {"value_set": pa.types.is_list}),
    "IndexOptions": (pc.IndexOptions(pa.scalar(0)), {"value": _any}),
    "StrptimeOptions": (pc.StrptimeOptions("%Y", "s"), {}),
    "MatchSubstringOptions": (pc.MatchSubstringOptions("x"), {}),
    "ReplaceSubstringOptions": (pc.ReplaceSubstringOptions("x", "y"), {}),
    "SplitPatternOptions": (pc.SplitPatternOptions("x"), {}),
    "ExtractRegexOptions": (pc.ExtractRegexOptions("x"), {}),
    "TrimOptions": (pc.TrimOptions(" "), {}),
    "PadOptions": (pc.PadOptions(1), {}),
    "SliceOptions": (pc.SliceOptions(0), {}),
}
"""Classes without a no-argument constructor: a reference instance, and the fields whose type
varies with the value (checked by the predicate instead of compared)."""

_BOUNDED_INTS = {"ndigits": 1000}
"""Integer fields Arrow loops over (round's ndigits: 10**15 would hang the worker)."""


def encode_options(options: pc.FunctionOptions) -> bytes:
    """Arrow's serialization; InvalidArgument if the receiver could not accept it."""
    data = bytes(options.serialize().to_pybytes())
    try:
        _checked_struct(data)
    except PlanDecodeError as exc:
        raise InvalidArgument(f"cannot send {type(options).__name__} in a plan: {exc}") from exc
    return data


def decode_options(data: bytes) -> pc.FunctionOptions:
    """Inverse of `encode_options`; PlanDecodeError for anything malformed or unsupported."""
    batch = _checked_struct(data)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    try:
        return pc.FunctionOptions.deserialize(sink.getvalue())
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise PlanDecodeError(f"invalid function options: {exc}") from exc


def _checked_struct(data: bytes) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        batches = [reader.get_batch(i) for i in range(min(reader.num_record_batches, 2))]
        check_schema(reader.schema)
        for batch in batches:
            batch.validate(full=True)
            _ = batch.columns  # pyarrow has no Python class for some types (KeyError)
    except Exception as exc:  # untrusted bytes: every failure is a decode error
        raise PlanDecodeError(f"function options are not valid Arrow IPC: {exc}") from exc
    if len(batches) != 1:
        raise PlanDecodeError("function options must hold exactly one batch")
    batch = batches[0]
    if batch.num_columns != 1 or batch.num_rows != 1:
        raise PlanDecodeError("function options must be one struct value")
    struct = batch.schema.field(0).type
    if not pa.types.is_struct(struct) or struct.get_field_index(_TYPE_NAME) < 0:
        raise PlanDecodeError("function options must be a struct with a _type_name")
    name_field = struct.field(struct.get_field_index(_TYPE_NAME))
    if name_field.type != pa.binary():
        raise PlanDecodeError("function options _type_name must be binary")
    raw_name = batch.column(0).field(_TYPE_NAME)[0].as_py()
    try:
        type_name = raw_name.decode("ascii")
    except (AttributeError, UnicodeDecodeError) as exc:
        raise PlanDecodeError(f"bad function options type name {raw_name!r}") from exc
    reference = _reference(type_name)
    free = _REFERENCES[type_name][1] if type_name in _REFERENCES else {}
    if [f.name for f in struct] != [f.name for f in reference]:
        raise PlanDecodeError(
            f"{type_name} fields {[f.name for f in struct]} are not {[f.name for f in reference]}"
        )
    for got, want in zip(struct, reference, strict=True):
        allowed = free.get(got.name)
        if not (allowed(got.type) if allowed is not None else got.type == want.type):
            raise PlanDecodeError(f"{type_name}.{got.name} cannot be of type {got.type}")
    values = batch.column(0)
    for name, bound in _BOUNDED_INTS.items():
        if struct.get_field_index(name) >= 0 and pa.types.is_integer(struct.field(name).type):
            value = values.field(name)[0].as_py()
            if value is not None and abs(value) > bound:
                raise PlanDecodeError(f"{type_name}.{name} = {value} is out of [-{bound}, {bound}]")
    return batch


@cache
def _reference(type_name: str) -> pa.StructType:
    """The struct type a genuine `type_name` serializes to."""
    if type_name in _REFERENCES:
        instance = _REFERENCES[type_name][0]
    else:
        cls = getattr(pc, type_name, None)
        if not (isinstance(cls, type) and issubclass(cls, pc.FunctionOptions)):
            raise PlanDecodeError(f"unknown function options type {type_name!r}")
        try:
            instance = cls()
        except Exception as exc:
            raise PlanDecodeError(f"function options {type_name} cannot travel in plans") from exc
    reader = pa.ipc.open_file(instance.serialize())
    struct: pa.StructType = reader.schema.field(0).type
    return struct


def options_field(options: object, name: str) -> object:
    """One field of pyarrow.compute FunctionOptions (pyarrow exposes few of them; their
    serialization, an IPC file of one struct row, holds them all), or None if absent."""
    if not isinstance(options, pc.FunctionOptions):
        return None
    try:
        row = pa.ipc.open_file(options.serialize()).read_all().column(0).chunk(0)
        return row.field(name)[0]
    except (pa.ArrowException, KeyError, IndexError):
        return None


def set_lookup_values(options: object) -> pa.Array | None:
    """The value set of is_in's SetLookupOptions, or None."""
    if not isinstance(options, pc.SetLookupOptions):
        return None
    found = options_field(options, "value_set")
    values = getattr(found, "values", None)
    return values if isinstance(values, pa.Array) else None
