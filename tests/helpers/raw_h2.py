"""A bare HTTP/2 gRPC client for hostile-input tests: it sends whatever bytes a test asks for
(a gRPC prefix that lies, a body that never ends, a header block in CONTINUATION frames, a
request a byte at a time) and reports every answer the server gives: the gRPC status from
headers or trailers, a stream reset, the GOAWAY that ends the connection. grpclib's own client
cannot serve here: it would refuse to send such bytes, and it loses a trailers-only status that
is followed at once by a reset, which is how a server rightly answers a request it stops
reading."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

import anyio
import h2.config
import h2.connection
import h2.events
from anyio.abc import SocketStream
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame

GRPC_PREFIX = struct.Struct(">BI")


def grpc_message(payload: bytes, declared: int | None = None) -> bytes:
    """A gRPC length-prefixed message; `declared` overrides the length it claims."""
    return GRPC_PREFIX.pack(0, len(payload) if declared is None else declared) + payload


def headers_frame(stream_id: int, fragment: bytes, *, end_headers: bool = False) -> bytes:
    """A HEADERS frame by hand: its block continues in CONTINUATION frames unless it ends."""
    frame = HeadersFrame(stream_id, fragment)
    if end_headers:
        frame.flags.add("END_HEADERS")
    return bytes(frame.serialize())


def continuation_frame(stream_id: int, fragment: bytes, *, end_headers: bool = False) -> bytes:
    frame = ContinuationFrame(stream_id, fragment)
    if end_headers:
        frame.flags.add("END_HEADERS")
    return bytes(frame.serialize())


def data_frame(stream_id: int, payload: bytes, *, end_stream: bool = False) -> bytes:
    frame = DataFrame(stream_id, payload)
    if end_stream:
        frame.flags.add("END_STREAM")
    return bytes(frame.serialize())


@dataclass
class CallAnswer:
    """What the server said about one call."""

    status: int | None = None
    message: str = ""
    reset_code: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""


class RawH2Client:
    """One HTTP/2 connection; `call` runs one request on it at a time."""

    def __init__(self, socket: SocketStream, authority: str) -> None:
        self.socket = socket
        self.authority = authority
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )

    @classmethod
    async def connect(cls, host: str, port: int) -> RawH2Client:
        client = cls(await anyio.connect_tcp(host, port), f"{host}:{port}")
        client.h2.initiate_connection()
        await client.flush()
        return client

    async def aclose(self) -> None:
        await self.socket.aclose()

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.socket.send(data)

    async def settle(self) -> None:
        """Wait for the server's SETTINGS and acknowledge them, so its frame size applies."""
        with anyio.fail_after(10):
            while not any(
                isinstance(event, h2.events.RemoteSettingsChanged)
                for event in self.h2.receive_data(await self.socket.receive())
            ):
                pass
        await self.flush()

    def request_headers(self, path: str) -> list[tuple[str, str]]:
        return [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]

    def header_block(self, path: str, extra: Iterable[tuple[str, str]] = ()) -> tuple[int, bytes]:
        """A new stream's id and its request headers HPACK-encoded, for frames built by hand
        (the encoder's state moves on as if they were sent)."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.highest_outbound_stream_id = stream_id  # h2 would on send_headers
        return stream_id, self.h2.encoder.encode([*self.request_headers(path), *extra])

    async def send_raw(self, data: bytes) -> bool:
        """Send bytes as they are; False if the server closed the connection first."""
        try:
            await self.socket.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            return False
        return True

    async def goaway(self) -> h2.events.ConnectionTerminated | None:
        """Read until the server ends the connection: its GOAWAY, or None if it closed the
        connection without one. Nothing is sent meanwhile (no ACK may split a header block that
        a test sends by hand)."""
        while True:
            try:
                received = await self.socket.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                return None
            for event in self.h2.receive_data(received):
                if isinstance(event, h2.events.ConnectionTerminated):
                    return event

    async def paced_call(
        self, path: str, pieces: Sequence[tuple[float, bytes]], *, end: bool = True
    ) -> CallAnswer:
        """A call whose request body goes out as `pieces`, one DATA frame each, each after
        waiting its delay (a slow client); returns once the server has ended or reset the
        stream or closed the connection, even if pieces are left."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, self.request_headers(path))
        await self.flush()
        answer = CallAnswer()
        over = anyio.Event()

        async def read() -> None:
            try:
                while not over.is_set():
                    received = await self.socket.receive()
                    for event in self.h2.receive_data(received):
                        if self._handle(event, stream_id, answer):
                            over.set()
                    await self.flush()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                over.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            for index, (delay, piece) in enumerate(pieces):
                with anyio.move_on_after(delay):
                    await over.wait()
                if over.is_set():
                    break
                last = end and index == len(pieces) - 1
                self.h2.send_data(stream_id, piece, end_stream=last)
                await self.flush()
            await over.wait()
            tasks.cancel_scope.cancel()
        return answer

    async def call(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        end: bool = True,
        headers: Iterable[tuple[str, str]] = (),
    ) -> CallAnswer:
        """Send `chunks` as the request body of a POST to `path` (ending it if `end`), with
        `headers` besides the required ones, reading
        the server's answer meanwhile; returns once the server has ended or reset the stream
        (or the connection closed)."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, [*self.request_headers(path), *headers])
        await self.flush()
        answer = CallAnswer()
        pending = [memoryview(chunk) for chunk in chunks]
        done = False
        while not done:
            while pending and not done:
                window = min(
                    self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
                )
                if window <= 0:
                    break
                piece = pending[0][:window]
                pending[0] = pending[0][len(piece) :]
                if not pending[0]:
                    pending.pop(0)
                self.h2.send_data(stream_id, bytes(piece), end_stream=end and not pending)
                await self.flush()
            try:
                received = await self.socket.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                return answer
            for event in self.h2.receive_data(received):
                done = self._handle(event, stream_id, answer) or done
            await self.flush()
        return answer

    def _handle(self, event: h2.events.Event, stream_id: int, answer: CallAnswer) -> bool:
        headers = h2.events.ResponseReceived | h2.events.TrailersReceived
        if isinstance(event, headers) and event.stream_id == stream_id:
            for name, value in event.headers:
                answer.headers[str(name)] = str(value)
            if "grpc-status" in answer.headers:
                answer.status = int(answer.headers["grpc-status"])
                answer.message = unquote(answer.headers.get("grpc-message", ""))
            return bool(event.stream_ended)
        if isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
            answer.data += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
            return bool(event.stream_ended)
        if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
            return True
        if isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
            answer.reset_code = int(event.error_code)
            return True
        return isinstance(event, h2.events.ConnectionTerminated)
