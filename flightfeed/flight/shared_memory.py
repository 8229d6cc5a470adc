"""Arrow batches through shared memory between a server and a reader on the same host.

Over loopback, a Flight stream copies every byte into the kernel's socket buffers and out again
into gRPC's, and both processes pay for it: reading 247 MB from a worker into Spark's Python
workers cost them ~0.2 s of CPU more than reading the same batches from memory (issue 9). Here
the server writes each batch, as a self-contained Arrow IPC stream, into a slot of a file in a
memory file system (/dev/shm) that both processes map; the Flight stream carries only where it
is, and the reader takes the batch from its mapping in place (zero-copy) and lends the slot
back once every reference to the batch is gone.

The file is created with a random name, for this user only (0600), and is unlinked as soon as
the reader says it opened it: nothing is left in the directory when either process dies
later. A reader checks a random nonce at the file's start before trusting it, so a path that
is not the server's segment (another host's, another mount namespace's) is refused and the
read goes on inline. Everything a reader sends back is checked (it may only return the slots
it was lent); everything a server sends is checked against the segment's size.

Hand-written: Arrow Flight has no shared-memory transport, and this is one file's worth of
mapping, slot bookkeeping and four small control messages.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import stat
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from ..errors import InvalidArgument
from .json_object import json_object

COMMAND_PREFIX: Final = b"flightfeed.shared-memory-read.v1\n"
"""A DoExchange descriptor command: this prefix, then the ticket to read."""
HEADER_BYTES: Final = 4096
"""The segment's first page: the nonce. Slots follow, page-aligned (IPC buffers stay aligned)."""
NONCE_BYTES: Final = 16
DEFAULT_SLOTS: Final = 8
DEFAULT_SLOT_BYTES: Final = 4 << 20
"""A slot holds one batch: 64k rows of a few narrow columns. Larger batches go inline."""
MAX_SLOTS: Final = 1024
MAX_SLOT_BYTES: Final = 1 << 30
MAX_CONTROL_BYTES: Final = 64 * 1024
"""The largest control message either side accepts (a Freed message of every slot fits)."""
PREFIX: Final = "flightfeed-shm-"


DEFAULT_DIRECTORY: Final = "/dev/shm"
"""Linux's memory file system; where it does not exist, creating a segment fails (OSError) and
the server streams instead."""


def is_loopback_peer(peer: tuple[str, int] | None) -> bool:
    """Whether a call's peer address is this host's loopback (an IPv4-mapped one too): only
    such a reader can map a segment, so only it is offered one."""
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer[0].split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def read_command(ticket: bytes) -> bytes:
    """The DoExchange command that reads `ticket` through shared memory."""
    return COMMAND_PREFIX + ticket


def parse_read_command(command: bytes) -> bytes | None:
    """The ticket of a shared-memory read command; None for any other command."""
    if not command.startswith(COMMAND_PREFIX):
        return None
    return command[len(COMMAND_PREFIX) :]


# -- control messages ---------------------------------------------------------------------------


def _decode(data: bytes | memoryview | pa.Buffer | None, what: str) -> dict[str, Any]:
    if data is None:
        raise InvalidArgument(f"shared-memory read: expected {what}, got a message without one")
    raw = data.to_pybytes() if isinstance(data, pa.Buffer) else bytes(data)
    if len(raw) > MAX_CONTROL_BYTES:
        raise InvalidArgument(f"shared-memory read: {what} of {len(raw)} bytes is too large")
    try:
        return json_object(raw)
    except ValueError as exc:
        raise InvalidArgument(f"shared-memory read: {what} {exc}") from None


def _int(value: dict[str, Any], key: str, low: int, high: int, what: str) -> int:
    found = value.get(key)
    if type(found) is not int or not low <= found <= high:
        raise InvalidArgument(
            f"shared-memory read: {what}.{key} must be an integer in {low}..{high}"
        )
    return found


SEGMENT_ID_CHARS: Final = 32
"""A segment's id: 16 random bytes, in hex. Knowing it is what lets a reader reuse it."""
MAX_HELD: Final = 16
"""The most segment ids a request may list."""


def _segment_id(value: object, what: str) -> str:
    if (
        not isinstance(value, str)
        or len(value) != SEGMENT_ID_CHARS
        or value.strip("0123456789abcdef")
    ):
        raise InvalidArgument(
            f"shared-memory read: {what} is not a segment id ({SEGMENT_ID_CHARS} hex digits)"
        )
    return value


@dataclass(frozen=True)
class Request:
    """Reader -> server, first: the server's segments this reader still has mapped and not in
    use, any of which the server may reuse for this read instead of making a new one."""

    held: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps({"held": list(self.held)}).encode()

    @classmethod
    def decode(cls, data: bytes | memoryview | pa.Buffer | None) -> Request:
        held = _decode(data, "the request").get("held", [])
        if not isinstance(held, list) or len(held) > MAX_HELD:
            raise InvalidArgument(
                f"shared-memory read: the request's held must list at most {MAX_HELD} segments"
            )
        return cls(tuple(_segment_id(found, "a held segment") for found in held))


@dataclass(frozen=True)
class Offer:
    """Server -> reader, after the request: a new segment to map (`path`), one the reader holds
    (`reused`), or none (the batches come inline)."""

    path: str | None
    nonce: bytes = b""
    slots: int = 0
    slot_bytes: int = 0
    segment_id: str = ""
    reused: bool = False

    @property
    def offered(self) -> bool:
        return self.path is not None or self.reused

    def encode(self) -> bytes:
        if not self.offered:
            return b'{"segment":null}'
        return json.dumps(
            {
                "segment": self.path,
                "id": self.segment_id,
                "reused": self.reused,
                "nonce": self.nonce.hex(),
                "slots": self.slots,
                "slot_bytes": self.slot_bytes,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes | memoryview | pa.Buffer | None) -> Offer:
        value = _decode(data, "the offer")
        path = value.get("segment")
        reused = value.get("reused", False)
        if type(reused) is not bool:
            raise InvalidArgument("shared-memory read: the offer's reused must be true or false")
        if path is None and not reused:
            return cls(None)
        if path is not None and (not isinstance(path, str) or not os.path.isabs(path)):
            raise InvalidArgument("shared-memory read: the offer's segment is not an absolute path")
        nonce = value.get("nonce")
        try:
            nonce_bytes = bytes.fromhex(nonce) if isinstance(nonce, str) else b""
        except ValueError:
            nonce_bytes = b""
        if len(nonce_bytes) != NONCE_BYTES:
            raise InvalidArgument(
                f"shared-memory read: the offer's nonce is not {NONCE_BYTES} bytes"
            )
        slots = _int(value, "slots", 1, MAX_SLOTS, "offer")
        slot_bytes = _int(value, "slot_bytes", 1, MAX_SLOT_BYTES, "offer")
        if slot_bytes % HEADER_BYTES:
            raise InvalidArgument("shared-memory read: the offer's slots are not page-aligned")
        segment_id = _segment_id(value.get("id"), "the offer's id")
        return cls(path, nonce_bytes, slots, slot_bytes, segment_id, reused)

    def reuse(self) -> Offer:
        """This segment offered again, to the reader that already maps it."""
        return Offer(None, self.nonce, self.slots, self.slot_bytes, self.segment_id, True)


@dataclass(frozen=True)
class Reply:
    """Reader -> server, once: whether it mapped the segment (if not, batches come inline)."""

    opened: bool

    def encode(self) -> bytes:
        return b'{"opened":true}' if self.opened else b'{"opened":false}'

    @classmethod
    def decode(cls, data: bytes | memoryview | pa.Buffer | None) -> Reply:
        opened = _decode(data, "the reply").get("opened")
        if type(opened) is not bool:
            raise InvalidArgument("shared-memory read: the reply's opened must be true or false")
        return cls(opened)


@dataclass(frozen=True)
class Placed:
    """Server -> reader: a batch is in `slot`, `nbytes` long; `partition` it belongs to."""

    slot: int
    nbytes: int
    partition: int

    def encode(self) -> bytes:
        return _PLACED.pack(PLACED_MAGIC, self.slot, self.nbytes, self.partition)

    @classmethod
    def decode(cls, data: bytes | memoryview | pa.Buffer | None, offer: Offer) -> Placed:
        raw = data.to_pybytes() if isinstance(data, pa.Buffer) else data
        if raw is None or len(raw) != _PLACED.size or raw[:4] != PLACED_MAGIC:
            raise InvalidArgument(
                f"shared-memory read: a placed batch is {_PLACED.size} bytes starting"
                f" {PLACED_MAGIC!r}"
            )
        _, slot, nbytes, partition = _PLACED.unpack(raw)
        if not 0 <= slot < offer.slots:
            raise InvalidArgument(
                f"shared-memory read: placed batch.slot must be an integer in 0..{offer.slots - 1}"
            )
        if not 1 <= nbytes <= offer.slot_bytes:
            raise InvalidArgument(
                "shared-memory read: placed batch.nbytes must be an integer in"
                f" 1..{offer.slot_bytes}"
            )
        if partition > 2**31 - 1:
            raise InvalidArgument(
                "shared-memory read: placed batch.partition must be an integer in 0..2147483647"
            )
        return cls(slot, nbytes, partition)


PLACED_MAGIC: Final = b"PLCD"
_PLACED: Final = struct.Struct("<4sIQI")
"""A placed batch: the magic, then slot, nbytes, partition. Binary, where the other control
messages are JSON: there is one a batch, and parsing JSON was a tenth of the reader's CPU."""


END: Final = b'{"end":true}'
"""Server -> reader, after the last batch: stop lending slots back and finish sending (the
server waits for that before it ends the call, so that no unread message is reset away)."""


def is_end(data: bytes | memoryview | pa.Buffer | None) -> bool:
    raw = data.to_pybytes() if isinstance(data, pa.Buffer) else data
    return raw is not None and bytes(raw) == END


@dataclass(frozen=True)
class Freed:
    """Reader -> server: slots whose batches it no longer holds."""

    slots: tuple[int, ...]

    def encode(self) -> bytes:
        return json.dumps({"freed": list(self.slots)}).encode()

    @classmethod
    def decode(cls, data: bytes | memoryview | pa.Buffer | None, slots: int) -> Freed:
        found = _decode(data, "freed slots").get("freed")
        if not isinstance(found, list) or not all(type(s) is int and 0 <= s < slots for s in found):
            raise InvalidArgument(f"shared-memory read: freed must list slots in 0..{slots - 1}")
        return cls(tuple(found))


# -- the server's segment -----------------------------------------------------------------------


class Segment:
    """The server's side of one read: a file of `slots` slots, mapped for writing. Blocking
    calls (file system, copies): call them off the event loop."""

    def __init__(self, directory: str, slots: int, slot_bytes: int) -> None:
        if not 1 <= slots <= MAX_SLOTS or slot_bytes < 1 or slot_bytes % HEADER_BYTES:
            raise InvalidArgument("a shared-memory segment needs 1..1024 page-aligned slots")
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._framed: tuple[pa.Schema, int] | None = None
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.segment_id = secrets.token_hex(SEGMENT_ID_CHARS // 2)
        self.path = str(Path(directory) / f"{PREFIX}{os.getpid()}-{self.segment_id}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            # Every page taken now: a memory file system that is full (a container's 64 MiB
            # /dev/shm) fails here (OSError: the read streams), where a sparse file would kill
            # the writer with SIGBUS on the first page it could not have. Segments are kept
            # from read to read (worker/shared_memory_pool.py), so this is paid once.
            os.posix_fallocate(fd, 0, HEADER_BYTES + slots * slot_bytes)
            os.pwrite(fd, self.nonce, 0)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        try:
            self._file = pa.memory_map(self.path, "r+")
        except BaseException:
            self.unlink()
            raise

    @property
    def size(self) -> int:
        return HEADER_BYTES + self.slots * self.slot_bytes

    def offer(self) -> Offer:
        return Offer(self.path, self.nonce, self.slots, self.slot_bytes, self.segment_id)

    def fits(self, batch: pa.RecordBatch) -> bool:
        """Whether `batch`, as an IPC stream (schema, batch, end), surely fits a slot."""
        schema = batch.schema
        if self._framed is None or not self._framed[0].equals(schema):
            # The schema message and the end marker (a read's batches share one schema; each
            # batch has its own Schema object, so they are compared, in C++).
            self._framed = (schema, schema.serialize().size + 64)
        framing = self._framed[1]
        return bool(pa.ipc.get_record_batch_size(batch) + framing <= self.slot_bytes)

    def write(self, slot: int, batch: pa.RecordBatch) -> int:
        """Write `batch` into `slot` (which `fits` allowed); the bytes written."""
        start = HEADER_BYTES + slot * self.slot_bytes
        self._file.seek(start)
        with pa.ipc.new_stream(self._file, batch.schema) as writer:
            writer.write_batch(batch)
        written: int = self._file.tell() - start
        if written > self.slot_bytes:  # `fits` is a bound: this would be a bug, loudly
            raise RuntimeError(
                f"a batch of {written} bytes overran its {self.slot_bytes}-byte slot"
            )
        return written

    def unlink(self) -> None:
        """Remove the file's name (mappings stay valid); idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        self._file.close()


# -- the reader's mapping -----------------------------------------------------------------------


class _Lent:
    """Owns a slot's bytes while a batch uses them: freed with the last reference to it."""

    __slots__ = ("freed", "slot")

    def __init__(self, slot: int, freed: deque[int]) -> None:
        self.slot = slot
        self.freed = freed

    def __del__(self) -> None:
        self.freed.append(self.slot)  # (atomic: it may run on any thread)


class Mapping:
    """The reader's side: the server's segment mapped read-only, its batches read in place."""

    def __init__(self, offer: Offer, file: pa.MemoryMappedFile) -> None:
        self.offer = offer
        self._file = file
        self._whole = file.read_buffer(file.size())
        """The whole map as one buffer, sliced for each batch (a read of the file would
        advise the kernel, a system call, every time)."""
        self._freed: deque[int] = deque()
        self._lent: set[int] = set()

    @classmethod
    def open(cls, offer: Offer) -> Mapping | None:
        """The offered segment mapped, or None when this process cannot see it as the server's
        (another host or mount namespace, another user, not its nonce)."""
        if offer.path is None:
            return None
        try:
            info = os.stat(offer.path)
            expected = HEADER_BYTES + offer.slots * offer.slot_bytes
            if not stat.S_ISREG(info.st_mode) or info.st_size != expected:
                return None
            file = pa.memory_map(offer.path, "r")
        except (OSError, pa.ArrowException):
            return None
        if file.read_at(NONCE_BYTES, 0) != offer.nonce:
            file.close()
            return None
        return cls(offer, file)

    @property
    def segment_id(self) -> str:
        return self.offer.segment_id

    def matches(self, offer: Offer) -> bool:
        """Whether `offer` reuses this very segment (its id, nonce and layout)."""
        mine = self.offer
        return (
            offer.reused
            and offer.segment_id == mine.segment_id
            and offer.nonce == mine.nonce
            and (offer.slots, offer.slot_bytes) == (mine.slots, mine.slot_bytes)
        )

    def all_returned(self) -> bool:
        """Whether every batch read from it has been released: only then may the server reuse
        it, starting with every slot its own."""
        self.take_freed()
        return not self._lent

    def batch(self, placed: Placed) -> pa.RecordBatch:
        """The batch in `placed.slot`, zero-copy; its slot is lent back once it is released."""
        if placed.slot in self._lent:
            raise InvalidArgument(
                f"shared-memory read: slot {placed.slot} was placed again while still in use"
            )
        start = HEADER_BYTES + placed.slot * self.offer.slot_bytes
        region = self._whole.slice(start, placed.nbytes)  # (zero-copy: a slice of the map)
        self._lent.add(placed.slot)
        owner = _Lent(placed.slot, self._freed)
        lent = pa.foreign_buffer(region.address, region.size, base=(owner, region))
        del owner, region
        try:
            reader = pa.ipc.open_stream(pa.BufferReader(lent))
            batch = reader.read_next_batch()
        except (pa.ArrowException, StopIteration) as exc:
            raise InvalidArgument(
                f"shared-memory read: slot {placed.slot} is not a batch: {exc}"
            ) from None
        return batch

    def lend_back_due(self) -> bool:
        """Whether to lend the released slots back now: half the slots are waiting to go
        back, or the server has no slot left (every one is this reader's). Each message back
        costs the server more than a copy into its slot (an HTTP/2 frame to parse), and in
        groups the server still always has a slot ahead of the reader."""
        waiting = len(self._freed)
        return waiting >= max(1, self.offer.slots // 2) or (
            waiting > 0 and len(self._lent) >= self.offer.slots
        )

    def take_freed(self) -> list[int]:
        """Slots whose batches were released since the last call (to lend back)."""
        freed = []
        while self._freed:
            freed.append(self._freed.popleft())  # (atomic, as the appends)
        self._lent.difference_update(freed)
        return freed

    def close(self) -> None:
        self._whole = pa.py_buffer(b"")  # (idempotent)
        self._file.close()  # (batches still held keep their pages mapped)


__all__ = [
    "COMMAND_PREFIX",
    "DEFAULT_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "END",
    "Freed",
    "Mapping",
    "Offer",
    "Placed",
    "Reply",
    "Request",
    "Segment",
    "DEFAULT_DIRECTORY",
    "is_end",
    "is_loopback_peer",
    "parse_read_command",
    "read_command",
]
