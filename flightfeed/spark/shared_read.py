"""A worker's ticket read through shared memory with pyarrow's C++ client, when the worker is
on this host (flight/shared_memory.py has the why and the protocol; the worker's side is
worker/rpc/shared_memory_read.py).

The read is a DoExchange: the first message names the ticket and the segment of that worker
this process still maps, the worker offers that segment again or a new one, and this side maps
it (or says it could not: the batches then come inline, as DoGet sends them).
Batches placed in the segment are read in place, zero-copy; each slot is lent back once every
reference to its batch is gone, before the next message is waited for. A worker that does not
know the exchange (an older one) is read with DoGet.

A mapping outlives its read: Spark reuses its Python workers, and the next read of the same
worker asks for the same segment again (its pages already in place at both ends, where a new
segment costs a page fault per 4 KiB on each side, as much CPU as the socket's copies). A
process keeps at most MAX_HELD_MAPPINGS, the least recently used dropped first.
"""

from __future__ import annotations

import ipaddress
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Final

import pyarrow as pa
import pyarrow.flight as fl

from ..errors import InvalidArgument
from ..flight.client import parse_location
from ..flight.shared_memory import (
    Freed,
    Mapping,
    Offer,
    Placed,
    Reply,
    Request,
    is_end,
    read_command,
)

MAX_HELD_MAPPINGS: Final = 4
"""Segments a process keeps mapped between reads (one per worker it reads from, the most
recently read)."""


class HeldMappings:
    """This process's segments kept between reads, one per worker location; a read borrows
    its worker's for its duration (a concurrent read of the same worker gets a new one)."""

    def __init__(self, limit: int = MAX_HELD_MAPPINGS) -> None:
        self._limit = limit
        self._held: OrderedDict[str, Mapping] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    @contextmanager
    def borrow(self, location: str) -> Iterator[list[Mapping | None]]:
        """[the location's idle mapping, or None]; set the item to what the read ended with
        (kept for the next read; a mapping it replaces is closed)."""
        with self._lock:
            held = self._held.pop(location, None)
        if held is not None and not held.all_returned():
            held.close()  # (its batches keep their pages; the server will not reuse it)
            held = None
        slot: list[Mapping | None] = [held]
        try:
            yield slot
        finally:
            kept = slot[0]
            if held is not None and held is not kept:
                held.close()
            if kept is not None:
                self._keep(location, kept)

    def _keep(self, location: str, mapping: Mapping) -> None:
        with self._lock:
            replaced = self._held.pop(location, None)
            self._held[location] = mapping
            dropped = [replaced] if replaced is not None else []
            while len(self._held) > self._limit:
                dropped.append(self._held.popitem(last=False)[1])
        for old in dropped:
            old.close()


HELD = HeldMappings()


def on_this_host(location: str) -> bool:
    """Whether `location` is a loopback address (the worker shares this host's memory)."""
    try:
        host, _ = parse_location(location)
    except InvalidArgument:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_ticket(
    client: fl.FlightClient,
    location: str,
    ticket: bytes,
    call: fl.FlightCallOptions,
    held: HeldMappings = HELD,
    *,
    reading: Callable[[fl.FlightStreamReader], None] = lambda reader: None,
) -> Iterator[pa.RecordBatch]:
    """The ticket's batches, through shared memory where the worker at `location` offers it
    (a segment `held` from an earlier read of it, or a new one). `reading` is told of each
    reader (to cancel one that waits too long: idle_watch.py)."""
    descriptor = fl.FlightDescriptor.for_command(read_command(ticket))
    with held.borrow(location) as kept:
        previous = kept[0]
        writer, reader = client.do_exchange(descriptor, call)
        reading(reader)
        refused = False
        try:
            request = Request((previous.segment_id,) if previous is not None else ())
            try:
                writer.write_metadata(pa.py_buffer(request.encode()))
                offer = Offer.decode(reader.read_chunk().app_metadata)
            except pa.ArrowNotImplementedError:  # a server without shared-memory reads (its
                refused = True  # refusal raised where the request went, or the answer came)
                plain = client.do_get(fl.Ticket(ticket), call)
                reading(plain)
                yield from (chunk.data for chunk in plain)
                return
            if offer.reused:
                mapping = previous if previous is not None and previous.matches(offer) else None
            else:
                mapping = Mapping.open(offer)
            if offer.offered:
                writer.write_metadata(pa.py_buffer(Reply(mapping is not None).encode()))
            if mapping is None:
                writer.done_writing()  # (everything comes inline: nothing to lend back)
                yield from (chunk.data for chunk in reader)
                return
            kept[0] = mapping
            yield from _placed(reader, writer, offer, mapping)
        finally:
            if refused:
                with suppress(pa.ArrowNotImplementedError):  # (it says the refusal again)
                    writer.close()
            else:
                writer.close()


def _placed(
    reader: fl.FlightStreamReader, writer: fl.FlightStreamWriter, offer: Offer, mapping: Mapping
) -> Iterator[pa.RecordBatch]:
    """The batches of a mapped read, placed or inline; released slots are lent back before a
    wait for the next message, in groups (Mapping.lend_back_due), until the worker says it
    sent the last."""
    lending = True
    while True:
        if lending and mapping.lend_back_due() and (freed := mapping.take_freed()):
            try:
                writer.write_metadata(pa.py_buffer(Freed(tuple(freed)).encode()))
            except (fl.FlightError, pa.ArrowException, OSError):
                lending = False  # the call failed: the next read raises its status
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        if chunk.data is not None:
            yield chunk.data
        elif is_end(chunk.app_metadata):
            if lending:
                lending = False
                writer.done_writing()
        else:
            yield mapping.batch(Placed.decode(chunk.app_metadata, offer))


__all__ = ["HELD", "MAX_HELD_MAPPINGS", "HeldMappings", "on_this_host", "read_ticket"]
