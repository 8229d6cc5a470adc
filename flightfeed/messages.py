"""Parsing protobuf messages from untrusted bytes, strictly.

betterproto2 parses leniently: a varint under a message field becomes an int where a message
was expected, a length-delimited record under a scalar field becomes a list, and nesting is
followed by recursion that copies each level. Every message flightfeed receives from the
network is parsed here instead, in three steps, each before anything believes the message:

1. the wire format (tags, wire types, varints, lengths within the buffer: protowire);
2. nesting, measured on the wire along the schema's message fields, iteratively, over
   memoryviews: a message nested 200,000 deep is refused at once, not after seconds of
   recursion;
3. after parsing, every field holds the Python type its proto type promises.

Each failure is an InvalidArgument naming the message, the field path and what was wrong.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Final, TypeVar

import betterproto2

from .errors import InvalidArgument
from .protowire import WIRE_LEN, check_wire_format, decode_varint, skip_field

M = TypeVar("M", bound=betterproto2.Message)

MAX_NESTING: Final = 200
"""Messages nested deeper than this are refused: far deeper than any real plan or expression,
and well within Python's recursion limit for betterproto2's parser."""

_INTS: Final = frozenset(
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
_SCALARS: Final[dict[str, Callable[[object], bool]]] = {
    "bool": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, bytes),
    "float": lambda v: isinstance(v, float),
    "double": lambda v: isinstance(v, float),
    "enum": lambda v: isinstance(v, enum.Enum | int),
}


def parse_strict(message: type[M], data: bytes, *, max_nesting: int = MAX_NESTING) -> M:
    """`message` from untrusted `data`; InvalidArgument naming what is wrong."""
    name = message.__name__
    try:
        check_wire_format(data)
        _check_nesting(message, memoryview(data), max_nesting)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{name}: {exc.message}") from None
    try:
        parsed = message.parse(bytes(data))
    except Exception as exc:  # betterproto2's own complaint about a value
        raise InvalidArgument(f"{name}: {type(exc).__name__}: {exc}") from None
    problem = _type_problem(parsed, name)  # names the field: "Ticket.ticket should be ..."
    if problem is not None:
        raise InvalidArgument(problem)
    return parsed


def _check_nesting(message: type[betterproto2.Message], buf: memoryview, limit: int) -> None:
    pending: list[tuple[type[betterproto2.Message], int, int, int]] = [(message, 0, len(buf), 0)]
    while pending:
        cls, pos, end, depth = pending.pop()
        if depth > limit:
            raise InvalidArgument(f"messages nested deeper than {limit}")
        children = _message_fields(cls)
        view = buf[:end]
        while pos < end:
            key, pos = decode_varint(view, pos)
            number, wire_type = key >> 3, key & 7
            child = children.get(number)
            if child is not None and wire_type == WIRE_LEN:
                length, pos = decode_varint(view, pos)
                if pos + length > end:
                    raise InvalidArgument("truncated nested message")
                pending.append((child, pos, pos + length, depth + 1))
                pos += length
            else:
                pos = skip_field(view, pos, wire_type)


@functools.cache
def _message_fields(cls: type[betterproto2.Message]) -> dict[int, type[betterproto2.Message]]:
    """Field number → message class, for the fields of `cls` that hold messages (not maps)."""
    metadata = getattr(cls, "_betterproto", None)
    if metadata is None:  # unknown betterproto2 internals: no nesting to follow
        return {}
    return {
        meta.number: metadata.cls_by_field[name]
        for name, meta in metadata.meta_by_field_name.items()
        if meta.proto_type == "message" and meta.map_meta is None
    }


def _type_problem(msg: betterproto2.Message, path: str) -> str | None:
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
            problem = _value_problem(item, meta.proto_type, f"{path}.{name}")
            if problem is not None:
                return problem
    return None


def _value_problem(value: object, proto_type: str, path: str) -> str | None:
    if proto_type == "message":
        if not isinstance(value, betterproto2.Message):
            return f"{path} should be a message, got {type(value).__name__}"
        return _type_problem(value, path)
    if proto_type in _INTS:
        valid = isinstance(value, int) and not isinstance(value, bool)
    else:
        check = _SCALARS.get(proto_type)
        valid = check(value) if check is not None else True
    return None if valid else f"{path} should be {proto_type}, got {type(value).__name__}"


__all__ = ["MAX_NESTING", "parse_strict"]
