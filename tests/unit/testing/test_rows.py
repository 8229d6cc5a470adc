"""Generated rows: every partitioning covers the same rows once, the leaf serves exactly them,
and its 16-byte codec rejects what it cannot believe."""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument, PlanDecodeError
from flightfeed.plan import (
    CodecRegistry,
    DecodeContext,
    MemoryScan,
    collect,
    decode_plan,
    encode_plan,
    open_task_context,
)
from flightfeed.session import Session
from flightfeed.testing.rows import (
    MAX_PARTITIONS,
    ROWS_SCHEMA,
    GeneratedRows,
    GeneratedRowsCodec,
    generated_partition,
    generated_table,
)

REGISTRY = CodecRegistry.builtin().with_codec(GeneratedRowsCodec())
CONTEXT = DecodeContext(Session(), REGISTRY)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 5000),
    partitions=st.integers(1, 9),
    batch_rows=st.integers(1, 700),
)
def test_partitions_cover_every_row_once(rows: int, partitions: int, batch_rows: int) -> None:
    table = generated_table(rows, partitions, batch_rows)
    assert table.schema.equals(ROWS_SCHEMA)
    assert table.column("id").to_pylist() == list(range(rows))
    for index in range(partitions):
        assert all(
            b.num_rows <= batch_rows
            for b in generated_partition(rows, partitions, index, batch_rows)
        )
    ids = table.column("id").combine_chunks()
    assert table.column("x").combine_chunks().equals(pc.divide(pc.cast(ids, pa.float64()), 2.0))
    assert table.column("bucket").combine_chunks().equals(pc.remainder(ids, 97))
    names = [f"n{bucket}" for bucket in table.column("bucket").to_pylist()]
    assert table.column("name").to_pylist() == names


@pytest.mark.parametrize(
    ("rows", "partitions", "index", "message"),
    [
        (-1, 1, 0, "rows must be"),
        (10, 0, 0, "partitions must be"),
        (10, MAX_PARTITIONS + 1, 0, "partitions must be"),
        (10, 2, 2, "partition 2 is not in 0..1"),
    ],
)
def test_bad_arguments_are_refused(rows: int, partitions: int, index: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        generated_partition(rows, partitions, index)


@pytest.mark.anyio
async def test_the_leaf_serves_the_generated_rows_after_a_round_trip() -> None:
    node = GeneratedRows(3000, 3, batch_rows=256)
    decoded = decode_plan(encode_plan(node, REGISTRY), REGISTRY, Session())
    assert isinstance(decoded, GeneratedRows)
    assert decoded.output_partitions == 3
    async with open_task_context(Session()) as ctx:
        served = await collect(decoded, ctx)
    assert served.sort_by("id").equals(generated_table(3000, 3, 256).combine_chunks())


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "payload is 0 bytes, expected 16"),
        (b"\x00" * 17, "payload is 17 bytes, expected 16"),
        (struct.pack("<QII", 10, 0, 1), "partitions must be"),
        (struct.pack("<QII", 10, 1, 0), "batch_rows must be"),
        (struct.pack("<QII", 1 << 63, 1, 1), "rows must be"),
    ],
)
def test_hostile_payloads_give_decode_errors(payload: bytes, message: str) -> None:
    with pytest.raises(PlanDecodeError, match=message):
        GeneratedRowsCodec().decode(GeneratedRows.name, payload, (), CONTEXT)


def test_a_leaf_with_children_is_refused() -> None:
    payload = GeneratedRowsCodec().encode(GeneratedRows(4, 1))
    with pytest.raises(InvalidArgument, match="takes 0 input"):
        GeneratedRowsCodec().decode(GeneratedRows.name, payload, (GeneratedRows(4, 1),), CONTEXT)


def test_encoding_another_node_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="cannot encode MemoryScan"):
        GeneratedRowsCodec().encode(MemoryScan.from_table(generated_table(4), 1))
