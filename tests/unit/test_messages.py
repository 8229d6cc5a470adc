"""Strict parsing of untrusted messages: nesting measured on the wire before betterproto2
parses (and recurses into) a message, and every field of the wrong type named."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import Ticket
from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    Expr,
    FunctionCall,
    PlanNode,
)
from flightfeed.errors import InvalidArgument, PlanDecodeError
from flightfeed.messages import MAX_NESTING, parse_strict
from flightfeed.plan import CodecRegistry, decode_plan
from flightfeed.protowire import encode_varint
from flightfeed.session import Session


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
        (ExecuteTaskRequest, b"\x08\x05", "ExecuteTaskRequest.task_key should be a message"),
        (ExecuteTaskRequest, b"\x11" + bytes(8), "'uint64'"),
        (Ticket, b"\x08\x05", "Ticket.ticket should be bytes, got int"),
        (CoordinatorToWorkerMsg, b"\x08\x01", "set_plan_request should be a message"),
        (PlanNode, b"\x0a\x02\xff\xfe", "UnicodeDecodeError"),
    ],
    ids=["varint-for-message", "fixed64-for-varint", "varint-for-bytes", "oneof", "bad-utf8"],
)
def test_fields_of_the_wrong_type_are_named(message: type[Any], data: bytes, problem: str) -> None:
    """betterproto2 alone puts an int where a message belongs: AttributeError later, INTERNAL."""
    with pytest.raises(InvalidArgument) as refused:
        parse_strict(message, data)
    assert refused.value.message.startswith(message.__name__)
    assert problem in refused.value.message
