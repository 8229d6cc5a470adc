"""The hand-written codec of FeedCredits and PartitionsRead: the bytes betterproto2 writes,
and decoding exactly as strict as the generic parse, whatever the bytes."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.message_strategies import messages
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import (
    ErrorDetail,
    FeedCredits,
    PartitionCredit,
    PartitionsRead,
    TaskMetrics,
    WorkerToCoordinatorMsg,
)
from flightfeed.errors import InvalidArgument, ResourceExhausted
from flightfeed.messages import parse_strict
from flightfeed.protocol import channel_wire
from flightfeed.protocol.channel_wire import (
    EncodedTaskMetrics,
    decode_worker_message,
    encode_worker_message,
)

LIMIT = 1 << 20
u64 = st.integers(0, 2**64 - 1)
credit = st.builds(
    PartitionCredit,
    id=st.binary(max_size=16),
    partition=u64 | st.integers(0, 300),
    credits=u64 | st.integers(0, 300),
    finished=st.booleans(),
)
frequent = st.builds(
    WorkerToCoordinatorMsg, feed_credits=st.builds(FeedCredits, credits=st.lists(credit))
) | st.builds(
    WorkerToCoordinatorMsg,
    partitions_read=st.builds(
        PartitionsRead,
        partitions=st.lists(u64 | st.integers(0, 300)),
        reading=st.integers(0, 2**32 - 1) | st.integers(0, 4),
    ),
)


def outcome(parse: Any, data: bytes) -> Any:
    """The parsed message, or the class of the refusal."""
    try:
        return parse(data)
    except InvalidArgument:
        return InvalidArgument


def generic(data: bytes) -> Any:
    return parse_strict(WorkerToCoordinatorMsg, data)


def fast(data: bytes) -> Any:
    return decode_worker_message(data, LIMIT)


@given(frequent)
def test_encoding_is_what_betterproto2_writes_and_decodes_back(
    message: WorkerToCoordinatorMsg,
) -> None:
    encoded = encode_worker_message(message)
    assert encoded == bytes(message)
    assert decode_worker_message(encoded, LIMIT) == message


@settings(max_examples=300)
@given(frequent, st.data())
def test_damaged_bytes_decode_exactly_as_the_generic_strict_parse_does(
    message: WorkerToCoordinatorMsg, data: st.DataObject
) -> None:
    """Bytes flipped, inserted or cut: the same message or the same refusal, never a
    different reading (and never an exception other than InvalidArgument)."""
    encoded = bytearray(bytes(message))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(encoded)))
        byte = data.draw(st.integers(0, 255))
        if at < len(encoded) and data.draw(st.booleans()):
            encoded[at] = byte
        else:
            encoded.insert(at, byte)
    if data.draw(st.booleans()):
        del encoded[data.draw(st.integers(0, len(encoded))) :]
    damaged = bytes(encoded)
    assert outcome(fast, damaged) == outcome(generic, damaged)


@given(st.sampled_from([b"\x12", b"\x22"]), st.binary(max_size=40))
@example(b"\x12", b"\x04\x0a\x02\x10\x01")  # a well-formed credit
@example(b"\x22", b"\x03\x0a\x01\x07")  # packed partitions
@example(b"\x22", b"\x02\x08\x07")  # one unpacked partition
@example(b"\x22", b"\x05\x10" + b"\xff" * 4 + b"\x1f")  # reading: past uint32
@example(b"\x22", b"\x03\x10\x80\x01")  # reading: 128
def test_any_bytes_after_a_frequent_tag_decode_as_the_generic_parse_does(
    tag: bytes, rest: bytes
) -> None:
    assert outcome(fast, tag + rest) == outcome(generic, tag + rest)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            b"\x12\x04\x0a\x02\x12\x00",
            "WorkerToCoordinatorMsg.feed_credits.credits.partition should be uint64",
        ),
        (b"\x12\x02\x08\x01", "feed_credits.credits should be a message, got a varint"),
        (b"\x12\x04\x0a\x02\x2d\x00", "truncated"),  # field 5, fixed32: 1 of 4 bytes
        (b"\x12\x03\x0a\x01\x0b", "feed_credits.credits.id should be bytes, got wire type 3"),
        (b"\x12\x04\x0a\x02\x00\x00", "field number 0"),
        (b"\x22\x02\x0a\x05", "truncated"),
        (b"\x22\x05\x0d\x00\x00\x00\x00", "partitions_read.partitions should be uint64"),
        (b"\x22\x02\x12\x00", "partitions_read.reading should be uint32"),
        (b"\x22\x0c\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    ],
    ids=[
        "length-for-uint64",
        "varint-for-message",
        "truncated-unknown-fixed32",
        "group-for-bytes",
        "field-zero",
        "packed-past-the-end",
        "fixed32-for-uint64",
        "length-for-uint32",
        "eleven-byte-varint",
    ],
)
def test_malformed_credits_are_refused_naming_the_field(data: bytes, problem: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        decode_worker_message(data, LIMIT)
    assert refused.value.message.startswith("WorkerToCoordinatorMsg")
    assert problem in refused.value.message


def test_frequent_messages_do_not_go_through_betterproto2(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the generic parse was used")

    monkeypatch.setattr(channel_wire, "parse_message", refuse)
    credits = WorkerToCoordinatorMsg(
        feed_credits=FeedCredits(credits=[PartitionCredit(id=b"f", partition=3, credits=64)])
    )
    reads = WorkerToCoordinatorMsg(partitions_read=PartitionsRead(partitions=[0, 5]))
    for message in (credits, reads):
        assert decode_worker_message(encode_worker_message(message), LIMIT) == message


def test_other_messages_take_the_generic_strict_parse_and_its_size_limit() -> None:
    error = WorkerToCoordinatorMsg(task_error=ErrorDetail(message="boom"))
    assert decode_worker_message(encode_worker_message(error), LIMIT) == error
    big = WorkerToCoordinatorMsg(
        feed_credits=FeedCredits(credits=[PartitionCredit(id=bytes(64))] * 4)
    )
    with pytest.raises(ResourceExhausted, match="exceeds the limit of 100 bytes"):
        decode_worker_message(bytes(big), 100)


@settings(max_examples=100, deadline=None)
@given(metrics=messages(TaskMetrics))
def test_task_metrics_stay_encoded_until_read_and_read_back_the_same(metrics: TaskMetrics) -> None:
    """Nothing on a query's path reads them: parsing them at once was a tenth of a busy
    coordinator's CPU."""
    data = encode_worker_message(WorkerToCoordinatorMsg(task_metrics=metrics))
    got = decode_worker_message(data, LIMIT)
    assert isinstance(got, EncodedTaskMetrics)
    assert got.decode() == parse_strict(WorkerToCoordinatorMsg, data).task_metrics


def test_malformed_task_metrics_are_refused_when_read_naming_the_field() -> None:
    inner = b"\x12\x03\x08\x01\x02"  # MetricsSet field: a Metric of a varint then junk
    data = b"\x0a" + bytes([len(inner)]) + inner
    got = decode_worker_message(data, LIMIT)
    assert isinstance(got, EncodedTaskMetrics)
    with pytest.raises(InvalidArgument, match="TaskMetrics"):
        got.decode()
    with pytest.raises(ResourceExhausted):  # the channel's size limit holds all the same
        decode_worker_message(data, 4)
    with pytest.raises(InvalidArgument):  # a length past the end: the generic parse says so
        decode_worker_message(b"\x0a\x09\x12", LIMIT)
