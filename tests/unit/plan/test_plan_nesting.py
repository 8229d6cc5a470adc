"""Nesting is measured on the wire before betterproto2 parses (and recurses into) a message."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import Expr, FunctionCall, PlanNode
from flightfeed.errors import PlanDecodeError
from flightfeed.plan import CodecRegistry, decode_plan
from flightfeed.plan.nesting import check_nesting
from flightfeed.plan.protobuf import MAX_NESTING
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
        check_nesting(PlanNode, data, MAX_NESTING, "plan")
        assert PlanNode.parse(data).kind == "Coalesce"
    else:
        with pytest.raises(PlanDecodeError, match=f"nests messages deeper than {MAX_NESTING}"):
            check_nesting(PlanNode, data, MAX_NESTING, "plan")


def test_a_plan_200000_deep_is_refused_at_once() -> None:
    data = nested_plan(200_000)
    started = time.perf_counter()
    with pytest.raises(PlanDecodeError, match="nests messages deeper than"):
        decode_plan(data, CodecRegistry.builtin(), Session())
    # Before the scan, betterproto2 recursed and copied each level: 1.3 s on a quiet machine.
    assert time.perf_counter() - started < 1.0


def test_nesting_is_followed_through_every_message_field() -> None:
    expr = Expr(call=FunctionCall(function="now"))
    for _ in range(MAX_NESTING // 2):  # Expr → FunctionCall → Expr: two messages a level
        expr = Expr(call=FunctionCall(function="negate", args=[expr]))
    with pytest.raises(PlanDecodeError, match="nests messages deeper than"):
        check_nesting(Expr, bytes(expr), MAX_NESTING, "expr")


def test_truncated_nested_messages_are_refused() -> None:
    data = b"\x0a\x08Coalesce\x1a\x10\x0a\x08"  # a child that claims 16 bytes, has 2
    with pytest.raises(PlanDecodeError, match="truncated"):
        check_nesting(PlanNode, data, MAX_NESTING, "plan")
