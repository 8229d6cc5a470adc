"""Hypothesis strategies for betterproto2 messages, built from the classes' own schemas: any
values, fields unset or at their defaults, one member of each oneof."""

from __future__ import annotations

import enum
from typing import Any, cast

import betterproto2
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_RANGES = {
    "uint64": (0, 2**64 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "fixed64": (0, 2**64 - 1),
    "fixed32": (0, 2**32 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
}


def _value(proto_type: str, field_cls: Any, depth: int) -> st.SearchStrategy[Any]:
    if proto_type in _RANGES:
        low, high = _RANGES[proto_type]
        return st.integers(low, high)
    if proto_type == "bool":
        return st.booleans()
    if proto_type in ("float", "double"):
        if proto_type == "float":
            return st.floats(allow_nan=False, width=32)
        return st.floats(allow_nan=False)
    if proto_type == "string":
        return st.text(max_size=12)
    if proto_type == "bytes":
        return st.binary(max_size=24)
    if proto_type == "enum":
        assert isinstance(field_cls, type)
        assert issubclass(field_cls, enum.Enum)
        return st.sampled_from(list(field_cls))
    assert proto_type == "message", proto_type
    return messages(field_cls, depth + 1)


def messages(cls: type[betterproto2.Message], depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of `cls` with any values: unset, default or not; one member of each oneof."""
    meta: Any = cast(Any, cls)._betterproto
    plain: dict[str, st.SearchStrategy[Any]] = {}
    groups: dict[str, list[tuple[str, st.SearchStrategy[Any]]]] = {}
    for name, field in meta.meta_by_field_name.items():
        if field.proto_type == "message" and depth >= 3:
            continue  # bounded nesting (plans nest themselves)
        if field.unwrap is not None:
            continue  # a wrapped well-known type (a Timestamp as datetime): betterproto2's own
        field_cls = meta.cls_by_field.get(name)
        value = _value(field.proto_type, field_cls, depth)
        if field.repeated:
            value = st.lists(value, max_size=3)
        elif field.optional or field.proto_type == "message":
            value = st.none() | value
        if field.group is not None:
            groups.setdefault(field.group, []).append((name, value))
        else:
            plain[name] = value

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kwargs = {name: draw(strategy) for name, strategy in plain.items()}
        for members in groups.values():
            chosen = draw(st.sampled_from([None, *range(len(members))]))
            if chosen is not None:
                name, strategy = members[chosen]
                kwargs[name] = draw(strategy.filter(lambda v: v is not None))
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    return build()


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` (a message's wire bytes) with one to four changes: a byte replaced, the rest
    cut off, or a few bytes inserted. Malformed in the many ways a parser meets, yet often
    close enough to get past its first checks."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        index = draw(st.integers(0, len(data) - 1))
        change = draw(st.sampled_from(["replace", "cut", "insert"]))
        if change == "replace":
            data[index] = draw(st.integers(0, 255))
        elif change == "cut":
            del data[index:]
        else:
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def live_fuzz_settings(examples: int) -> settings:
    """Settings for fuzzing a live server: `examples` calls, no deadline (a call's time is the
    server's, not the test's), nothing replayed from a database (the server's state moves on),
    and no health checks (drawing is cheap; the calls are what is slow)."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
