"""Arrow IPC message framing without copying bodies.

Encoding: pyarrow's stream writer writes into `IpcMessageSplitter`, which receives every body
buffer as a zero-copy `pa.Buffer` and cuts the byte stream into (header, body views) messages.
Decoding: `IpcMessageFeed` hands pushed messages to pyarrow's stream reader as memoryviews, so
dictionaries (deltas and replacements) are handled by Arrow C++ itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import pyarrow as pa

from ..ipcwire import MessageKind, peek_message

__all__ = [
    "CONTINUATION",
    "Buffer",
    "IpcMessage",
    "IpcMessageFeed",
    "IpcMessageSplitter",
    "MessageKind",
    "WriteOnlyFile",
    "peek_message",
]

CONTINUATION: Final = b"\xff\xff\xff\xff"
_I32 = struct.Struct("<i")

Buffer: TypeAlias = "bytes | memoryview | pa.Buffer"


@dataclass
class IpcMessage:
    """One encapsulated IPC message: flatbuffer header and body buffers (views, not copies)."""

    header: bytes
    body: list[Buffer] = field(default_factory=list)
    body_length: int = 0


class WriteOnlyFile:
    """The rest of pyarrow's PythonFile protocol for a sink that only implements `write`."""

    closed = False

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class IpcMessageSplitter(WriteOnlyFile):
    """A write-only file for `pa.ipc.new_stream` that collects whole IPC messages.

    Arrow writes each message as continuation, length, header (+padding), then the body buffers
    and their padding. Small pieces are copied (header); body buffers are kept as the very
    `pa.Buffer` objects Arrow passes, which point at the record batch's own memory.
    """

    def __init__(self) -> None:
        self.messages: list[IpcMessage] = []
        self._prefix = bytearray()
        self._header = bytearray()
        self._header_length = -1
        self._current: IpcMessage | None = None
        self._body_missing = 0

    def write(self, data: Buffer) -> int:
        view = memoryview(data) if not isinstance(data, memoryview) else data
        size = view.nbytes
        pos = 0
        while pos < size:
            if self._current is not None:
                take = min(self._body_missing, size - pos)
                if pos == 0 and take == size:
                    self._current.body.append(data)  # the whole write, as Arrow gave it
                else:
                    self._current.body.append(view[pos : pos + take])
                pos += take
                self._body_missing -= take
                if self._body_missing == 0:
                    self._finish()
            elif self._header_length < 0:
                take = min(8 - len(self._prefix), size - pos)
                self._prefix += view[pos : pos + take]
                pos += take
                if len(self._prefix) == 8:
                    self._start_header()
            else:
                take = min(self._header_length - len(self._header), size - pos)
                self._header += view[pos : pos + take]
                pos += take
                if len(self._header) == self._header_length:
                    self._start_body()
        return size

    def _start_header(self) -> None:
        if self._prefix[:4] != CONTINUATION:
            raise ValueError("Arrow wrote a pre-1.0 IPC message without continuation marker")
        self._header_length = _I32.unpack_from(self._prefix, 4)[0]
        self._prefix.clear()
        if self._header_length == 0:  # end-of-stream marker: not a message
            self._header_length = -1

    def _start_body(self) -> None:
        header = bytes(self._header)
        self._header.clear()
        self._header_length = -1
        _, body_length = peek_message(header)
        self._current = IpcMessage(header=header, body_length=body_length)
        self._body_missing = body_length
        if body_length == 0:
            self._finish()

    def _finish(self) -> None:
        assert self._current is not None
        self.messages.append(self._current)
        self._current = None

    def take(self) -> list[IpcMessage]:
        """Messages completed since the last call."""
        done, self.messages = self.messages, []
        return done


class IpcMessageFeed:
    """A read-only file for `pa.ipc.open_stream` that serves pushed messages without copying.

    The reader is only asked for a batch once the message it needs has been pushed, so a read
    never waits; a short read means the peer sent an inconsistent message.
    """

    closed = False

    def __init__(self) -> None:
        self._pieces: list[memoryview] = []
        self._offset = 0

    def push(self, header: memoryview, body: memoryview) -> None:
        padding = -len(header) % 8
        self._pieces.append(memoryview(CONTINUATION + _I32.pack(len(header) + padding)))
        self._pieces.append(header)
        if padding:
            self._pieces.append(memoryview(bytes(padding)))
        if len(body):
            self._pieces.append(body)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def read(self, size: int = -1) -> memoryview | bytes:
        if size < 0:
            raise ValueError("IpcMessageFeed only serves sized reads")
        if not self._pieces:
            return b""
        first = self._pieces[0]
        available = len(first) - self._offset
        if available >= size:
            chunk = first[self._offset : self._offset + size]
            self._advance(size)
            return chunk
        out = bytearray()  # spans pieces: only ever the 8-byte prefix boundary
        while size and self._pieces:
            first = self._pieces[0]
            take = min(size, len(first) - self._offset)
            out += first[self._offset : self._offset + take]
            self._advance(take)
            size -= take
        return bytes(out)

    def _advance(self, size: int) -> None:
        self._offset += size
        while self._pieces and self._offset >= len(self._pieces[0]):
            self._offset -= len(self._pieces[0])
            self._pieces.pop(0)

    @property
    def pending(self) -> int:
        """Bytes pushed but not yet read."""
        return sum(len(p) for p in self._pieces) - self._offset
