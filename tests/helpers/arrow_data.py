"""Arrow test data: random arrays of any type, hypothesis type strategies, type-family cases.

`random_array` builds a valid array of exactly the requested type from a numpy generator, so
property tests draw only the (small) structure with hypothesis and get the data cheaply.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st


class RationalType(pa.ExtensionType):  # type: ignore[misc]
    """A user extension type (struct storage) registered with Arrow for the tests."""

    def __init__(self) -> None:
        storage = pa.struct([pa.field("num", pa.int64()), pa.field("den", pa.int32())])
        super().__init__(storage, "flightfeed.test.rational")

    def __arrow_ext_serialize__(self) -> bytes:
        return b'{"v": 1}'

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> RationalType:
        if json.loads(serialized) != {"v": 1}:
            raise ValueError(f"unexpected rational metadata {serialized!r}")
        return cls()


class LabelType(pa.ExtensionType):  # type: ignore[misc]
    """A parametrized extension type: the parameter travels in the serialized metadata."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        super().__init__(pa.string(), "flightfeed.test.label")

    def __arrow_ext_serialize__(self) -> bytes:
        return self.unit.encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> LabelType:
        return cls(serialized.decode())


class CategoryType(pa.ExtensionType):  # type: ignore[misc]
    """An extension type over a dictionary: its dictionaries travel as the storage's would."""

    def __init__(self) -> None:
        super().__init__(pa.dictionary(pa.int8(), pa.string()), "flightfeed.test.category")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> CategoryType:
        return cls()


def _register(ext: Any) -> None:
    with contextlib.suppress(pa.ArrowKeyError):  # already registered in this process
        pa.register_extension_type(ext)


_register(RationalType())
_register(LabelType("m"))
_register(CategoryType())

# --- random arrays ---------------------------------------------------------------------------

_ALPHABET = "ab€😀\x00 zé"


def _mask(rng: np.random.Generator, n: int, nullable: bool, density: float) -> Any:
    if not nullable or n == 0:
        return None
    return rng.random(n) < density


def _nulls_list(mask: Any, n: int) -> list[bool]:
    return [False] * n if mask is None else [bool(m) for m in mask]


def _text(rng: np.random.Generator, max_len: int) -> str:
    length = int(rng.integers(0, max_len + 1))
    return "".join(_ALPHABET[int(i)] for i in rng.integers(0, len(_ALPHABET), length))


def _bytes(rng: np.random.Generator, max_len: int) -> bytes:
    return rng.bytes(int(rng.integers(0, max_len + 1)))


def _int_view(
    rng: np.random.Generator, t: Any, n: int, mask: Any, lo: int, hi: int, storage: Any
) -> Any:
    dtype = np.int32 if storage == pa.int32() else np.int64
    values = rng.integers(lo, hi, size=n, dtype=dtype, endpoint=True)
    return pa.array(values, type=storage, mask=mask).view(t)


def _offsets(lengths: Any, kind: Any) -> Any:
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=kind)


def random_array(
    t: Any,
    n: int,
    rng: np.random.Generator,
    *,
    nullable: bool = True,
    density: float = 0.25,
) -> Any:
    """A valid array of type `t` and length `n`; nulls only where the type allows them."""
    arr = _random_array(t, n, rng, nullable, density)
    if not arr.type.equals(t):
        raise AssertionError(f"generator built {arr.type}, wanted {t}")
    arr.validate(full=True)
    return arr


def _random_array(t: Any, n: int, rng: np.random.Generator, nullable: bool, density: float) -> Any:
    types = pa.types
    mask = _mask(rng, n, nullable, density)
    if types.is_null(t):
        return pa.nulls(n)
    if isinstance(t, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(
            t, _random_array(t.storage_type, n, rng, nullable, density)
        )
    if types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5, type=t, mask=mask)
    if types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        ints = rng.integers(info.min, info.max, size=n, dtype=info.dtype, endpoint=True)
        return pa.array(ints, type=t, mask=mask)
    if types.is_floating(t):
        floats = rng.standard_normal(n) * 1000
        floats[rng.random(n) < 0.1] = np.inf
        return pa.array(floats.astype(t.to_pandas_dtype()), type=t, mask=mask)
    if types.is_decimal(t):
        py = random.Random(int(rng.integers(1 << 32)))
        bound = 10**t.precision - 1
        nulls = _nulls_list(mask, n)
        decimals = [
            None if nulls[i] else Decimal(py.randint(-bound, bound)).scaleb(-t.scale)
            for i in range(n)
        ]
        return pa.array(decimals, type=t)
    if types.is_date32(t):
        return _int_view(rng, t, n, mask, -100_000, 100_000, pa.int32())
    if types.is_date64(t):
        days = rng.integers(-100_000, 100_000, size=n)
        return pa.array(days * 86_400_000, type=pa.int64(), mask=mask).view(t)
    if types.is_time32(t):
        top = 86_399 if t.unit == "s" else 86_399_999
        return _int_view(rng, t, n, mask, 0, top, pa.int32())
    if types.is_time64(t):
        top = 86_399_999_999 if t.unit == "us" else 86_399_999_999_999
        return _int_view(rng, t, n, mask, 0, top, pa.int64())
    if types.is_timestamp(t) or types.is_duration(t):
        return _int_view(rng, t, n, mask, -(10**15), 10**15, pa.int64())
    if t == pa.month_day_nano_interval():
        nulls = _nulls_list(mask, n)
        triples = rng.integers(-(10**6), 10**6, size=(n, 3))
        return pa.array(
            [None if nulls[i] else tuple(int(v) for v in triples[i]) for i in range(n)], type=t
        )
    if types.is_string(t) or types.is_large_string(t) or types.is_string_view(t):
        nulls = _nulls_list(mask, n)
        # view types inline up to 12 bytes: mix short and long values
        return pa.array([None if nulls[i] else _text(rng, 8 if i % 2 else 20) for i in range(n)], t)
    if types.is_binary(t) or types.is_large_binary(t) or types.is_binary_view(t):
        nulls = _nulls_list(mask, n)
        return pa.array(
            [None if nulls[i] else _bytes(rng, 8 if i % 2 else 30) for i in range(n)], t
        )
    if types.is_fixed_size_binary(t):
        nulls = _nulls_list(mask, n)
        return pa.array([None if nulls[i] else rng.bytes(t.byte_width) for i in range(n)], t)
    if types.is_dictionary(t):
        size = int(rng.integers(0 if nullable else 1, 6))
        dictionary = _random_array(t.value_type, size, rng, False, density)
        if size == 0:
            indices = pa.nulls(n, t.index_type)
        else:
            raw = rng.integers(0, size, size=n)
            indices = pa.array(raw, type=t.index_type, mask=mask)
        return pa.DictionaryArray.from_arrays(indices, dictionary, ordered=t.ordered)
    if types.is_list(t) or types.is_large_list(t):
        lengths = rng.integers(0, 4, size=n)
        values = _random_array(
            t.value_type, int(lengths.sum()), rng, t.value_field.nullable, density
        )
        kind = pa.int32() if types.is_list(t) else pa.int64()
        cls = pa.ListArray if types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(_offsets(lengths, kind), values, type=t, mask=_pa_mask(mask))
    if types.is_list_view(t) or types.is_large_list_view(t):
        total = int(rng.integers(0, 3 * n + 1))
        values = _random_array(t.value_type, total, rng, t.value_field.nullable, density)
        sizes = rng.integers(0, min(total, 3) + 1, size=n)
        offsets = [int(rng.integers(0, total - s + 1)) for s in sizes]  # views may overlap
        kind = pa.int32() if types.is_list_view(t) else pa.int64()
        cls = pa.ListViewArray if types.is_list_view(t) else pa.LargeListViewArray
        return cls.from_arrays(
            pa.array(offsets, kind), pa.array(sizes, kind), values, type=t, mask=_pa_mask(mask)
        )
    if types.is_fixed_size_list(t):
        values = _random_array(t.value_type, n * t.list_size, rng, t.value_field.nullable, density)
        return pa.FixedSizeListArray.from_arrays(values, type=t, mask=_pa_mask(mask))
    if types.is_map(t):
        lengths = rng.integers(0, 4, size=n)
        total = int(lengths.sum())
        keys = _random_array(t.key_type, total, rng, False, density)
        items = _random_array(t.item_type, total, rng, t.item_field.nullable, density)
        return pa.MapArray.from_arrays(
            _offsets(lengths, pa.int32()), keys, items, type=t, mask=_pa_mask(mask)
        )
    if types.is_struct(t):
        children = [_random_array(f.type, n, rng, f.nullable, density) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=_pa_mask(mask))
    if types.is_union(t):
        return _random_union(t, n, rng, density)
    if types.is_run_end_encoded(t):
        return _random_ree(t, n, rng, nullable, density)
    raise NotImplementedError(f"no generator for {t}")


def _pa_mask(mask: Any) -> Any:
    return None if mask is None else pa.array(mask, pa.bool_())


def _random_union(t: Any, n: int, rng: np.random.Generator, density: float) -> Any:
    codes = list(t.type_codes)
    names = [f.name for f in t]
    picks = rng.integers(0, len(codes), size=n)
    type_ids = pa.array(np.array(codes, dtype=np.int8)[picks], pa.int8())
    if t.mode == "sparse":
        children = [_random_array(f.type, n, rng, True, density) for f in t]
        return pa.UnionArray.from_sparse(type_ids, children, names, codes)
    counts = [int((picks == k).sum()) for k in range(len(codes))]
    children = [
        _random_array(f.type, c, rng, True, density) for f, c in zip(t, counts, strict=True)
    ]
    seen = [0] * len(codes)
    offsets = []
    for k in picks:
        offsets.append(seen[k])
        seen[k] += 1
    return pa.UnionArray.from_dense(type_ids, pa.array(offsets, pa.int32()), children, names, codes)


def _random_ree(t: Any, n: int, rng: np.random.Generator, nullable: bool, density: float) -> Any:
    if n == 0:
        runs = 0
        ends: list[int] = []
    else:
        runs = int(rng.integers(1, n + 1))
        cuts = rng.choice(np.arange(1, n), size=runs - 1, replace=False) if runs > 1 else ()
        ends = [*sorted(int(c) for c in cuts), n]
    values = _random_array(t.value_type, runs, rng, nullable, density)
    return pa.RunEndEncodedArray.from_arrays(pa.array(ends, t.run_end_type), values, type=t)


def random_batch(
    schema: pa.Schema, n: int, rng: np.random.Generator, density: float = 0.25
) -> pa.RecordBatch:
    arrays = [random_array(f.type, n, rng, nullable=f.nullable, density=density) for f in schema]
    if not arrays:
        empty = pa.RecordBatch.from_struct_array(pa.array([{}] * n, type=pa.struct([])))
        return empty.replace_schema_metadata(schema.metadata)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --- hypothesis strategies for Arrow types ---------------------------------------------------

LEAF_TYPES: tuple[Any, ...] = (
    pa.null(),
    pa.bool_(),
    pa.int8(), pa.int16(), pa.int32(), pa.int64(),
    pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float16(), pa.float32(), pa.float64(),
    pa.decimal32(7, 2), pa.decimal64(15, 3), pa.decimal128(20, 4), pa.decimal256(50, 10),
    pa.date32(), pa.date64(),
    pa.time32("s"), pa.time32("ms"), pa.time64("us"), pa.time64("ns"),
    pa.timestamp("s"), pa.timestamp("ms", "UTC"), pa.timestamp("us", "Europe/Paris"),
    pa.timestamp("ns", "+05:30"),
    pa.duration("s"), pa.duration("ms"), pa.duration("us"), pa.duration("ns"),
    pa.month_day_nano_interval(),
    pa.string(), pa.binary(), pa.large_string(), pa.large_binary(),
    pa.string_view(), pa.binary_view(), pa.binary(5),
    pa.uuid(),
    RationalType(),
    LabelType("kg"),
    CategoryType(),
)  # fmt: skip
DICT_VALUE_TYPES: tuple[Any, ...] = (pa.string(), pa.int64(), pa.binary(), pa.large_string())
DICT_INDEX_TYPES: tuple[Any, ...] = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint32())
MAP_KEY_TYPES: tuple[Any, ...] = (pa.string(), pa.int32())

_names = st.text(alphabet="abxyz_é", max_size=4)
_metadata = st.one_of(
    st.none(),
    st.dictionaries(st.binary(min_size=1, max_size=4), st.binary(max_size=6), max_size=2),
)


@st.composite
def arrow_fields(draw: st.DrawFn, depth: int = 2) -> pa.Field:
    t = draw(arrow_types(depth))
    nullable = draw(st.booleans()) or pa.types.is_null(t)  # a null field must be nullable
    return pa.field(draw(_names), t, nullable=nullable, metadata=draw(_metadata))


@lru_cache
def arrow_types(depth: int = 2) -> st.SearchStrategy[Any]:
    """Any Arrow type, nested up to `depth` levels (dictionaries included)."""
    leaves = st.sampled_from(LEAF_TYPES)
    dictionaries = st.builds(
        pa.dictionary,
        st.sampled_from(DICT_INDEX_TYPES),
        st.sampled_from(DICT_VALUE_TYPES),
        st.booleans(),
    )
    if depth <= 0:
        return st.one_of(leaves, dictionaries)
    inner = arrow_types(depth - 1)
    inner_fields = arrow_fields(depth - 1)
    union_fields = st.lists(
        st.builds(pa.field, _names, inner), min_size=1, max_size=3
    )  # union children are nullable, without metadata (as UnionArray builds them)
    return st.one_of(
        leaves,
        dictionaries,
        st.builds(pa.list_, inner_fields),
        st.builds(pa.large_list, inner_fields),
        st.builds(pa.list_view, inner_fields),
        st.builds(pa.large_list_view, inner_fields),
        st.builds(pa.list_, inner_fields, st.integers(1, 3)),
        st.builds(pa.struct, st.lists(inner_fields, min_size=1, max_size=3)),
        st.builds(  # Arrow's IPC names map items "value" whatever they were called
            pa.map_, st.sampled_from(MAP_KEY_TYPES), inner_fields.map(_as_value), st.booleans()
        ),
        st.builds(_union, union_fields, st.sampled_from(["sparse", "dense"]), st.randoms()),
        st.builds(
            pa.run_end_encoded,
            st.sampled_from([pa.int16(), pa.int32(), pa.int64()]),
            st.one_of(leaves, dictionaries),
        ),
    )


def _as_value(f: pa.Field) -> pa.Field:
    return f.with_name("value")


def _union(fields: list[pa.Field], mode: str, rnd: random.Random) -> Any:
    codes = rnd.sample(range(128), len(fields))
    return pa.union(fields, mode, codes)


def arrow_schemas(max_fields: int = 4, depth: int = 2) -> st.SearchStrategy[pa.Schema]:
    return st.builds(pa.schema, st.lists(arrow_fields(depth), max_size=max_fields), _metadata)


@dataclass
class StreamCase:
    """One Arrow stream to send: schema, batches (each with optional app_metadata)."""

    name: str
    schema: pa.Schema
    batches: list[pa.RecordBatch]
    metadata: list[bytes | None] = field(default_factory=list)
    options: Any = None  # pa.ipc.IpcWriteOptions for writers that take them

    def __post_init__(self) -> None:
        if not self.metadata:
            self.metadata = [None] * len(self.batches)

    @property
    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, schema=self.schema)


@st.composite
def stream_cases(
    draw: st.DrawFn, max_fields: int = 4, depth: int = 2, max_batches: int = 3
) -> StreamCase:
    """A schema and 0..max_batches random batches (some sliced), with app_metadata."""
    schema = draw(arrow_schemas(max_fields, depth))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batches: list[pa.RecordBatch] = []
    metadata: list[bytes | None] = []
    for _ in range(draw(st.integers(0, max_batches))):
        length = draw(st.integers(0, 12))
        batch = random_batch(schema, length + 8, rng, density=draw(st.sampled_from([0, 0.3, 1])))
        offset = draw(st.integers(0, 8))
        batches.append(batch.slice(offset, length))
        metadata.append(draw(st.one_of(st.none(), st.binary(min_size=1, max_size=8))))
    return StreamCase(f"seed{seed}", schema, batches, metadata)


# --- hand-picked type families -------------------------------------------------------------


def _family(name: str, t: Any, seed: int, *, nullable: bool = True) -> StreamCase:
    """Three batches: with nulls, a slice with offset != 0, and nulls everywhere."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([pa.field("v", t, nullable=nullable), pa.field("i", pa.int32())])
    with_nulls = random_batch(schema, 24, rng)
    sliced = random_batch(schema, 40, rng).slice(7, 21)
    batches = [with_nulls, sliced]
    if nullable:
        batches.append(random_batch(schema, 9, rng, density=1.0))  # nulls everywhere
    return StreamCase(name, schema, batches, [b"first", None, b"\x00third"][: len(batches)])


def _dict_batch(values: Sequence[str], indices: Sequence[int | None]) -> pa.RecordBatch:
    t = pa.dictionary(pa.int16(), pa.string())
    arr = pa.DictionaryArray.from_arrays(
        pa.array(indices, pa.int16()), pa.array(values, pa.string())
    )
    nested = pa.ListArray.from_arrays(pa.array([0, 1, len(indices)], pa.int32()), arr)
    struct = pa.StructArray.from_arrays([arr], names=["d"])
    return pa.record_batch(
        [arr.slice(0, 2), nested, struct.slice(0, 2)],
        schema=pa.schema([("d", t), ("ld", pa.list_(t)), ("sd", pa.struct([("d", t)]))]),
    )


def dictionary_replacement_case() -> StreamCase:
    """The same dictionary columns with a different dictionary in each batch."""
    batches = [
        _dict_batch(["a", "b"], [1, 0, None]),
        _dict_batch(["x", "y", "z"], [2, None, 0]),
        _dict_batch(["a", "b"], [0, 1, 1]),
        _dict_batch([], [None, None]),
    ]
    return StreamCase("dictionary_replacement", batches[0].schema, batches)


def dictionary_delta_case() -> StreamCase:
    """Growing dictionaries sent as deltas (IpcWriteOptions(emit_dictionary_deltas=True))."""
    batches = [
        _dict_batch(["a", "b"], [1, 0, None]),
        _dict_batch(["a", "b", "c"], [2, None, 0]),
        _dict_batch(["a", "b", "c", "d", "e"], [4, 3, 1]),
    ]
    return StreamCase(
        "dictionary_delta",
        batches[0].schema,
        batches,
        options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True),
    )


def zero_column_case() -> StreamCase:
    """Batches without columns still carry their row counts."""
    batch = pa.RecordBatch.from_struct_array(pa.array([{}] * 5, type=pa.struct([])))
    return StreamCase("zero_columns", batch.schema, [batch, batch.slice(1, 3), batch.slice(0, 0)])


def empty_stream_case() -> StreamCase:
    schema = pa.schema([("a", pa.int64()), ("s", pa.list_(pa.string()))], metadata={"k": "v"})
    return StreamCase("empty_stream", schema, [])


def metadata_case() -> StreamCase:
    schema = pa.schema(
        [
            pa.field("a", pa.int64(), nullable=False, metadata={"unit": "m", "\x00": "é"}),
            pa.field("s", pa.struct([pa.field("x", pa.string(), metadata={"k": "1"})])),
        ],
        metadata={"origin": "flightfeed", "bin": b"\xff\x00"},
    )
    batch = random_batch(schema, 10, np.random.default_rng(5))
    return StreamCase("schema_and_field_metadata", schema, [batch, batch.slice(3)])


def empty_batches_case() -> StreamCase:
    schema = pa.schema([("a", pa.int64()), ("d", pa.dictionary(pa.int8(), pa.string()))])
    batch = random_batch(schema, 6, np.random.default_rng(9))
    return StreamCase("zero_row_batches", schema, [batch.slice(0, 0), batch, batch.slice(6)])


def large_batch_case() -> StreamCase:
    """One batch over 16 MiB: several HTTP/2 frames, several flow-control windows."""
    n = 1_100_000
    rng = np.random.default_rng(11)
    ints = pa.array(rng.integers(0, 2**62, n))
    batch = pa.record_batch(
        {
            "i": ints,
            "f": pa.array(rng.standard_normal(n)),
            "s": pc.cast(pc.bit_wise_and(ints, 0xFFFF), pa.string()),
        }
    )
    assert batch.nbytes > 16 * 1024 * 1024
    return StreamCase("single_batch_over_16MiB", batch.schema, [batch], [b"big"])


FAMILY_TYPES: tuple[tuple[str, Any], ...] = (
    *((str(t), t) for t in LEAF_TYPES),
    ("list", pa.list_(pa.int32())),
    ("list_non_null_items", pa.list_(pa.field("item", pa.string(), nullable=False))),
    ("large_list", pa.large_list(pa.float64())),
    ("list_view", pa.list_view(pa.int16())),
    ("large_list_view", pa.large_list_view(pa.string())),
    ("fixed_size_list", pa.list_(pa.int64(), 3)),
    ("struct", pa.struct([("a", pa.int8()), ("b", pa.string()), ("c", pa.list_(pa.bool_()))])),
    ("map", pa.map_(pa.string(), pa.int64())),
    ("map_of_struct", pa.map_(pa.int32(), pa.struct([("x", pa.float32())]))),
    ("sparse_union", pa.sparse_union([pa.field("i", pa.int32()), pa.field("s", pa.string())])),
    (
        "dense_union",
        pa.dense_union(
            [
                pa.field("i", pa.int64()),
                pa.field("l", pa.list_(pa.int8())),
                pa.field("n", pa.null()),
            ]
        ),
    ),
    ("dictionary_string", pa.dictionary(pa.int32(), pa.string())),
    ("dictionary_ordered_int", pa.dictionary(pa.int8(), pa.int64(), ordered=True)),
    ("list_of_dictionary", pa.list_(pa.dictionary(pa.int16(), pa.string()))),
    ("extension_over_dictionary", CategoryType()),
    ("run_end_encoded", pa.run_end_encoded(pa.int32(), pa.string())),
    ("run_end_encoded_int64_ends", pa.run_end_encoded(pa.int64(), pa.float64())),
    ("fixed_shape_tensor", pa.fixed_shape_tensor(pa.int32(), [2, 3])),
    ("json_extension", pa.json_()),
    ("bool8_extension", pa.bool8()),
    ("opaque_extension", pa.opaque(pa.int32(), "geometry", "vendor")),
    ("deep_nesting", pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int8())))]))),
)


def family_cases() -> list[StreamCase]:
    cases = [_family(name, t, seed) for seed, (name, t) in enumerate(FAMILY_TYPES)]
    cases.append(_family("non_nullable_int", pa.int64(), 99, nullable=False))
    cases += [
        dictionary_replacement_case(),
        dictionary_delta_case(),
        zero_column_case(),
        empty_stream_case(),
        empty_batches_case(),
        metadata_case(),
    ]
    return cases


def ids(cases: Sequence[StreamCase]) -> list[str]:
    return [c.name for c in cases]


def assert_stream_equal(
    case: StreamCase,
    schema: pa.Schema,
    received: Sequence[tuple[pa.RecordBatch | None, bytes | None]],
    *,
    check_app_metadata: bool = True,
) -> None:
    """The received (batch, app_metadata) messages are exactly the case's, schema included."""
    assert schema.equals(case.schema, check_metadata=True), f"{schema}\n!=\n{case.schema}"
    batches = [item for item in received if item[0] is not None]
    assert len(batches) == len(case.batches)
    for index, ((got, meta), want, want_meta) in enumerate(
        zip(batches, case.batches, case.metadata, strict=True)
    ):
        assert got is not None
        assert got.num_rows == want.num_rows, index
        assert got.schema.equals(case.schema, check_metadata=True)
        assert got.equals(want, check_metadata=True), f"batch {index}:\n{got}\n!=\n{want}"
        if check_app_metadata:
            assert meta == want_meta, index
