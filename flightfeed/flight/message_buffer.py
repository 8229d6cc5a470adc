"""A call's receive buffer that gives each large gRPC message a buffer of its own, for the
socket to read it straight into.

grpclib's stream buffer queues each DATA payload as it comes and joins a message's pieces when
it is read: a copy of every byte, after the event loop's own copy from its read buffer into a
`bytes`. `MessageBuffer` follows the call's gRPC framing (a 5-byte prefix, then the message)
as data is added. Once the prefix of a large message is in, the message gets a buffer of
exactly its length, and the connection (grpc.TunedH2Protocol.get_buffer) has the socket read
the rest of the message into it (`claim`): the kernel's copy is the only one. The reader gets
the message as a view of that buffer (`read_view`), or as `bytes` (`read`, grpclib's API).

Which messages get a buffer is the connection's PlacementBudget: PLACEMENT_MIN to
PLACEMENT_MAX bytes, while the buffers of messages still arriving hold less than
PLACEMENT_BUDGET (a buffer is allocated on the peer's word, before the data that fills it).
Other messages are queued as they came; bytes of a message that arrived with its prefix,
before its buffer existed, are copied into it. Flow control is grpclib's: each payload is
acknowledged when the reader takes it, so a call whose reader does not read closes its window.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Final

import pyarrow as pa

PLACEMENT_MIN: Final = 64 * 1024
"""Smaller messages are queued as they arrive: their copy costs less than a buffer of their own."""
PLACEMENT_MAX: Final = 256 * 1024 * 1024
PLACEMENT_BUDGET: Final = 512 * 1024 * 1024
"""Bytes a connection may hold in buffers of messages still arriving."""
GRPC_PREFIX_SIZE: Final = 5

_POOL: Final = pa.system_memory_pool()
"""Where message buffers come from: malloc, as the `bytes` grpclib would have built. Tuned
processes keep its freed memory for the next message (tuning.tune_malloc); Arrow's own pool
takes transparent huge pages, zeroed 2 MiB at a time, where flightfeed came after pyarrow."""
_END: Final = object()
"""Queued by eof(): the call's data ended."""


class PlacementBudget:
    """Which of a connection's messages get buffers of their own, and what they hold.

    A buffer is allocated on the peer's word, before the data that fills it: buffers of
    messages still arriving hold at most `limit` bytes, so a peer that declares messages it
    never sends holds no more than that; past it, messages are received piece by piece (as by
    grpclib), in the memory their data takes. `placed_messages` and `placed_bytes` count the
    messages that were received into buffers of their own, in full."""

    def __init__(
        self,
        limit: int = PLACEMENT_BUDGET,
        *,
        min_size: int = PLACEMENT_MIN,
        max_size: int = PLACEMENT_MAX,
    ) -> None:
        self.limit = limit
        self.min_size = min_size
        self.max_size = max_size
        self.held = 0
        self.placed_messages = 0
        self.placed_bytes = 0

    def take(self, size: int) -> bool:
        """Whether a message of `size` bytes gets a buffer (held until given back)."""
        if not self.min_size <= size <= self.max_size or self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int, *, complete: bool) -> None:
        self.held -= size
        if complete:
            self.placed_messages += 1
            self.placed_bytes += size


class MessageBuffer:
    """A call's received data: grpclib's Buffer interface (`add`, `eof`, `read`,
    `unacked_size`), with large messages received into buffers of their own."""

    def __init__(self, ack: Callable[[int], None], budget: PlacementBudget) -> None:
        self._ack = ack
        self._budget = budget
        # Added, not yet taken by the reader: (data, or None for an acknowledgement only; the
        # flow-controlled bytes to acknowledge when it is taken), or _END.
        self._queue: asyncio.Queue[tuple[memoryview | None, int] | object] = asyncio.Queue()
        self._taken: deque[memoryview] = deque()
        self._taken_size = 0
        self._ended = False
        # The framing of what was added: prefix bytes seen, then the message's bytes still due.
        self._prefix = bytearray()
        self._message_left = 0
        # The message being received into a buffer of its own.
        self._owner: pa.Buffer | None = None
        self._target: memoryview | None = None
        self._filled = 0

    # -- the connection's side ----------------------------------------------------------------

    def claim(self, limit: int) -> memoryview | None:
        """Where the next `limit` bytes of this call's data (or fewer) go if received in
        place: the rest of the message now arriving, when it has a buffer of its own."""
        target = self._target
        if target is None:
            return None
        end = self._filled + min(limit, self._message_left)
        return target[self._filled : end]

    def prefix_read(self, payload_left: int) -> int:
        """Bytes to read alone next (0: no need): the rest of a gRPC prefix, when the DATA
        payload arriving (`payload_left` bytes still due) is large enough to hold a message
        that gets a buffer of its own, which can then take the rest."""
        if self._message_left or payload_left < self._budget.min_size:
            return 0
        return min(GRPC_PREFIX_SIZE - len(self._prefix), payload_left)

    @property
    def placing(self) -> bool:
        """Whether a message is being received into a buffer of its own."""
        return self._target is not None

    def add(self, data: bytes | memoryview, ack_size: int) -> None:
        """DATA payload bytes of the call, `ack_size` flow-controlled bytes in all. Bytes no
        message buffer takes are queued as one run, as grpclib queues a payload."""
        owner = self._owner
        if owner is not None and isinstance(data, memoryview) and data.obj is owner:
            self._advance(len(data))  # received in place (a claim): nothing to copy
            self._queue.put_nowait((None, ack_size))
            return
        view = memoryview(data)
        end = len(view)
        pos = run = 0  # `run`: where the bytes not yet queued start
        while pos < end:
            target = self._target
            if target is not None:  # arrived before the message's buffer could take them
                take = min(self._message_left, end - pos)
                target[self._filled : self._filled + take] = view[pos : pos + take]
                pos = run = pos + take
                self._advance(take)
            elif self._message_left:
                take = min(self._message_left, end - pos)
                self._message_left -= take
                pos += take
            else:
                take = min(GRPC_PREFIX_SIZE - len(self._prefix), end - pos)
                self._prefix += view[pos : pos + take]
                pos += take
                if len(self._prefix) == GRPC_PREFIX_SIZE:
                    self._message_left = int.from_bytes(self._prefix[1:], "big")
                    self._prefix.clear()
                    if self._message_left and self._start_message(self._message_left):
                        self._queue.put_nowait((view[run:pos], 0))  # up to its prefix
                        run = pos
        self._queue.put_nowait((view[run:end] if run < end else None, ack_size))

    def eof(self) -> None:
        """The call's data ended (what a message had received so far is readable, short)."""
        target = self._target
        if target is not None and self._filled:
            self._queue.put_nowait((target[: self._filled], 0))
        self._drop_target()
        self._queue.put_nowait(_END)

    def close(self) -> None:
        """The call is over: what it received and did not read is dropped, and its message
        buffer (if any) no longer counts against the budget."""
        self._drop_target()
        self._taken.clear()
        self._taken_size = 0

    def unacked_size(self) -> int:
        """Flow-controlled bytes added and not taken (acknowledged when the call closes)."""
        size = 0
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, tuple):
                size += item[1]
        return size

    # -- the reader's side --------------------------------------------------------------------

    async def read(self, size: int) -> bytes:
        """The next `size` bytes (fewer only at the end), as grpclib's Buffer.read."""
        data = await self.read_view(size)
        return data if isinstance(data, bytes) else data.tobytes()

    async def read_view(self, size: int) -> bytes | memoryview:
        """As `read`, but a message received into a buffer of its own comes as a view of it
        (no copy); b"" at the end of the data."""
        if size == 0:
            return b""
        while self._taken_size < size and not self._ended:
            item = await self._queue.get()
            if not isinstance(item, tuple):
                self._ended = True
                break
            data, ack_size = item
            if ack_size:
                self._ack(ack_size)
            if data is not None and len(data):
                self._taken.append(data)
                self._taken_size += len(data)
        if self._ended and not self._taken_size:
            return b""
        if self._taken_size < size:
            raise AssertionError("Received less data than expected")  # as grpclib's Buffer
        first = self._taken[0]
        if len(first) == size and isinstance(first.obj, pa.Buffer):
            self._taken.popleft()
            self._taken_size -= size
            return first
        return self._join(size)

    def _join(self, size: int) -> bytes:
        chunks: list[memoryview] = []
        left = size
        while left:
            chunk = self._taken[0]
            if len(chunk) <= left:
                chunks.append(chunk)
                self._taken.popleft()
                left -= len(chunk)
            else:
                chunks.append(chunk[:left])
                self._taken[0] = chunk[left:]
                left = 0
        self._taken_size -= size
        return b"".join(chunks)

    # -- placement -----------------------------------------------------------------------------

    def _start_message(self, size: int) -> bool:
        """Whether the message now starting gets a buffer of its own (it then has one)."""
        if not self._budget.take(size):
            return False
        owner = pa.allocate_buffer(size, memory_pool=_POOL)
        self._owner = owner
        self._target = memoryview(owner).cast("B")
        self._filled = 0
        return True

    def _advance(self, size: int) -> None:
        self._filled += size
        self._message_left -= size
        if not self._message_left:
            target = self._target
            assert target is not None
            self._queue.put_nowait((target, 0))
            self._drop_target(complete=True)

    def _drop_target(self, *, complete: bool = False) -> None:
        if self._target is not None:
            self._budget.give(len(self._target), complete=complete)
            self._owner = self._target = None
            self._filled = 0


__all__ = [
    "GRPC_PREFIX_SIZE",
    "PLACEMENT_BUDGET",
    "PLACEMENT_MAX",
    "PLACEMENT_MIN",
    "MessageBuffer",
    "PlacementBudget",
]
