"""FunctionOptions on the wire: round trips, and tampered structs rejected before Arrow sees them
(Arrow's own deserializer crashes the process on a struct of the wrong layout)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed.errors import InvalidArgument, PlanDecodeError
from flightfeed.plan.options_codec import decode_options, encode_options


@pytest.mark.parametrize(
    "options",
    [
        pc.CastOptions(pa.list_(pa.string())),
        pc.RoundOptions(3, "half_up"),
        pc.SortOptions([("a", "descending")]),
        pc.ScalarAggregateOptions(min_count=0),
        pc.SetLookupOptions(pa.array(["a", "b"])),
        pc.StrptimeOptions("%Y-%m-%d", "ms"),
        pc.MatchSubstringOptions("needle", ignore_case=True),
    ],
    ids=lambda o: type(o).__name__,
)
def test_round_trip(options: pc.FunctionOptions) -> None:
    assert decode_options(encode_options(options)) == options


def struct_ipc(struct: pa.StructArray) -> bytes:
    batch = pa.RecordBatch.from_arrays([struct], names=[""])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"ndigits": pa.array(["2"]), "round_mode": pa.array([0], pa.int8())}, "ndigits"),
        ({"ndigits": pa.array([2]), "round_mode": pa.array([0], pa.int8())}, "_type_name"),
        ({"ndigits": pa.array([2])}, "fields"),
    ],
)
def test_wrong_layout_is_rejected(fields: dict[str, pa.Array], error: str) -> None:
    names = list(fields)
    arrays = list(fields.values())
    if error != "_type_name":
        names.append("_type_name")
        arrays.append(pa.array([b"RoundOptions"]))
    else:
        names.append("_type_name")
        arrays.append(pa.array([1], pa.time32("ms")))
    data = struct_ipc(pa.StructArray.from_arrays(arrays, names=names))
    with pytest.raises(PlanDecodeError, match=error):
        decode_options(data)


def test_unknown_or_untransportable_types() -> None:
    fake = pa.StructArray.from_arrays([pa.array([b"Nope"])], names=["_type_name"])
    with pytest.raises(PlanDecodeError, match="unknown function options type 'Nope'"):
        decode_options(struct_ipc(fake))
    with pytest.raises(InvalidArgument, match="ReplaceSliceOptions"):
        encode_options(pc.ReplaceSliceOptions(0, 1, "x"))


def test_garbage_is_rejected() -> None:
    good = encode_options(pc.RoundOptions(2))
    for data in (b"", b"ARROW1", good[: len(good) // 2], good[:-10] + b"\x00" * 10):
        with pytest.raises(PlanDecodeError):
            decode_options(data)


def test_values_that_would_hang_arrow_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match="ndigits"):
        encode_options(pc.RoundOptions(10**15))
    assert decode_options(encode_options(pc.RoundOptions(-300))) == pc.RoundOptions(-300)
