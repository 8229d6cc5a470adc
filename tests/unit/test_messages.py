"""Strict parsing of untrusted messages: nesting measured on the wire before betterproto2
parses (and recurses into) a message, and every field of the wrong type named."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import Ticket
from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    CreateTable,
    ErrorCode,
    ErrorDetail,
    ExecuteTaskRequest,
    Expr,
    FunctionCall,
    Label,
    Metric,
    MetricsSet,
    NamedCount,
    PartitionsRead,
    PercentileLatency,
    PlanNode,
    StartTimestamp,
    StreamRange,
    TaskKey,
    TaskMetrics,
    WorkerToCoordinatorMsg,
)
from flightfeed._generated.remote_engine import GetTableInfoRequest, ReadRequest, WriteRequest
from flightfeed.errors import InvalidArgument, PlanDecodeError, ResourceExhausted
from flightfeed.messages import (
    MAX_NESTING,
    MAX_UNKNOWN_FIELDS,
    MIN_VALUE_BUDGET,
    _type_problem,
    parse_strict,
)
from flightfeed.plan import CodecRegistry, decode_plan
from flightfeed.protowire import encode_varint
from flightfeed.session import Session

M = TypeVar("M")


def nested_plan(depth: int) -> bytes:
    """A chain of `depth` + 1 Coalesce nodes, built on the wire (betterproto2 cannot encode a
    chain deeper than Python's recursion limit)."""
    node = b"\x0a\x08Coalesce"
    sizes = [len(node)]  # sizes[k]: the chain of k + 1 nodes
    for _ in range(depth):
        sizes.append(len(node) + 1 + len(encode_varint(sizes[-1])) + sizes[-1])
    heads = [node + b"\x1a" + encode_varint(size) for size in reversed(sizes[:-1])]
    return b"".join([*heads, node])


def nested_plan_reference(depth: int) -> bytes:
    plan = PlanNode(kind="Coalesce")
    for _ in range(depth):
        plan = PlanNode(kind="Coalesce", children=[plan])
    return bytes(plan)


@given(st.integers(0, 3 * MAX_NESTING))
def test_depth_within_the_limit_passes_and_beyond_it_is_refused(depth: int) -> None:
    data = nested_plan(depth)
    if depth <= 150:  # deeper, betterproto2's encoder meets Python's recursion limit
        assert data == nested_plan_reference(depth)
    if depth <= MAX_NESTING:
        assert parse_strict(PlanNode, data).kind == "Coalesce"
    else:
        with pytest.raises(InvalidArgument, match=f"nested deeper than {MAX_NESTING}"):
            parse_strict(PlanNode, data)


def test_a_plan_200000_deep_is_refused_at_once() -> None:
    data = nested_plan(200_000)
    started = time.perf_counter()
    with pytest.raises(PlanDecodeError, match=r"plan bytes is not a valid PlanNode: .* nested"):
        decode_plan(data, CodecRegistry.builtin(), Session())
    # Before the scan, betterproto2 recursed and copied each level: 1.3 s on a quiet machine.
    assert time.perf_counter() - started < 1.0


def test_nesting_is_followed_through_every_message_field() -> None:
    expr = Expr(call=FunctionCall(function="now"))
    for _ in range(MAX_NESTING // 2):  # Expr → FunctionCall → Expr: two messages a level
        expr = Expr(call=FunctionCall(function="negate", args=[expr]))
    with pytest.raises(InvalidArgument, match="nested deeper than"):
        parse_strict(Expr, bytes(expr))


def test_truncated_nested_messages_are_refused() -> None:
    data = b"\x0a\x08Coalesce\x1a\x10\x0a\x08"  # a child that claims 16 bytes, has 2
    with pytest.raises(InvalidArgument, match="truncated"):
        parse_strict(PlanNode, data)


@pytest.mark.parametrize(
    ("message", "data", "problem"),
    [
        (
            ExecuteTaskRequest,
            b"\x08\x05",
            "ExecuteTaskRequest.task_key should be a message, got a varint",
        ),
        (ExecuteTaskRequest, b"\x11" + bytes(8), "target_partition_start should be uint64"),
        (Ticket, b"\x08\x05", "Ticket.ticket should be bytes, got a varint"),
        (CoordinatorToWorkerMsg, b"\x08\x01", "set_plan_request should be a message"),
        (PlanNode, b"\x0a\x02\xff\xfe", "UnicodeDecodeError"),
        (ExecuteTaskRequest, b"\x12\x01\x05", "target_partition_start should be uint64"),
        (
            WorkerToCoordinatorMsg,  # partitions_read (4) holding partitions (1) as fixed32
            b"\x22\x05" + b"\x0d\x01\x00\x00\x00",
            "WorkerToCoordinatorMsg.partitions_read.partitions should be uint64, got a 32-bit",
        ),
        (StreamRange, b"\x12\x05\x0a\x01a\x12\x00", "StreamRange.start.value should be uint64"),
    ],
    ids=[
        "varint-for-message",
        "fixed64-for-varint",
        "varint-for-bytes",
        "oneof",
        "bad-utf8",
        "packed-for-single",
        "nested-path",
        "map-value",
    ],
)
def test_fields_of_the_wrong_type_are_named(message: type[Any], data: bytes, problem: str) -> None:
    """betterproto2 alone puts an int where a message belongs: AttributeError later, INTERNAL."""
    with pytest.raises(InvalidArgument) as refused:
        parse_strict(message, data)
    assert refused.value.message.startswith(message.__name__)
    assert problem in refused.value.message


def outcome(
    parse: Callable[[type[M], bytes], M], message: type[M], data: bytes
) -> M | InvalidArgument:
    """What parsing gives: the message or the refusal."""
    try:
        return parse(message, data)
    except InvalidArgument as refused:
        return refused


u64 = st.integers(0, 2**64 - 1)
metric_values: dict[str, st.SearchStrategy[Any]] = {
    "count": st.builds(NamedCount, name=st.text(max_size=5), value=u64),
    "start_timestamp": st.builds(
        StartTimestamp, value=st.none() | st.integers(-(2**63), 2**63 - 1)
    ),
    "custom_p50_latency": st.builds(
        PercentileLatency, name=st.text(max_size=5), sketch_bytes=st.binary(max_size=24)
    ),
}
metrics = st.one_of(
    *(
        st.builds(
            Metric,
            labels=st.lists(st.builds(Label, name=st.text(max_size=5), value=st.text(max_size=5))),
            partition=st.none() | u64,
            **{kind: value},
        )
        for kind, value in metric_values.items()
    )
)
worker_messages = st.one_of(
    st.builds(
        WorkerToCoordinatorMsg,
        task_metrics=st.builds(
            TaskMetrics,
            pre_order_plan_metrics=st.lists(
                st.builds(MetricsSet, metrics=st.lists(metrics, max_size=3)), max_size=3
            ),
            task_metrics=st.none() | st.builds(MetricsSet, metrics=st.lists(metrics, max_size=3)),
        ),
    ),
    st.builds(
        WorkerToCoordinatorMsg,
        task_error=st.builds(
            ErrorDetail,
            code=st.sampled_from(ErrorCode),
            message=st.text(max_size=10),
            task_key=st.none() | st.builds(TaskKey, query_id=st.binary(max_size=4), stage_id=u64),
        ),
    ),
    st.builds(
        WorkerToCoordinatorMsg,
        partitions_read=st.builds(PartitionsRead, partitions=st.lists(u64, max_size=5)),
    ),
)


@given(worker_messages)
def test_every_well_formed_message_parses_as_betterproto2_encoded_it(
    message: WorkerToCoordinatorMsg,
) -> None:
    assert parse_strict(WorkerToCoordinatorMsg, bytes(message)) == message


@given(worker_messages, st.data())
def test_damaged_messages_are_refused_or_parse_to_the_promised_types(
    message: WorkerToCoordinatorMsg, data: st.DataObject
) -> None:
    """The wire check alone guarantees the types: no field of a parsed message may hold
    anything but what its proto type promises, whatever bytes came."""
    encoded = bytearray(bytes(message))
    for _ in range(data.draw(st.integers(1, 4))):
        if not encoded:
            break
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del encoded[data.draw(st.integers(0, len(encoded))) :]
    parsed = outcome(parse_strict, WorkerToCoordinatorMsg, bytes(encoded))
    if isinstance(parsed, InvalidArgument):
        assert parsed.message.startswith("WorkerToCoordinatorMsg")
    else:
        assert _type_problem(parsed, "WorkerToCoordinatorMsg") is None


@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_refused_or_parse_to_the_promised_types(data: bytes) -> None:
    for message in (WorkerToCoordinatorMsg, ExecuteTaskRequest, PlanNode):
        parsed = outcome(parse_strict, message, data)
        if not isinstance(parsed, InvalidArgument):
            assert _type_problem(parsed, message.__name__) is None


def test_the_type_oracle_of_these_properties_does_catch_a_misplaced_value() -> None:
    lenient = ExecuteTaskRequest.parse(b"\x08\x05")  # betterproto2 alone: an int for a message
    assert _type_problem(lenient, "ExecuteTaskRequest") is not None


# --- what a message may parse to -------------------------------------------------------------


def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def _contiguous_write(row: bytes, rows: int) -> bytes:
    """A WriteRequest whose row group holds `rows` copies of `row` (field 2 of ContiguousRows)."""
    return _field(2, _field(4, _field(2, row) * rows))


def test_a_message_of_tiny_values_is_refused_before_it_is_parsed() -> None:
    """16 million 2-byte rows in a 64 MB Write parsed to ~14 times that (860 MB for 61 MB) in
    7 s; one value for every 12 bytes is what a message may hold past its first million."""
    data = _contiguous_write(b"ab", 16_000_000)
    with pytest.raises(ResourceExhausted, match=r"holds more than 5333334 fields and values"):
        parse_strict(WriteRequest, data)
    rows = parse_strict(WriteRequest, _contiguous_write(b"ab", MIN_VALUE_BUDGET - 10))
    assert rows.row_group is not None
    assert rows.row_group.contiguous is not None
    assert len(rows.row_group.contiguous.encoded_rows) == MIN_VALUE_BUDGET - 10  # the floor
    # HoraeDB's least row (a timestamp only: 12 bytes, 14 on the wire), past the floor: fine
    least = _contiguous_write(bytes(12), 2 * MIN_VALUE_BUDGET)
    assert parse_strict(WriteRequest, least).row_group is not None


def test_packed_values_count_one_each() -> None:
    """A packed repeated scalar is one record on the wire and a value each once parsed."""
    projection = _field(2, _field(3, _field(2, _field(1, b"\x80\x01" * 2_000_000))))
    with pytest.raises(ResourceExhausted, match="fields and values"):
        parse_strict(ReadRequest, projection)
    wide = _field(2, _field(3, _field(2, _field(1, b"\x80\x80\x80\x80\x80\x01" * 500_000))))
    parsed = parse_strict(ReadRequest, wide)  # 6 bytes a value: within one in 12
    assert parsed.read_request is not None
    assert parsed.read_request.projected_schema is not None
    assert parsed.read_request.projected_schema.projection is not None
    assert len(parsed.read_request.projected_schema.projection.idx) == 500_000


def test_unknown_fields_are_bounded() -> None:
    """betterproto2 keeps unknown fields by appending each to the bytes of those before (for
    messages with a map, it parses them itself): 160,000 took a second, quadratically."""
    unknown = b"\x78\x01"  # field 15, a varint: no field of these messages
    for message in (GetTableInfoRequest, CreateTable):
        kept = parse_strict(message, unknown * MAX_UNKNOWN_FIELDS)
        assert kept._unknown_fields == unknown * MAX_UNKNOWN_FIELDS
        with pytest.raises(InvalidArgument, match=f"more than {MAX_UNKNOWN_FIELDS} unknown"):
            parse_strict(message, unknown * (MAX_UNKNOWN_FIELDS + 1))
