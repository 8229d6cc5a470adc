"""Strict protobuf parsing for untrusted plan bytes.

betterproto2 parses leniently: a length-delimited record under a scalar field number becomes a
list, a truncated tag may be ignored. `parse_message` parses, then checks every field holds the
Python type its proto type promises, so codecs never see a list where they expect an int.
"""

from __future__ import annotations

import enum
from typing import TypeVar

import betterproto2

from ..errors import PlanDecodeError
from .nesting import check_nesting

M = TypeVar("M", bound=betterproto2.Message)

_INTS = frozenset(
    {
        "int32",
        "int64",
        "uint32",
        "uint64",
        "sint32",
        "sint64",
        "fixed32",
        "fixed64",
        "sfixed32",
        "sfixed64",
    }
)


MAX_NESTING = 200
"""Messages nested deeper than this are refused before parsing (nesting.py): plans and
expressions far deeper than any real query, and far below Python's recursion limit."""


def parse_message(message: type[M], data: bytes, what: str) -> M:
    """`message.parse(data)`, type-checked; PlanDecodeError naming `what` on any failure."""
    check_nesting(message, data, MAX_NESTING, what)
    try:
        msg = message.parse(bytes(data))
        problem = _check(msg, message.__name__)
    except PlanDecodeError:
        raise
    except Exception as exc:
        raise PlanDecodeError(f"{what} is not a valid {message.__name__}: {exc}") from exc
    if problem is not None:
        raise PlanDecodeError(f"{what} is not a valid {message.__name__}: {problem}")
    return msg


def _check(msg: betterproto2.Message, path: str) -> str | None:
    """The first field whose value has the wrong type, or None."""
    metadata = getattr(getattr(type(msg), "_betterproto", None), "meta_by_field_name", None)
    if metadata is None:  # unknown betterproto2 internals: re-encoding still catches most
        bytes(msg)
        return None
    for name, meta in metadata.items():
        value = getattr(msg, name)
        if value is None:
            continue
        if meta.repeated:
            if not isinstance(value, list):
                return f"{path}.{name} should be repeated"
            values = value
        else:
            values = [value]
        for item in values:
            problem = _check_value(item, meta.proto_type, f"{path}.{name}")
            if problem is not None:
                return problem
    return None


def _check_value(value: object, proto_type: str, path: str) -> str | None:
    if proto_type == "message":
        if not isinstance(value, betterproto2.Message):
            return f"{path} should be a message"
        return _check(value, path)
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "bytes": lambda v: isinstance(v, bytes),
        "float": lambda v: isinstance(v, float),
        "double": lambda v: isinstance(v, float),
        "enum": lambda v: isinstance(v, enum.Enum | int),
    }.get(proto_type)
    if proto_type in _INTS:
        valid = isinstance(value, int) and not isinstance(value, bool)
    else:
        valid = ok(value) if ok is not None else True
    return None if valid else f"{path} should be {proto_type}, got {type(value).__name__}"
