"""Parsing protobuf messages from untrusted bytes, strictly.

betterproto2 parses leniently: a varint under a message field becomes an int where a message
was expected, a length-delimited record under a scalar field becomes a list, and nesting is
followed by recursion that copies each level. Every message flightfeed receives from the
network is checked here first, in one iterative pass over the wire through every level:

1. the wire format (tags, wire types, varints, lengths within their message);
2. each known field's wire type against its proto type, so betterproto2 can only give it
   the Python type the proto promises (a varint for an int, a length for a message, a
   string, bytes or a packed repeated scalar, ...);
3. nesting, measured along the schema's message fields: a message nested 200,000 deep is
   refused at once, not after seconds of recursion;
4. what it would parse to: its fields and packed values for its size (a Python object each),
   and its unknown fields (which betterproto2 keeps quadratically).

One pass, with no walk of the parsed objects afterwards, keeps the check a fraction of the
parse even for large TaskMetrics. Each failure is an InvalidArgument naming the message, the
field path and what was wrong.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeVar, cast

import betterproto2

from .errors import InvalidArgument, ResourceExhausted
from .protodecode import decode_message
from .protowire import WIRE_I32, WIRE_I64, WIRE_LEN, WIRE_VARINT, decode_varint, skip_field

M = TypeVar("M", bound=betterproto2.Message)

BYTES_PER_VALUE: Final = 12
"""A message may hold one field or packed value for every this many bytes (past the minimum
below). A parsed value costs ~50 bytes or more (a bytes, an int, a list slot), so a message
of 4-byte values parsed to 14 times its size; at one in 12 bytes it is at most ~5 times, as a
payload's decoded size is bounded at 4 times. The least real values run longer: a HoraeDB row
with nothing but its timestamp is 14 bytes on the wire."""
MIN_VALUE_BUDGET: Final = 1 << 20
"""Whatever its size, a message may hold this many (so no small message is refused)."""
MAX_UNKNOWN_FIELDS: Final = 4096
"""Unknown fields a message may carry (a newer peer's additions are a few). betterproto2 keeps
them by appending each to the bytes of those before: quadratic, 160,000 took a second."""
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
    _check_wire(message, data, max_nesting)
    checked = _schema(message) is not None  # every level's wire types match the schema
    try:
        parsed = decode_message(message, data) if checked else message.parse(bytes(data))
    except InvalidArgument as exc:  # two members of a oneof, in this message or one inside it
        named = exc.message if exc.message.startswith(name) else f"{name}: {exc.message}"
        raise InvalidArgument(named) from None
    except Exception as exc:  # a value's own complaint (an enum's, UTF-8's)
        raise InvalidArgument(f"{name}: {type(exc).__name__}: {exc}") from None
    if not checked:  # unknown betterproto2 internals: check the parsed types
        problem = _type_problem(parsed, name)
        if problem is not None:
            raise InvalidArgument(problem)
    return parsed


class _Field(NamedTuple):
    """What the wire may hold for one field of a message."""

    name: str
    expected: str  # the proto type, as error messages name it
    wire_types: frozenset[int]
    child: type[betterproto2.Message] | None  # the message a length-delimited value holds
    packed_width: int | None  # a packed repeated scalar's bytes a value (0: varints), or None


_WIRE_NAMES: Final = {
    WIRE_VARINT: "a varint",
    WIRE_I64: "a 64-bit value",
    WIRE_LEN: "a length-delimited value",
    WIRE_I32: "a 32-bit value",
}
_FIXED_WIRE: Final = {
    "fixed32": WIRE_I32,
    "sfixed32": WIRE_I32,
    "float": WIRE_I32,
    "fixed64": WIRE_I64,
    "sfixed64": WIRE_I64,
    "double": WIRE_I64,
}


def _check_wire(message: type[betterproto2.Message], data: bytes, limit: int) -> None:
    """The wire format of every level, each known field's wire type, and the nesting depth."""
    name = message.__name__
    try:
        _walk(message, memoryview(data), limit)
    except _MisplacedField as exc:  # names the field's whole path already
        raise InvalidArgument(exc.message) from None
    except IndexError:  # an inline read past the buffer
        raise InvalidArgument(f"{name}: truncated protobuf message") from None
    except InvalidArgument as exc:
        raise InvalidArgument(f"{name}: {exc.message}") from None


class _MisplacedField(InvalidArgument):
    """A known field with the wrong wire type (raised as a plain InvalidArgument)."""


def _walk(message: type[betterproto2.Message], buf: memoryview, limit: int) -> None:
    # (schema, start, end, depth, field path); nested messages are checked after their parent.
    pending = [(_schema(message), 0, len(buf), 0, f"{message.__name__}.")]
    # Values parsing will make (a Python object each, ~50 bytes and more): at most one for
    # every BYTES_PER_VALUE bytes, so that no message can parse to many times its size.
    budget = max(MIN_VALUE_BUDGET, len(buf) // BYTES_PER_VALUE)
    values = 0
    while pending:
        schema, pos, end, depth, path = pending.pop()
        if depth > limit:
            raise InvalidArgument(f"messages nested deeper than {limit}")
        unknown = 0
        while pos < end:
            values += 1
            if values > budget:
                raise _too_many(budget, len(buf))
            key = buf[pos]  # most tags and lengths are one byte: decoded inline
            if key < 0x80:
                pos += 1
            else:
                key, pos = decode_varint(buf, pos)
            number, wire_type = key >> 3, key & 7
            field = schema.get(number) if schema is not None else None
            if field is None:  # an unknown field: well-formed is all it must be
                if number == 0:
                    raise InvalidArgument("malformed protobuf: field number 0")
                unknown += 1
                if unknown > MAX_UNKNOWN_FIELDS:
                    problem = f"more than {MAX_UNKNOWN_FIELDS} unknown fields in {path[:-1]}"
                    raise InvalidArgument(problem)
                pos = skip_field(buf, pos, wire_type)
            elif wire_type not in field.wire_types:
                got = _WIRE_NAMES.get(wire_type, f"wire type {wire_type}")
                problem = f"{path}{field.name} should be {field.expected}, got {got}"
                raise _MisplacedField(problem)
            elif wire_type == WIRE_LEN:
                length = buf[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = decode_varint(buf, pos)
                if field.child is not None:
                    within = f"{path}{field.name}."
                    pending.append((_schema(field.child), pos, pos + length, depth + 1, within))
                elif field.packed_width is not None:
                    values += _packed_count(buf, pos, length, field.packed_width)
                    if values > budget:
                        raise _too_many(budget, len(buf))
                pos += length
                if field.child is None and key < 0x80:  # a run of it: HoraeDB's rows, a bytes each
                    while pos < end and buf[pos] == key:
                        length = buf[pos + 1]
                        if length < 0x80:
                            pos += 2 + length
                        else:
                            length, pos = decode_varint(buf, pos + 1)
                            pos += length
                        values += 1
                        if field.packed_width is not None:
                            values += _packed_count(buf, pos - length, length, field.packed_width)
                        if values > budget:
                            raise _too_many(budget, len(buf))
            else:
                pos = skip_field(buf, pos, wire_type)
            if pos > end:
                raise InvalidArgument(f"truncated field {number} of {path[:-1]}")


_CONTINUED: Final = bytes(range(0x80, 0x100))


def _packed_count(buf: memoryview, pos: int, length: int, width: int) -> int:
    """The values in a packed record: its length over their width, or its varints' last bytes."""
    if width:
        return length // width
    return len(bytes(buf[pos : pos + length]).translate(None, _CONTINUED))


def _too_many(budget: int, size: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"a message of {size} bytes holds more than {budget} fields and values (at most one for"
        f" every {BYTES_PER_VALUE} bytes, or {MIN_VALUE_BUDGET}): it would parse to many times"
        " its size"
    )


@functools.cache
def _schema(cls: type[betterproto2.Message]) -> dict[int, _Field] | None:
    """Field number → what the wire may hold there; None for unknown betterproto2 internals."""
    metadata = getattr(cls, "_betterproto", None)
    if metadata is None:
        return None
    fields: dict[int, _Field] = {}
    for name, meta in metadata.meta_by_field_name.items():
        kind: str = meta.proto_type
        child: type[betterproto2.Message] | None = None
        packed_width: int | None = None
        if kind in ("message", "map"):
            wire_types = frozenset({WIRE_LEN})
            child = meta.unwrap() if meta.unwrap else metadata.cls_by_field.get(name)
            if not (isinstance(child, type) and issubclass(child, betterproto2.Message)):
                child = None
            expected = "a message" if kind == "message" else "a map entry"
        elif kind in ("string", "bytes"):
            wire_types, expected = frozenset({WIRE_LEN}), kind
        else:  # a scalar: its own wire type, or packed in a length-delimited record
            wire = _FIXED_WIRE.get(kind, WIRE_VARINT)
            wire_types = frozenset({wire, WIRE_LEN} if meta.repeated else {wire})
            expected = kind
            if meta.repeated:
                packed_width = {WIRE_I32: 4, WIRE_I64: 8}.get(wire, 0)
        fields[meta.number] = _Field(name, expected, wire_types, child, packed_width)
    return fields


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


def oneof_member(message: betterproto2.Message, group: str) -> tuple[str, Any]:
    """The member of `group` set in `message` and its value, ("", None) if none: the members
    are tried in field-number order (betterproto2's which_one_of took ~7 µs a message)."""
    for name in _oneof_members(type(message), group):
        value = getattr(message, name)
        if value is not None:
            return name, value
    return "", None


@functools.cache
def _oneof_members(cls: type[betterproto2.Message], group: str) -> tuple[str, ...]:
    meta = cast(Any, cls)._betterproto
    return tuple(
        name
        for _, name in sorted(
            (field.number, name)
            for name, field in meta.meta_by_field_name.items()
            if field.group == group
        )
    )


__all__ = ["MAX_NESTING", "oneof_member", "parse_strict"]
