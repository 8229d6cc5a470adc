"""How deeply an untrusted protobuf message nests its messages, found before parsing it.

betterproto2 parses recursively and copies what each nested message holds: a PlanNode nested
200,000 deep took seconds to fail on Python's recursion limit, with the event loop or a worker
thread busy all along. This scan follows the message schema (only fields that hold messages)
over memoryviews, iteratively, and stops at the limit.
"""

from __future__ import annotations

import functools

import betterproto2

from ..errors import InvalidArgument, PlanDecodeError
from ..protowire import WIRE_LEN, decode_varint, skip_field


def check_nesting(message: type[betterproto2.Message], data: bytes, limit: int, what: str) -> None:
    """PlanDecodeError if `data`, read as `message`, nests messages more than `limit` deep."""
    try:
        _scan(message, memoryview(data), limit, what)
    except PlanDecodeError:
        raise
    except InvalidArgument as exc:  # the wire format's own complaint
        raise PlanDecodeError(f"{what} is not a valid {message.__name__}: {exc.message}") from None


def _scan(message: type[betterproto2.Message], buf: memoryview, limit: int, what: str) -> None:
    pending: list[tuple[type[betterproto2.Message], int, int, int]] = [(message, 0, len(buf), 0)]
    while pending:
        cls, pos, end, depth = pending.pop()
        if depth > limit:
            raise PlanDecodeError(f"{what} nests messages deeper than {limit}")
        children = _message_fields(cls)
        view = buf[:end]
        while pos < end:
            key, pos = decode_varint(view, pos)
            number, wire_type = key >> 3, key & 7
            child = children.get(number)
            if child is not None and wire_type == WIRE_LEN:
                length, pos = decode_varint(view, pos)
                if pos + length > end:
                    raise PlanDecodeError(f"{what}: truncated nested message")
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
