"""Tables read as streams: work units discovered so far are the offsets.

A stream of a table runs the table's feed providers continuously on the coordinator, one pull
loop per (feed, partition), and logs the units each discovers. Its offset is the count of units
discovered per partition, keyed "<feed index>:<partition>". A micro-batch reads units
[start, end) of every partition: the table's plan is held on the workers as for a batch read,
its feeds served from the log instead of the providers, so a unit is read in exactly the
micro-batch whose range holds it, and a retried micro-batch reads the same units.

Memory stays bounded: a partition's provider pauses once `max_backlog` units wait uncommitted,
and committed units are dropped. Readers that name themselves (a Spark query's offsets carry
its reader id) each have a position: a unit is dropped once every such reader has committed
past it, so queries with checkpoints of their own read the same stream independently; a reader
not heard from for `reader_ttl` holds nothing back any more. A commit from a reader that does
not name itself drops the units below it for everyone. A stream nobody asked about for
`idle_ttl` is closed.

Each opening of a stream is an incarnation with an id of its own, which readers keep with their
offsets. A reopened stream (closed when idle or after a provider failed, or on a new
coordinator) numbers its units from 0 again: offsets of an earlier incarnation name the same
units only when every provider of the table declares `deterministic = True` (a new provider
discovers the same units in the same order). Otherwise a request carrying them is refused
(Conflict) rather than served units it never meant: a queue's new units would be skipped.
The reopened stream has not heard of the earlier one's readers: once one of them comes back,
the units held then are kept for `reader_ttl`, as for a reader just heard from, so that the
others resume at their checkpoints too (the first one's commits dropped them before).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup

from ..errors import Conflict, FeedError, InvalidArgument, NotFound, ResourceExhausted
from ..feeds import FeedRegistry, WorkUnitFeed
from ..feeds.provider import encode_unit
from ..plan.base import ExecutionPlan, TaskContext
from ..plan.functions import PlanSession

DEFAULT_MAX_BACKLOG: Final = 100_000
"""Units a stream partition may hold uncommitted before its provider pauses."""
DEFAULT_IDLE_TTL: Final = 600.0
DEFAULT_READER_TTL: Final = 600.0
"""Seconds a named reader's position holds units back after it was last heard from."""
MAX_READERS: Final = 1024
"""Named readers a stream keeps at once (their names come off the network)."""
DEFAULT_MAX_STREAMS: Final = 256
"""Streams a coordinator keeps open at once: each runs its table's providers and logs up to
`max_backlog` units a partition (60 opened with distinct arguments grew one by 300 MB)."""

Offsets = dict[str, int]


@dataclass(eq=False)
class _Log:
    """The units one partition discovered, from `base` (units below were committed)."""

    base: int = 0
    bodies: list[bytes] = field(default_factory=list)
    room: anyio.Event = field(default_factory=anyio.Event)
    grown: anyio.Event = field(default_factory=anyio.Event)
    error: Exception | None = None
    ended: bool = False

    @property
    def end(self) -> int:
        return self.base + len(self.bodies)

    def slice(self, start: int, end: int, where: str) -> list[bytes]:
        if start < self.base:
            raise FeedError(
                f"stream partition {where}: units from {start} were committed and dropped"
                f" (the stream keeps units from {self.base})"
            )
        if end > self.end:
            raise FeedError(f"stream partition {where}: units up to {end} were not discovered")
        return self.bodies[start - self.base : end - self.base]

    def commit(self, offset: int) -> None:
        drop = min(max(0, offset - self.base), len(self.bodies))
        if drop:
            del self.bodies[:drop]
            self.base += drop
            self.room.set()


@dataclass(eq=False)
class _Reader:
    """A named reader's position (the units it still needs start there) and when it was heard."""

    position: Offsets
    seen: float


class SliceProvider:
    """A feed provider serving logged units [start, end) of each partition (a micro-batch)."""

    def __init__(self, unit_type: type[Any], slices: Mapping[int, list[bytes]]) -> None:
        self.unit_type = unit_type
        self._slices = dict(slices)

    async def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[bytes]:
        for body in self._slices.get(partition, ()):
            yield body


class FeedStream:
    """One stream of a table: its plan, its feeds' pull loops and their logs."""

    def __init__(
        self,
        stream_id: str,
        plan: ExecutionPlan,
        feeds: list[tuple[ExecutionPlan, WorkUnitFeed[Any]]],
        *,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        reader_ttl: float = DEFAULT_READER_TTL,
    ) -> None:
        if not feeds:
            raise InvalidArgument("a table read as a stream needs a work-unit feed in its plan")
        self.stream_id = stream_id
        self.incarnation = uuid.uuid4().hex[:16]
        """This opening of the stream (module docstring)."""
        self.plan = plan
        self.feeds = [feed for _, feed in feeds]
        self.deterministic = all(
            getattr(feed.try_inner(), "deterministic", False) is True for feed in self.feeds
        )
        """Every provider discovers the same units in the same order whenever it runs."""
        self.max_backlog = max_backlog
        self.reader_ttl = reader_ttl
        self.readers: dict[str, _Reader] = {}
        self._earlier_readers: _Reader | None = None
        """What this incarnation holds for the earlier one's readers (module docstring)."""
        self.logs: dict[str, _Log] = {}
        self.last_used = anyio.current_time()
        self.fresh = True
        """Just started by the open that returned it: it has discovered nothing yet."""
        self.scope = anyio.CancelScope()
        self._partitions: dict[str, tuple[int, int]] = {}
        for index, (node, _) in enumerate(feeds):
            for partition in range(node.output_partitions):
                key = f"{index}:{partition}"
                self.logs[key] = _Log()
                self._partitions[key] = (index, partition)

    def touch(self) -> None:
        self.last_used = anyio.current_time()

    def check_incarnation(self, incarnation: str | None, what: str) -> None:
        """Refuse `what` (a request's offsets) taken in another incarnation of this stream,
        unless its providers are deterministic; None: a client that does not say (unchecked)."""
        if incarnation is None or incarnation == self.incarnation:
            return
        if self.deterministic:
            if self._earlier_readers is None:
                self._earlier_readers = _Reader(self.start(), anyio.current_time())
            return
        raise Conflict(
            f"{what} of stream {self.stream_id} were taken before the stream was reopened (closed"
            " when idle or after a provider failed, or a new coordinator), and its feed's"
            " provider does not declare `deterministic = True`: the reopened stream numbers new"
            " units from 0, so those offsets would skip or repeat units. Start the query from a"
            " new checkpoint to read the reopened stream from its start"
        )

    @property
    def failed(self) -> bool:
        """A provider failed: the stream reports it until it is reopened."""
        return any(log.error is not None for log in self.logs.values())

    def start(self) -> Offsets:
        """The oldest units the stream still holds, per partition key (a new reader's start)."""
        return {key: log.base for key, log in self.logs.items()}

    async def wait_discovered(self, key: str, count: int) -> None:
        """Until partition `key` has discovered `count` units (or ended, or failed)."""
        log = self.logs[key]
        while log.end < count and not log.ended and log.error is None:
            await log.grown.wait()

    @property
    def ended(self) -> bool:
        """Every partition's provider ended (a finite feed was discovered whole)."""
        return all(log.ended for log in self.logs.values())

    async def wait_ended(self) -> None:
        """Until every partition's provider ended or failed."""
        for log in self.logs.values():
            while not log.ended and log.error is None:
                await log.grown.wait()

    async def wait_reached(self, offsets: Mapping[str, int]) -> None:
        """Until every partition named in `offsets` discovered that many units (or ended, or
        failed): a reopened stream catching up with a reader's checkpoint."""
        for key, count in offsets.items():
            if key in self.logs:
                await self.wait_discovered(key, int(count))

    def latest(self) -> Offsets:
        """Units discovered so far, per partition key (a provider's failure is raised)."""
        self.touch()
        for key, log in self.logs.items():
            if log.error is not None:
                raise FeedError(
                    f"stream {self.stream_id} partition {key}: {log.error} (the next stream_open"
                    " starts the stream anew: a restarted query does)"
                )
        return {key: log.end for key, log in self.logs.items()}

    def read_by(self, reader: str, position: Mapping[str, int] | None = None) -> Offsets:
        """Reader `reader` is at `position` (None: where it was, or the oldest units held for
        a reader new to the stream); its position, which holds the units from it back."""
        now = anyio.current_time()
        found = self.readers.get(reader)
        if found is None:
            self._forget_silent_readers()
            if len(self.readers) >= MAX_READERS:
                raise ResourceExhausted(
                    f"stream {self.stream_id} has {len(self.readers)} readers heard from within"
                    f" {self.reader_ttl:g}s, its limit"
                )
            found = self.readers[reader] = _Reader(self.start(), now)
        if position is not None:
            found.position = {key: int(position.get(key, at)) for key, at in found.position.items()}
        found.seen = now
        return dict(found.position)

    def commit(self, offsets: Mapping[str, int], reader: str | None = None) -> None:
        """`reader` is done with the units below `offsets`: drop the units every named reader
        is done with (None: a reader that does not name itself, done for everyone)."""
        self.touch()
        if reader is None:
            for key, offset in offsets.items():
                log = self.logs.get(key)
                if log is not None:
                    log.commit(int(offset))
            return
        self.read_by(reader, offsets)
        self._forget_silent_readers(but=reader)
        holding = list(self.readers.values())
        earlier = self._earlier_readers
        if earlier is not None and earlier.seen >= anyio.current_time() - self.reader_ttl:
            holding.append(earlier)
        for key, log in self.logs.items():
            log.commit(min(found.position.get(key, log.base) for found in holding))

    def _forget_silent_readers(self, but: str | None = None) -> None:
        expired = anyio.current_time() - self.reader_ttl
        silent = [name for name, found in self.readers.items() if found.seen < expired]
        for name in silent:
            if name != but:
                del self.readers[name]

    def providers(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[SliceProvider]:
        """Per feed (in the plan's order), a provider serving units [start, end) of each
        partition."""
        self.touch()
        slices: dict[int, dict[int, list[bytes]]] = {}
        for key, log in self.logs.items():
            index, partition = self._partitions[key]
            first = int(start.get(key, log.base))
            last = int(end.get(key, first))
            if last < first:
                raise InvalidArgument(f"stream partition {key}: end {last} is before {first}")
            slices.setdefault(index, {})[partition] = log.slice(first, last, key)
        return [
            SliceProvider(feed.unit_type, slices.get(index, {}))
            for index, feed in enumerate(self.feeds)
        ]

    async def run(self, session: PlanSession) -> None:
        """Pull every partition until closed; a provider's error is kept for `latest`."""
        with self.scope:
            async with anyio.create_task_group() as tg:
                for key, (index, partition) in self._partitions.items():
                    tg.start_soon(self._pull, key, self.feeds[index], partition, session)

    async def _pull(
        self, key: str, feed: WorkUnitFeed[Any], partition: int, session: PlanSession
    ) -> None:
        log = self.logs[key]
        provider = feed.try_inner()
        ctx = TaskContext(session=session)
        try:
            stream = provider.feed(partition, ctx)
            async for unit in stream:
                log.bodies.append(encode_unit(unit))
                log.grown.set()
                log.grown = anyio.Event()
                while len(log.bodies) >= self.max_backlog:  # pause: nobody committed
                    log.room = anyio.Event()
                    await log.room.wait()
            log.ended = True
        except Exception as exc:  # the stream reports it; the others go on
            log.error = exc
        finally:
            if not log.ended and log.error is None:  # closed (idle, opened again, shut down):
                # its waiters look at `error` (they spun on `grown`, set for good, at 100% CPU)
                log.error = FeedError(f"stream {self.stream_id} was closed")
            log.grown.set()


class StreamRegistry:
    """The open streams of a coordinator, by id; each runs in `background` until closed."""

    def __init__(
        self,
        registry: FeedRegistry | None,
        session: PlanSession,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
    ) -> None:
        self._registry = registry
        self._session = session
        self.max_streams = max_streams
        self._streams: dict[str, FeedStream] = {}

    def open(
        self, key: str, plan: ExecutionPlan, background: TaskGroup, *, max_backlog: int
    ) -> FeedStream:
        """The stream of `key` (a table and its arguments), started if new (`fresh`)."""
        found_id = uuid.uuid5(uuid.NAMESPACE_URL, key).hex
        found = self._streams.get(found_id)
        if found is not None and not found.failed:
            found.touch()
            found.fresh = False
            return found
        if found is not None:  # its failure was reported to its readers: a new incarnation
            found.scope.cancel()
            del self._streams[found_id]
        if self._registry is None:
            raise InvalidArgument("the coordinator has no FeedRegistry: no table can stream")
        if len(self._streams) >= self.max_streams:
            raise ResourceExhausted(
                f"{len(self._streams)} streams are open, the most this coordinator keeps"
                f" ({self.max_streams}): a stream nobody asks about is closed after its idle"
                " time"
            )
        feeds = self._registry.feeds_in(plan)
        stream = FeedStream(found_id, plan, feeds, max_backlog=max_backlog)
        self._streams[found_id] = stream
        background.start_soon(stream.run, self._session, name=f"stream {found_id}")
        return stream

    def get(self, stream_id: str) -> FeedStream:
        found = self._streams.get(stream_id)
        if found is None:
            raise NotFound(
                f"no open stream {stream_id!r} on this coordinator (closed when idle, or the"
                " coordinator restarted)"
            )
        return found

    def close_idle(self, idle_ttl: float) -> None:
        now = anyio.current_time()
        for stream_id, stream in list(self._streams.items()):
            if now - stream.last_used > idle_ttl:
                stream.scope.cancel()
                del self._streams[stream_id]

    def close(self) -> None:
        for stream in self._streams.values():
            stream.scope.cancel()
        self._streams.clear()


def stream_key(table: str, arguments: tuple[Any, ...] | list[Any]) -> str:
    """What names a stream: a table and its arguments."""
    return json.dumps([table, list(arguments)], sort_keys=True)


def stream_id(table: str, arguments: tuple[Any, ...] | list[Any]) -> str:
    """A stream's id, the same wherever it is computed (a reader needs no state to know it)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, stream_key(table, arguments)).hex
