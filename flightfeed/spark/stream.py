"""The `flightfeed` data source as a Structured Streaming source.

Offsets are the work units the table's providers discovered so far, per feed partition (the
coordinator runs them as a stream while readers use it). Each micro-batch reads the units
between two offsets, held on the workers like a batch read; a retried micro-batch reads the
same units. `maxUnitsPerTrigger` caps a micro-batch (a ReadMaxRows limit from Spark caps it
too), `Trigger.AvailableNow` reads what was discovered when the query started (with
`awaitFeedEnd` seconds, it first waits up to that long for a finite feed to be discovered
whole: what a triggered Declarative Pipeline run over a finite feed wants), and a query
restarted from its checkpoint resumes at the checkpointed offsets: no unit is read twice. A
stream reopened on the coordinator (closed when idle or after a provider failed, or a new
coordinator) starts from nothing: a query behind its checkpoint waits for the providers to
discover those units again, and a micro-batch Spark runs again reopens it. An offset names the
stream's incarnation it was taken in and the query as a reader of it ({"incarnation", "reader",
"units"}): the coordinator refuses offsets of an earlier incarnation when the providers are not
deterministic (their new units are not the ones counted), and holds each reader's units until
that reader commits them, so queries with checkpoints of their own do not drop each other's.
A stream that AvailableNow's own open started gets a few seconds to discover what its providers
have before the run's offsets are taken.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..coordinator.streams import stream_id
from ..coordinator.table_query import UnitRange, table_command
from ..errors import FlightfeedError, InvalidArgument, NotFound
from . import client
from .source import TableOptions, read_partition

MAX_UNITS_OPTION = "maxunitspertrigger"
FRESH_STREAM_WAIT = 5.0
"""Seconds Trigger.AvailableNow waits, without awaitFeedEnd, for a stream its own open started
(a finite feed ends sooner): read at once, such a stream has discovered nothing."""
AWAIT_END_OPTION = "awaitfeedend"


class FlightfeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a table's stream micro-batch by micro-batch (see the module docstring)."""

    def __init__(self, table: TableOptions, schema: StructType, options: Any) -> None:
        self.table = table
        self.schema = schema
        self.stream = stream_id(table.table, list(table.arguments))
        self.max_units, self.await_end = stream_options(options)
        self.target: dict[str, int] | None = None
        self.opened = False
        """This reader opened the stream once (a failed stream is started anew by an open)."""
        self.reader: str | None = None
        """The query's name as a reader of the stream, kept in its offsets: the coordinator
        holds the units from its position back for it (made by its first offset)."""

    # -- offsets ----------------------------------------------------------------------------

    def _open(self) -> dict[str, Any]:
        command = table_command(self.table.table, self.table.arguments)
        return self._action("stream_open", command)

    def _action(
        self, kind: str, body: bytes, timeout: float = client.DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        table = self.table
        return client.stream_action(
            table.uri, kind, body, table.headers, timeout, connection=table.connection
        )

    def _latest(self, position: dict[str, Any] | None = None) -> dict[str, Any]:
        """The stream's answer now: its incarnation and offsets, and this reader's position
        (`position`, an offset of this query, moves it there)."""
        if not self.opened:  # (a query restarted after its stream failed starts it anew)
            self.opened = True
            self._open()
        request: dict[str, Any] = {"stream": self.stream}
        if self.reader is not None:
            request["reader"] = self.reader
        if position is not None:
            request["position"] = _units(position)
            incarnation = _incarnation(position)
            if incarnation is not None:
                request["incarnation"] = incarnation
        body = json.dumps(request).encode()
        try:
            return self._action("stream_latest", body)
        except NotFound:  # closed while idle: open it again (its offsets restart)
            self._open()
            return self._action("stream_latest", body)

    def initialOffset(self) -> dict[str, Any]:
        self.reader = self.reader or uuid.uuid4().hex  # (Spark may ask more than once)
        answer = self._latest()  # (a reader new to the stream starts at its oldest units)
        return _offset(answer["incarnation"], self.reader, _counts(answer["position"]))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_units) if self.max_units else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        opened = self._open()
        wait = self.await_end or (FRESH_STREAM_WAIT if opened.get("opened") else 0.0)
        if wait > 0:  # (a stream this open started has discovered nothing yet: it read none)
            self._wait({"timeout": wait})
        self.target = _counts(self._latest()["offsets"])

    def _wait(self, request: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"stream": self.stream, **request}).encode()
        return self._action("stream_wait", body, timeout=request["timeout"] + self.table.timeout)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self.reader = _reader(start) or self.reader or uuid.uuid4().hex
        answer = self._latest(start)
        latest = _counts(answer["offsets"])
        begun, incarnation = _units(start), _incarnation(start)
        reopened = incarnation is not None and incarnation != answer["incarnation"]
        if reopened or any(v > latest.get(k, 0) for k, v in begun.items()):
            # Reopened (closed when idle or after a failure, or a new coordinator): its
            # providers discover their units again, up to this query's checkpoint if they are
            # deterministic (the coordinator refuses these offsets otherwise).
            answer = self._wait(_at_least(begun, incarnation, self.table.timeout))
            latest = _counts(answer["offsets"])
        return _offset(answer["incarnation"], self.reader, self._end(begun, latest, limit))

    def _end(
        self, start: dict[str, int], latest: dict[str, int], limit: ReadLimit
    ) -> dict[str, int]:
        """The next micro-batch's end: what was discovered, within AvailableNow's target and
        the read limit."""
        if self.target is not None:
            latest = {
                k: min(v, max(self.target.get(k, v), int(start.get(k, 0))))
                for k, v in latest.items()
            }
        behind = [k for k, v in start.items() if int(v) > latest.get(k, 0)]
        if behind:
            raise FlightfeedError(
                f"the stream of {self.table.table} on {self.table.uri} has discovered fewer"
                f" units than this query's checkpoint for partitions {behind} within"
                f" {self.table.timeout:g}s: it was reopened (closed when idle or after a provider"
                " failed, or the coordinator restarted), and its providers have not discovered"
                " those units again"
            )
        if isinstance(limit, ReadMaxRows):
            return _capped(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict[str, Any] | None:
        answer = self._latest()
        return _offset(answer["incarnation"], self.reader, _counts(answer["offsets"]))

    # -- micro-batches ------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = _units(start), _units(end)
        if all(last.get(k, 0) <= v for k, v in first.items()) and set(last) <= set(first):
            return []
        incarnation = _incarnation(end)
        units = UnitRange(self.stream, first, last, incarnation or "")
        command = table_command(
            self.table.table, self.table.arguments, columns=self.table.columns, units=units
        )
        try:
            endpoints = self._endpoints(command)
        except NotFound:  # reopened since its offsets (a micro-batch Spark runs again)
            self._open()
            self._wait(_at_least(last, incarnation, self.table.timeout))
            endpoints = self._endpoints(command)
        return [InputPartition(endpoint) for endpoint in endpoints]

    def _endpoints(self, command: bytes) -> list[client.Endpoint]:
        _, endpoints = client.get_endpoints(
            self.table.uri,
            command,
            self.table.headers,
            self.table.timeout,
            connection=self.table.connection,
        )
        return endpoints

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.table, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        request: dict[str, Any] = {"stream": self.stream, "offsets": _units(end)}
        incarnation, reader = _incarnation(end), _reader(end) or self.reader
        if incarnation is not None:
            request["incarnation"] = incarnation
        if reader is not None:
            request["reader"] = reader
        self._action("stream_commit", json.dumps(request).encode())


def _offset(incarnation: str, reader: str | None, units: dict[str, int]) -> dict[str, Any]:
    """A Spark offset: units discovered per partition key, in the stream's `incarnation`, as
    seen by `reader` (the query)."""
    found: dict[str, Any] = {"incarnation": str(incarnation), "units": units}
    if reader is not None:
        found["reader"] = reader
    return found


def _reader(offset: dict[str, Any]) -> str | None:
    """The reader an offset was taken by (None: a checkpoint from before readers had names)."""
    found = offset.get("reader")
    return found if isinstance(found, str) else None


def _units(offset: dict[str, Any]) -> dict[str, int]:
    """An offset's unit counts; a checkpoint from before incarnations holds only the counts."""
    found = offset.get("units")
    return _counts(found if isinstance(found, dict) else offset)


def _incarnation(offset: dict[str, Any]) -> str | None:
    """The stream incarnation an offset was taken in (None: a checkpoint from before them)."""
    found = offset.get("incarnation")
    return found if isinstance(found, str) else None


def _counts(offsets: dict[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in offsets.items()}


def _at_least(units: dict[str, int], incarnation: str | None, timeout: float) -> dict[str, Any]:
    """A stream_wait until `units` were discovered, checked against their incarnation."""
    request: dict[str, Any] = {"timeout": timeout, "at_least": units}
    if incarnation is not None:
        request["incarnation"] = incarnation
    return request


def stream_options(options: Any) -> tuple[int | None, float]:
    """(maxUnitsPerTrigger, awaitFeedEnd) of a stream read's options, checked; the source's
    schema() checks them too, when the DataFrame is defined (pyspark hides an error raised
    where a stream starts behind an UnboundLocalError)."""
    found = {str(k).lower(): str(v) for k, v in dict(options).items()}
    max_units: int | None = None
    if MAX_UNITS_OPTION in found:
        try:
            max_units = int(found[MAX_UNITS_OPTION])
        except ValueError:
            raise InvalidArgument("option 'maxUnitsPerTrigger' must be an integer") from None
        if max_units < 1:
            raise InvalidArgument("option 'maxUnitsPerTrigger' must be at least 1")
    await_end = 0.0
    if AWAIT_END_OPTION in found:
        try:
            await_end = float(found[AWAIT_END_OPTION])
        except ValueError:
            raise InvalidArgument("option 'awaitFeedEnd' must be a number of seconds") from None
        if await_end < 0:
            raise InvalidArgument("option 'awaitFeedEnd' must not be negative")
        if not await_end < math.inf:  # (NaN too)
            raise InvalidArgument("option 'awaitFeedEnd' must be a finite number of seconds")
    return max_units, await_end


def _capped(start: dict[str, int], latest: dict[str, int], budget: int) -> dict[str, int]:
    """At most `budget` units past `start`, shared out in turn among the partitions that have
    some, the ones read least so far first: when the budget is smaller than the number of
    partitions, the next micro-batch serves the ones this one left out, so none starves."""
    end = {k: int(start.get(k, 0)) for k in latest}
    left = {k: latest[k] - end[k] for k in latest}
    while budget > 0 and any(n > 0 for n in left.values()):
        waiting = sorted((k for k, n in left.items() if n > 0), key=lambda k: (end[k], k))
        share = max(1, budget // len(waiting))
        for key in waiting:
            take = min(share, left[key], budget)
            end[key] += take
            left[key] -= take
            budget -= take
            if budget == 0:
                break
    return end
