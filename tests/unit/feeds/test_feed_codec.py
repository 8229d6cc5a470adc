"""The WorkUnitBatch wire form: packed and reference batches round-trip; bad ones are refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ErrorDetail,
    FeedPartitionEnd,
    FeedPartitionError,
    PackedWorkUnits,
    WorkUnit,
    WorkUnitBatch,
)
from flightfeed.errors import FeedError
from flightfeed.feeds import UnitRun, decode_batch, encode_batch

FEED_IDS = [bytes([i]) * 16 for i in range(3)]

runs_strategy = st.lists(
    st.builds(
        lambda feed, partition, units: UnitRun(
            feed, partition, [body for body, _ in units], [created for _, created in units]
        ),
        st.sampled_from(FEED_IDS),
        st.integers(0, 2**32 - 1),
        st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 2**64 - 1)), max_size=12),
    ),
    max_size=8,
)


def flatten(runs: list[UnitRun], sent_ns: int) -> list[tuple[bytes, int, bytes, int, int]]:
    return [
        (run.feed_id, run.partition, body, created, sent_ns)
        for run in runs
        for body, created in zip(run.bodies, run.created_ns, strict=True)
    ]


def over_the_wire(batch: WorkUnitBatch) -> WorkUnitBatch:
    return CoordinatorToWorkerMsg.parse(
        bytes(CoordinatorToWorkerMsg(work_unit_batch=batch))
    ).work_unit_batch


@settings(max_examples=200, deadline=None)
@given(
    runs=runs_strategy,
    sent_ns=st.integers(0, 2**64 - 1),
    packed=st.booleans(),
    ended=st.lists(st.tuples(st.sampled_from(FEED_IDS), st.integers(0, 9)), max_size=3),
)
def test_batches_round_trip(
    runs: list[UnitRun], sent_ns: int, packed: bool, ended: list[tuple[bytes, int]]
) -> None:
    ends = [FeedPartitionEnd(id=f, partition=p) for f, p in ended]
    errors = [
        FeedPartitionError(id=f, partition=p, error=ErrorDetail(message=f"boom {p}"))
        for f, p in ended
    ]
    batch = over_the_wire(encode_batch(runs, sent_ns, ends, errors, packed=packed))
    assert (batch.packed is not None) == (packed and any(run.bodies for run in runs))
    decoded = decode_batch(batch)
    got = [
        (run.feed_id, run.partition, run.body(i), run.created_ns[i], run.sent_ns)
        for run in decoded.runs
        for i in range(len(run))
    ]
    assert got == flatten(runs, sent_ns)
    assert decoded.unit_count == len(got)
    # Each run owns exactly its bodies: an unread partition never pins a whole batch.
    assert all(len(run.bodies) == run.ends[-1] for run in decoded.runs)
    assert [(e.id, e.partition) for e in decoded.ends] == ended
    assert [e.error.message for e in decoded.errors if e.error] == [f"boom {p}" for _, p in ended]
    # The reference fields stay readable.
    as_units = [u for run in decoded.runs for u in run.work_units()]
    assert [(u.id, u.partition, u.body) for u in as_units] == [g[:3] for g in got]


def test_reference_batches_from_other_peers_decode() -> None:
    units = [
        WorkUnit(id=FEED_IDS[0], partition=1, body=b"a", sent_timestamp_unix_nanos=5),
        WorkUnit(id=FEED_IDS[0], partition=1, body=b"bb", sent_timestamp_unix_nanos=5),
        WorkUnit(id=FEED_IDS[1], partition=0, body=b"", sent_timestamp_unix_nanos=5),
        WorkUnit(id=FEED_IDS[0], partition=1, body=b"c", sent_timestamp_unix_nanos=6),
    ]
    decoded = decode_batch(over_the_wire(WorkUnitBatch(batch=units)))
    assert [(r.partition, len(r)) for r in decoded.runs] == [(1, 2), (0, 1), (1, 1)]
    assert [r.body(i) for r in decoded.runs for i in range(len(r))] == [
        b"a",
        b"bb",
        b"",
        b"c",
    ]


def packed(**fields: object) -> WorkUnitBatch:
    good: dict[str, object] = {
        "feed_ids": [FEED_IDS[0]],
        "runs": struct.pack("<3I", 0, 0, 2),
        "created_timestamp_unix_nanos": struct.pack("<2Q", 1, 2),
        "body_ends": struct.pack("<2I", 1, 3),
        "bodies": b"abc",
    }
    good.update(fields)
    return WorkUnitBatch(packed=PackedWorkUnits(**good))


def test_a_well_formed_packed_batch_decodes() -> None:
    run = decode_batch(packed()).runs[0]
    assert [run.body(i) for i in range(2)] == [b"a", b"bc"]


@pytest.mark.parametrize(
    "fields",
    [
        {"runs": b"\x00" * 11},
        {"runs": struct.pack("<3I", 0, 0, 3)},
        {"runs": struct.pack("<3I", 1, 0, 2)},
        {"runs": struct.pack("<6I", 0, 0, 2, 0, 1, 0)},
        {"created_timestamp_unix_nanos": b"\x00" * 15},
        {"body_ends": struct.pack("<2I", 2, 1)},
        {"body_ends": struct.pack("<2I", 1, 4)},
        {"bodies": b"abcd"},
    ],
    ids=[
        "ragged-runs",
        "count-mismatch",
        "feed-index",
        "empty-run",
        "timestamps",
        "decreasing-ends",
        "end-past-bodies",
        "bodies-past-end",
    ],
)
def test_malformed_packed_batches_are_feed_errors(fields: dict[str, object]) -> None:
    with pytest.raises(FeedError, match="packed work units"):
        decode_batch(packed(**fields))
