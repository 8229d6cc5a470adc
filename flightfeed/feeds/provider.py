"""What a user implements to discover work at runtime: one async stream of units per partition.

Providers run only on the coordinator. A unit is any betterproto2 message (`unit_type`); a
provider may also yield the already-encoded `bytes` of one, which skips encoding on the hot path.
A `unit_type` of `bytes` means units are opaque bytes end to end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from types import AsyncGeneratorType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, cast

import anyio
import betterproto2

from ..errors import FeedError
from ..messages import parse_strict
from ..protoencode import encode_message

if TYPE_CHECKING:
    from ..plan.base import TaskContext

PROVIDER_CLOSE_TIMEOUT: Final = 10.0
"""How long a cancelled provider's cleanup may take before it is abandoned."""

U = TypeVar("U")
U_co = TypeVar("U_co", covariant=True)


class WorkUnitFeedProvider(Protocol[U_co]):
    """Produces the work units of each partition, on the coordinator only.

    `feed` is called once per partition and runs in its own pull loop, so a slow partition never
    delays another. An optional `metrics() -> Mapping[str, int]` is surfaced on the coordinator.
    An optional `deterministic = True` says that any provider made for the same table and
    arguments discovers the same units of each partition in the same order (a file listing, a
    generated range; a queue's does not): a table's stream reopened on a new coordinator then
    resumes its readers at their checkpoints (coordinator/streams.py); without it they are
    refused, since the reopened stream's units are not the ones their offsets counted.
    """

    @property
    def unit_type(self) -> type[U_co]:
        """The betterproto2 message class of a unit (or `bytes`)."""
        ...

    def feed(self, partition: int, ctx: TaskContext, /) -> AsyncIterator[U_co | bytes]:
        """The units of `partition` (the feed's global partition index), in order."""
        ...


def provider_metrics(provider: WorkUnitFeedProvider[Any]) -> Mapping[str, int]:
    """The provider's optional metrics, or an empty mapping."""
    metrics = getattr(provider, "metrics", None)
    return cast(Mapping[str, int], metrics()) if callable(metrics) else {}


def encode_unit(unit: object) -> bytes:
    """The wire body of a unit: pre-encoded bytes as they are, a message serialized."""
    if isinstance(unit, bytes):
        return unit
    if isinstance(unit, betterproto2.Message):
        return encode_message(unit)
    if isinstance(unit, bytearray | memoryview):
        return bytes(unit)
    raise TypeError(f"a work unit must be a betterproto2 message or bytes, got {type(unit)!r}")


def unit_decoder(unit_type: type[U]) -> Callable[[bytes], U] | None:
    """How a consumer turns a body back into a unit; None when units are plain bytes."""
    if unit_type is bytes:
        return None
    if not (isinstance(unit_type, type) and issubclass(unit_type, betterproto2.Message)):
        raise TypeError(f"unit_type must be a betterproto2 message class or bytes: {unit_type!r}")
    # Units come off the network: checked against the schema, then decoded by flightfeed's
    # decoder (twice as fast as betterproto2's parse, which was 7% of a busy worker).
    return cast(Callable[[bytes], U], partial(parse_strict, unit_type))


def _finished_generator(stream: object) -> bool:
    """An async generator that returned or raised: its frame is gone and `aclose` is a no-op."""
    return isinstance(stream, AsyncGeneratorType) and stream.ag_frame is None


def cancelled_by_itself(what: object) -> FeedError:
    """A provider raised CancelledError while nothing cancelled it (it awaited a future that
    something else cancelled, a client library's own timeout): its error, as any other is.
    Taken for a cancellation, it failed the query as "the coordinator closed"."""
    return FeedError(f"{what}: the feed provider raised CancelledError while not cancelled")


async def close_feed(stream: object) -> Exception | None:
    """Close a provider's stream even while cancelled, but never wait on it forever.

    Returns the error its cleanup raised: it fails the partition like any provider error.
    """
    aclose = getattr(stream, "aclose", None)
    if aclose is None or _finished_generator(stream):
        return None  # (a generator that ran to its end has closed itself: no scopes needed)
    with anyio.CancelScope(shield=True), anyio.move_on_after(PROVIDER_CLOSE_TIMEOUT):
        try:
            await aclose()
        except Exception as exc:
            return exc
    return None
