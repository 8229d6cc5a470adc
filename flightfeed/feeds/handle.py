"""`WorkUnitFeed`: the handle a plan node stores, the same code on coordinator and worker.

On the coordinator it wraps the provider and `feed` calls it directly. Its proto form is only
the feed's 16-byte UUID, never the provider; decoded on a worker it becomes a remote handle
whose `feed` reads what the coordinator streams into the task's FeedInbox, found in
`ctx.extensions[FEED_INBOX_KEY]`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final, Generic, cast

from .._generated.flightfeed.v1 import WorkUnitFeedProto
from ..errors import FeedError, InvalidArgument
from .inbox import FeedInbox
from .provider import U, WorkUnitFeedProvider, unit_decoder

if TYPE_CHECKING:
    from ..plan.base import TaskContext

FEED_INBOX_KEY: Final = "flightfeed.feeds.inbox"
"""Key of the task's FeedInbox in TaskContext.extensions, set by the worker."""


class WorkUnitFeed(Generic[U]):
    """A feed of work units, local (with its provider) or remote (just the id)."""

    __slots__ = ("_decode", "_id", "_provider", "_unit_type")

    def __init__(
        self,
        feed_id: bytes,
        unit_type: type[U],
        provider: WorkUnitFeedProvider[U] | None = None,
    ) -> None:
        if len(feed_id) != 16:
            raise InvalidArgument(f"a feed id is 16 UUID bytes, got {len(feed_id)} bytes")
        self._id = bytes(feed_id)
        self._unit_type = unit_type
        self._decode = unit_decoder(unit_type)
        self._provider = provider

    @classmethod
    def new(cls, provider: WorkUnitFeedProvider[U]) -> WorkUnitFeed[U]:
        """A local feed with a fresh random id (call once per plan, on the coordinator)."""
        return cls(uuid.uuid4().bytes, provider.unit_type, provider)

    @classmethod
    def from_proto(cls, proto: WorkUnitFeedProto, unit_type: type[U]) -> WorkUnitFeed[U]:
        """The remote handle a worker decodes from a node payload."""
        return cls(proto.id, unit_type)

    def to_proto(self) -> WorkUnitFeedProto:
        """Only the id travels; the provider stays on the coordinator."""
        return WorkUnitFeedProto(id=self._id)

    @property
    def id(self) -> bytes:
        return self._id

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._id)

    @property
    def unit_type(self) -> type[U]:
        return self._unit_type

    @property
    def is_remote(self) -> bool:
        return self._provider is None

    def inner(self) -> WorkUnitFeedProvider[U] | None:
        """The provider on the coordinator; None for a remote handle."""
        return self._provider

    def try_inner(self) -> WorkUnitFeedProvider[U]:
        """The provider, or FeedError on a worker (where only the handle exists)."""
        if self._provider is None:
            raise FeedError(f"feed {self.uuid} is remote here: its provider is on the coordinator")
        return self._provider

    def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[U]:
        """The units of `partition`; errors about the call itself are raised here, eagerly.

        Local: the provider's stream (bytes it yields are decoded into `unit_type`). Remote:
        the task's inbox, where `partition` is the task-local partition index.
        """
        if self._provider is not None:
            return self._local(self._provider.feed(partition, ctx))
        inbox = ctx.extensions.get(FEED_INBOX_KEY)
        if not isinstance(inbox, FeedInbox):
            raise FeedError(
                f"feed {self.uuid} is remote but the task has no feed inbox: the coordinator"
                " did not declare this feed to the worker. Register the node type that holds it"
                " in the Coordinator's FeedRegistry (feed_registry=...), so the planner finds"
                " the feed and streams its units; a remote feed runs only inside a worker task"
            )
        if self._decode is None:
            return cast(AsyncIterator[U], inbox.bodies(self._id, partition))
        return inbox.decoded(self._id, partition, self._decode)

    async def _local(self, stream: AsyncIterator[U | bytes]) -> AsyncIterator[U]:
        decode = self._decode
        try:
            async for unit in stream:
                if decode is not None and isinstance(unit, bytes):
                    yield decode(unit)
                else:
                    yield cast(U, unit)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkUnitFeed) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        where = "remote" if self._provider is None else repr(self._provider)
        return f"WorkUnitFeed({self.uuid}, {self._unit_type.__name__}, {where})"
