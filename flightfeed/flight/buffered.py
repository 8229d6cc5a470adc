"""How a connection's protocol receives into buffers it chooses.

asyncio and uvloop read a socket into the protocol's own buffers (`get_buffer`,
`buffer_updated`) only for an `asyncio.BufferedProtocol`, which grpclib's H2Protocol (an
`asyncio.Protocol`) cannot be. `BufferedShim` is what the event loop sees of such a protocol:
every callback is passed on. Reads that are not placed in a message's own buffer
(message_buffer.py) go to a scratch buffer of the thread's, copied out before the next read as
the event loop would copy its own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Final, Protocol

SCRATCH_SIZE: Final = 256 * 1024
"""A read into scratch takes at most this much: uvloop's and asyncio's own read size."""
_local = threading.local()


class ReceivesIntoBuffers(Protocol):
    """An asyncio protocol that also implements BufferedProtocol's receive methods."""

    def connection_made(self, transport: Any) -> None: ...
    def connection_lost(self, exc: BaseException | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def eof_received(self) -> bool | None: ...
    def get_buffer(self, sizehint: int) -> memoryview: ...
    def buffer_updated(self, nbytes: int) -> None: ...


def scratch() -> memoryview:
    """This thread's scratch read buffer. A loop runs one read at a time (get_buffer, the
    read, buffer_updated), and what is read into it is copied out before the next."""
    try:
        view: memoryview = _local.scratch
    except AttributeError:
        view = _local.scratch = memoryview(bytearray(SCRATCH_SIZE))
    return view


class BufferedShim(asyncio.BufferedProtocol):
    """The event loop's view of `protocol`: a BufferedProtocol passing every callback on."""

    def __init__(self, protocol: ReceivesIntoBuffers) -> None:
        self.protocol = protocol

    def __getattr__(self, name: str) -> Any:
        # Anything else is the protocol's: grpclib's Channel keeps what the loop returned.
        return getattr(self.protocol, name)

    def connection_made(self, transport: Any) -> None:
        self.protocol.connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.protocol.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.protocol.buffer_updated(nbytes)


def loop_protocol(protocol: Any) -> Any:
    """What to hand the event loop for `protocol`: a shim if it receives into buffers."""
    return BufferedShim(protocol) if hasattr(protocol, "buffer_updated") else protocol


def connection_protocol(loop_side: Any) -> Any:
    """The protocol behind what the event loop was handed (loop_protocol's inverse)."""
    return loop_side.protocol if isinstance(loop_side, BufferedShim) else loop_side


__all__ = [
    "SCRATCH_SIZE",
    "BufferedShim",
    "ReceivesIntoBuffers",
    "connection_protocol",
    "loop_protocol",
    "scratch",
]
