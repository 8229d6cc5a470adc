"""The wire form of a WorkUnitBatch: columnar `packed` units, or the reference's per-unit list.

betterproto2 needs microseconds to build or parse each message, so flightfeed never sends one
message per unit: a batch carries runs of units as little-endian arrays (PackedWorkUnits) that
numpy encodes and decodes in one call per column. The reference form (`batch`, one WorkUnit
each) is still decoded, and encoded on request, for peers that only speak the reference.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from .._generated.flightfeed.v1 import (
    FeedPartitionEnd,
    FeedPartitionError,
    PackedWorkUnits,
    WorkUnit,
    WorkUnitBatch,
)
from ..errors import FeedError

_RUN = np.dtype("<u4")
_U32 = np.dtype("<u4")
_U64 = np.dtype("<u8")
_MAX_U32 = (1 << 32) - 1

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("flightfeed's packed work-unit codec assumes a little-endian host")


@dataclass(slots=True)
class UnitRun:
    """Consecutive units of one (feed, partition) to encode, bodies already serialized."""

    feed_id: bytes
    partition: int
    bodies: list[bytes]
    created_ns: list[int]


@dataclass(slots=True)
class DecodedRun:
    """Consecutive units of one (feed, partition) from a decoded batch.

    Unit i spans bodies[ends[i-1]:ends[i]] (from 0 for i == 0). A run owns its bodies (one copy
    per run, not per unit) so a partition that is not read pins only its own units, never the
    whole batch they came in.
    """

    feed_id: bytes
    partition: int
    bodies: bytes
    ends: list[int]
    created_ns: list[int]
    sent_ns: int

    def __len__(self) -> int:
        return len(self.ends)

    def body(self, index: int) -> bytes:
        begin = self.ends[index - 1] if index else 0
        return self.bodies[begin : self.ends[index]]

    def work_units(self) -> list[WorkUnit]:
        """The run as reference WorkUnit messages (slow; for logs, tests and replay)."""
        return [
            WorkUnit(
                id=self.feed_id,
                partition=self.partition,
                body=self.body(i),
                created_timestamp_unix_nanos=self.created_ns[i],
                sent_timestamp_unix_nanos=self.sent_ns,
            )
            for i in range(len(self.ends))
        ]


@dataclass(slots=True)
class DecodedBatch:
    """A validated WorkUnitBatch: runs in order, then ends and errors."""

    runs: list[DecodedRun] = field(default_factory=list)
    ends: list[FeedPartitionEnd] = field(default_factory=list)
    errors: list[FeedPartitionError] = field(default_factory=list)

    @property
    def unit_count(self) -> int:
        return sum(len(run) for run in self.runs)


def encode_batch(
    runs: Sequence[UnitRun],
    sent_ns: int,
    ends: Sequence[FeedPartitionEnd] = (),
    errors: Sequence[FeedPartitionError] = (),
    *,
    packed: bool = True,
) -> WorkUnitBatch:
    """One WorkUnitBatch; `packed=False` writes the reference per-unit form instead."""
    if not packed:
        units = [
            WorkUnit(
                id=run.feed_id,
                partition=run.partition,
                body=body,
                created_timestamp_unix_nanos=created,
                sent_timestamp_unix_nanos=sent_ns,
            )
            for run in runs
            for body, created in zip(run.bodies, run.created_ns, strict=True)
        ]
        return WorkUnitBatch(batch=units, ends=list(ends), errors=list(errors))
    runs = [run for run in runs if run.bodies]
    if not runs:
        return WorkUnitBatch(ends=list(ends), errors=list(errors))
    feed_index: dict[bytes, int] = {}
    run_words: list[int] = []
    bodies: list[bytes] = []
    created: list[int] = []
    for run in runs:
        index = feed_index.setdefault(run.feed_id, len(feed_index))
        run_words += (index, run.partition, len(run.bodies))
        bodies += run.bodies
        created += run.created_ns
    blob = b"".join(bodies)
    if len(blob) > _MAX_U32:
        raise FeedError(f"work-unit batch bodies of {len(blob)} bytes exceed 4 GiB")
    return WorkUnitBatch(
        packed=PackedWorkUnits(
            feed_ids=list(feed_index),
            runs=np.array(run_words, dtype=_RUN).tobytes(),
            created_timestamp_unix_nanos=np.array(created, dtype=_U64).tobytes(),
            body_ends=np.fromiter(accumulate(map(len, bodies)), _U32, len(bodies)).tobytes(),
            bodies=blob,
            sent_timestamp_unix_nanos=sent_ns,
        ),
        ends=list(ends),
        errors=list(errors),
    )


def decode_batch(batch: WorkUnitBatch) -> DecodedBatch:
    """Validate and decode a batch; FeedError for anything malformed (a protocol violation)."""
    out = DecodedBatch(ends=list(batch.ends), errors=list(batch.errors))
    if batch.batch:
        out.runs += _decode_reference(batch.batch)
    if batch.packed is not None:
        out.runs += _decode_packed(batch.packed)
    return out


def _decode_packed(packed: PackedWorkUnits) -> list[DecodedRun]:
    runs_raw, created_raw, ends_raw = (
        packed.runs,
        packed.created_timestamp_unix_nanos,
        packed.body_ends,
    )
    if len(runs_raw) % 12:
        raise FeedError(f"packed work units: runs of {len(runs_raw)} bytes, not uint32 triples")
    words = np.frombuffer(runs_raw, dtype=_RUN).reshape(-1, 3)
    count = int(words[:, 2].sum(dtype=np.uint64))
    if len(created_raw) != 8 * count or len(ends_raw) != 4 * count:
        raise FeedError(
            f"packed work units: {count} units in runs but {len(created_raw)} bytes of"
            f" timestamps and {len(ends_raw)} bytes of body ends"
        )
    if words.size and not words[:, 2].all():
        raise FeedError("packed work units: empty run")
    if words.size and int(words[:, 0].max()) >= len(packed.feed_ids):
        raise FeedError("packed work units: run names a feed index out of range")
    ends_array = np.frombuffer(ends_raw, dtype=_U32)
    if count and (
        int(ends_array[-1]) != len(packed.bodies)
        or (np.diff(ends_array.astype(np.int64)) < 0).any()
    ):
        raise FeedError("packed work units: body offsets do not match the bodies")
    ends = ends_array.tolist()
    created = np.frombuffer(created_raw, dtype=_U64).tolist()
    out: list[DecodedRun] = []
    start = 0
    for feed_index, partition, n in words.tolist():
        stop = start + n
        out.append(
            _run(
                packed.feed_ids[feed_index],
                partition,
                packed.bodies,
                ends,
                created,
                start,
                stop,
                packed.sent_timestamp_unix_nanos,
            )
        )
        start = stop
    return out


def _run(
    feed_id: bytes,
    partition: int,
    blob: bytes,
    ends: list[int],
    created: list[int],
    start: int,
    stop: int,
    sent_ns: int,
) -> DecodedRun:
    """Units [start, stop) of a batch's columns as a self-contained run."""
    if start == 0 and stop == len(ends):
        return DecodedRun(feed_id, partition, blob, ends, created, sent_ns)
    base = ends[start - 1] if start else 0
    run_ends = ends[start:stop]
    if base:
        run_ends = [end - base for end in run_ends]
    body = blob[base : ends[stop - 1]]
    return DecodedRun(feed_id, partition, body, run_ends, created[start:stop], sent_ns)


def _decode_reference(units: list[WorkUnit]) -> list[DecodedRun]:
    """Reference units as runs: one run per stretch of equal (feed, partition, sent time)."""
    out: list[DecodedRun] = []
    first = 0
    for i in range(1, len(units) + 1):
        if i < len(units) and _same_run(units[first], units[i]):
            continue
        stretch = units[first:i]
        bodies = [unit.body for unit in stretch]
        head = stretch[0]
        out.append(
            DecodedRun(
                head.id,
                head.partition,
                b"".join(bodies),
                list(accumulate(map(len, bodies))),
                [unit.created_timestamp_unix_nanos for unit in stretch],
                head.sent_timestamp_unix_nanos,
            )
        )
        first = i
    return out


def _same_run(a: WorkUnit, b: WorkUnit) -> bool:
    return (a.id, a.partition, a.sent_timestamp_unix_nanos) == (
        b.id,
        b.partition,
        b.sent_timestamp_unix_nanos,
    )
