"""Plans ⇄ bytes. A `PlanCodec` (the seed's PhysicalExtensionCodec) encodes the payload of the
node kinds it owns; the registry walks the tree and wraps payloads in PlanNode envelopes.

Decoding never trusts its input: bad protobuf, unknown kinds, malformed payloads and invalid
nodes all raise PlanDecodeError naming the node's path (plan/0/1 = second input of the first
input of the root); unknown functions raise UnknownUdfError. Nothing is ever unpickled.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Protocol, TypeVar

import betterproto2

from .._generated.flightfeed.v1 import PlanNode
from ..errors import (
    FlightfeedError,
    InvalidArgument,
    PlanDecodeError,
    ResourceExhausted,
    UnknownUdfError,
)
from ..protoencode import encode_message
from .base import ExecutionPlan
from .functions import PlanSession
from .metrics import unwrap
from .protobuf import parse_message

MAX_PLAN_DEPTH = 128

M = TypeVar("M", bound=betterproto2.Message)


class DecodeBudget:
    """Bytes a plan's embedded data (MemoryScans) may decode to, all nodes together: the
    session's memory budget. Checked before Arrow decodes, from the sizes the data declares."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.used

    def charge(self, nbytes: int) -> None:
        self.used += nbytes


@dataclass(frozen=True)
class DecodeContext:
    """What a codec may use to rebuild a node: the session (UDFs), the registry, and the
    budget for the data the plan embeds."""

    session: PlanSession
    registry: CodecRegistry
    extensions: Mapping[str, object] = field(default_factory=dict)
    budget: DecodeBudget = field(default_factory=lambda: DecodeBudget(None))


class PlanCodec(Protocol):
    """Encodes and decodes the payload of the node kinds listed in `kinds` (node.name)."""

    @property
    def kinds(self) -> Collection[str]: ...

    def encode(self, node: ExecutionPlan, /) -> bytes: ...

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan: ...


def parse_payload(message: type[M], payload: bytes, kind: str) -> M:
    """Parse a node payload strictly (see protobuf.py); PlanDecodeError on any failure."""
    return parse_message(message, payload, f"{kind} payload")


K = TypeVar("K")
V = TypeVar("V")


def decode_enum(table: Mapping[K, V], value: V, what: str) -> K:
    """The key whose wire value is `value` in an encode table; PlanDecodeError if none is."""
    for key, wire in table.items():
        if wire == value:
            return key
    raise PlanDecodeError(f"unknown {what} {int(value)}")  # type: ignore[call-overload]


class CodecRegistry:
    """Node kind -> codec. Immutable: `with_codec` returns a new registry."""

    def __init__(self, codecs: Iterable[PlanCodec] = ()) -> None:
        by_kind: dict[str, PlanCodec] = {}
        for codec in codecs:
            for kind in codec.kinds:
                if kind in by_kind:
                    raise InvalidArgument(f"two codecs for plan node kind {kind!r}")
                by_kind[kind] = codec
        self._by_kind: Mapping[str, PlanCodec] = MappingProxyType(by_kind)

    @staticmethod
    def builtin() -> CodecRegistry:
        """The built-in nodes' codecs (shared, immutable)."""
        return _builtin_registry()

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._by_kind)

    def with_codec(self, codec: PlanCodec, *, replace: bool = False) -> CodecRegistry:
        """A registry that also knows `codec`; its kinds must be new unless `replace`."""
        taken = sorted(k for k in codec.kinds if k in self._by_kind)
        if taken and not replace:
            raise InvalidArgument(f"plan node kinds already have codecs: {taken}")
        merged = CodecRegistry()
        merged._by_kind = MappingProxyType({**self._by_kind, **dict.fromkeys(codec.kinds, codec)})
        return merged

    def get(self, kind: str) -> PlanCodec | None:
        return self._by_kind.get(kind)


@cache
def _builtin_registry() -> CodecRegistry:
    from .nodes import BUILTIN_CODECS

    return CodecRegistry(BUILTIN_CODECS)


def encode_plan(plan: ExecutionPlan, registry: CodecRegistry) -> bytes:
    """The plan as flightfeed.v1.PlanNode bytes; InvalidArgument for a kind with no codec."""
    return encode_message(_encode(plan, registry))


def _encode(plan: ExecutionPlan, registry: CodecRegistry) -> PlanNode:
    node = unwrap(plan)
    codec = registry.get(node.name)
    if codec is None:
        raise InvalidArgument(
            f"cannot encode plan node {node.name!r}: no codec registered for this kind"
        )
    return PlanNode(
        kind=node.name,
        payload=codec.encode(node),
        children=[_encode(child, registry) for child in node.children],
    )


def decode_plan(
    data: bytes,
    registry: CodecRegistry,
    session: PlanSession,
    *,
    extensions: Mapping[str, object] | None = None,
) -> ExecutionPlan:
    """Rebuild a plan from `encode_plan` bytes, resolving functions in `session`."""
    msg = parse_message(PlanNode, data, "plan bytes")
    budget = DecodeBudget(session.memory_budget_bytes)
    ctx = DecodeContext(session, registry, MappingProxyType(dict(extensions or {})), budget)
    return _decode(msg, ctx, "plan", 0)


def _decode(msg: PlanNode, ctx: DecodeContext, path: str, depth: int) -> ExecutionPlan:
    if depth > MAX_PLAN_DEPTH:
        raise PlanDecodeError(f"plan nested deeper than {MAX_PLAN_DEPTH} nodes at {path}")
    if not msg.kind:
        raise PlanDecodeError(f"plan node at {path} has no kind")
    codec = ctx.registry.get(msg.kind)
    if codec is None:
        raise PlanDecodeError(
            f"unknown plan node kind {msg.kind!r} at {path}; this session knows"
            f" {sorted(ctx.registry.kinds)} (register a codec in the session builder)"
        )
    children = [
        _decode(child, ctx, f"{path}/{i}", depth + 1) for i, child in enumerate(msg.children)
    ]
    try:
        return codec.decode(msg.kind, msg.payload, children, ctx)
    except (PlanDecodeError, UnknownUdfError, ResourceExhausted) as exc:
        raise type(exc)(f"{msg.kind} node at {path}: {exc.message}") from exc
    except FlightfeedError as exc:
        raise PlanDecodeError(f"invalid {msg.kind} node at {path}: {exc.message}") from exc
    except Exception as exc:
        raise PlanDecodeError(f"codec for {msg.kind} failed at {path}: {exc!r}") from exc
