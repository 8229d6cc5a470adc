"""Queries a coordinator service handed out, remembered after their release, so that a reader
of a released query's endpoints has it run again instead of failing.

Spark plans a DataFrame's read once (its endpoints) and reads that plan again in every later
query of the DataFrame, long after the held query behind it was released (held.py). A reader
whose endpoint's task is gone asks the coordinator where it went ("relocate"); for a released
query the answer is the same partition of a new run of the same query: the same table and
arguments, the same headers, read from the catalog as it is now. Every endpoint of the old
query asking meanwhile is sent to that one run, so one later query of a DataFrame reads one
run, as a query of a freshly defined DataFrame would. A run is used until it is released in
turn; the next reader then starts another.

A run must have the shape the reader planned for: as many tasks, partitions per task and the
same schema. A cluster that lost a worker may plan fewer tasks; the reader is then told to
define its DataFrame again, and so is every reader of that query asking for a minute after,
without another run. Stream micro-batches are not remembered (Spark plans each afresh),
and memory is bounded: the oldest queries are forgotten first.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio
import pyarrow as pa

from ..errors import NotFound
from ..flight import FlightDescriptor
from .held import HeldQuery

MAX_QUERIES: Final = 4096
"""Queries remembered at most (each is its descriptor and headers, a few hundred bytes)."""
MAX_BYTES: Final = 64 << 20
"""Bytes of descriptors and headers remembered at most (a TableQuery may carry pushed
filters with long literals)."""

REFUSED_FOR: Final = 60.0
"""Seconds the readers of a query whose new run had another shape are told so without
another run: each of its endpoints asks (a Spark query's every task, and their retries)."""

Hold = Callable[[FlightDescriptor, Mapping[str, str]], Awaitable[HeldQuery]]
"""Start a query (its descriptor, with its caller's headers) as the service does."""


@dataclass(eq=False)
class _Asked:
    """A query as it was asked for, and its latest run: weakly, as a run holds its tasks'
    encoded plans (a MemoryScan's rows among them), and once it ended nothing else does."""

    descriptor: FlightDescriptor
    headers: Mapping[str, str]
    shape: tuple[int, int]
    schema: pa.Schema
    size: int
    latest: weakref.ref[HeldQuery]
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    refused: tuple[float, NotFound] | None = None
    """When a new run last had another shape, and what its readers were told."""


class Reruns:
    """The queries handed out, by id (see the module docstring)."""

    def __init__(self, *, max_queries: int = MAX_QUERIES, max_bytes: int = MAX_BYTES) -> None:
        if max_queries < 0 or max_bytes < 0:
            raise ValueError(f"limits must be 0 or more, got {max_queries} and {max_bytes}")
        self.max_queries = max_queries
        self.max_bytes = max_bytes
        self._asked: OrderedDict[bytes, _Asked] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._asked)

    def remember(
        self, held: HeldQuery, descriptor: FlightDescriptor, headers: Mapping[str, str]
    ) -> None:
        """`held` was started for `descriptor` with `headers`: a reader may ask for it again."""
        size = len(descriptor.cmd) + sum(len(part) for part in descriptor.path)
        size += sum(len(name) + len(value) for name, value in headers.items())
        if size > self.max_bytes or self.max_queries == 0:
            return
        self._asked[held.query_id] = _Asked(
            descriptor, dict(headers), _shape(held), held.schema, size, weakref.ref(held)
        )
        self._bytes += size
        while len(self._asked) > self.max_queries or self._bytes > self.max_bytes:
            _, oldest = self._asked.popitem(last=False)
            self._bytes -= oldest.size

    def __contains__(self, query_id: object) -> bool:
        return query_id in self._asked

    def latest(self, query_id: bytes) -> HeldQuery | None:
        """The latest run of query `query_id`, released or not; None when it is not
        remembered, or its latest run ended and is gone."""
        asked = self._asked.get(query_id)
        return None if asked is None else asked.latest()

    async def rerun(self, query_id: bytes, hold: Hold) -> HeldQuery | None:
        """A run of query `query_id` that is not released: its latest, or a new one `hold`
        starts (one for every reader asking meanwhile). None when it is not remembered;
        NotFound when the new run has another shape than the one its readers planned for."""
        asked = self._asked.get(query_id)
        if asked is None:
            return None
        self._asked.move_to_end(query_id)  # (read again: the last to forget)
        async with asked.lock:
            latest = asked.latest()
            if latest is not None and not latest.released:
                return latest
            if asked.refused is not None and anyio.current_time() < asked.refused[0] + REFUSED_FOR:
                raise asked.refused[1]  # (every reader of that query asks: one run said it)
            held = await hold(asked.descriptor, asked.headers)
            shape = _shape(held)
            if shape != asked.shape or not held.schema.equals(asked.schema):
                held.release()
                now = f"{shape[0]} task(s) of {shape[1]} partition(s)"
                was = f"{asked.shape[0]} of {asked.shape[1]}"
                if shape == asked.shape:
                    now, was = f"columns {_columns(held.schema)}", _columns(asked.schema)
                refused = NotFound(
                    f"query {query_id.hex()} was released, and run again it has another"
                    f" shape ({now}; its readers planned for {was}): run it anew"
                )
                asked.refused = (anyio.current_time(), refused)
                raise refused
            asked.refused = None
            asked.latest = weakref.ref(held)
            return held


def _shape(held: HeldQuery) -> tuple[int, int]:
    return len(held.stage.tasks), held.stage.partitions_per_task


def _columns(schema: pa.Schema) -> str:
    """A schema in one line, cut for a message."""
    text = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return f"({text})" if len(text) <= 300 else f"({text[:300]}...)"
