"""HTTP/2 keepalive: find a peer that vanished without closing its connection.

A peer that is powered off, paused or cut off by a network partition sends no FIN or RST, so
every call on its connection would wait forever. When a connection with open calls has been
silent for `interval`, we send a PING; if nothing at all arrives within `timeout`, the peer is
presumed dead and the connection is dropped, so each of its calls fails at once with a message
that says why.

grpclib has keepalive settings too, but its timeout closes the transport gracefully, which
waits for the write buffer to drain; towards a frozen peer it never drains. Here the transport
is aborted instead. Any inbound bytes count as liveness, so busy connections never ping.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass

_PING_PAYLOAD = struct.Struct(">Q")


@dataclass(frozen=True)
class KeepalivePolicy:
    """When to ping a quiet connection, and how long to wait for any sign of life.

    flightfeed servers accept pings at any rate. grpc-core servers (pyarrow's, for one) count
    pings closer than 5 minutes on a connection that sends no data as abuse and end it with
    GOAWAY "too_many_pings", so towards them keep `interval` at 300 s or more.
    """

    interval: float
    """Seconds of inbound silence on a connection with open calls before a PING."""
    timeout: float = 20.0
    """Seconds to wait, after the PING, for any inbound bytes before dropping the connection."""
    permit_without_calls: bool = False
    """Ping idle connections too (only towards peers that allow it: grpc-core servers punish
    pings on connections without calls with GOAWAY)."""

    def __post_init__(self) -> None:
        if not self.interval > 0 or not self.timeout > 0:
            raise ValueError(
                f"keepalive interval and timeout must be positive, got {self.interval} "
                f"and {self.timeout}"
            )


WORKER_CLIENT_KEEPALIVE = KeepalivePolicy(interval=2.0, timeout=4.0)
"""Coordinator → worker connections: a stopped or cut-off worker fails its queries within 8 s
of its last byte (a PING after 2 to 4 s of silence, 4 s for any reply): under the 10 s the
issue asks for with room for a busy machine."""

WORKER_SERVER_KEEPALIVE = KeepalivePolicy(interval=2.0, timeout=4.0)
"""Worker → caller connections: the tasks of a stopped or cut-off coordinator are cancelled
within 8 s of its last byte."""


class KeepaliveTimer:
    """Keepalive for one connection; driven by event-loop timers, cancelled by `stop()`.

    The owner reports inbound bytes with `heard()` and tells the timer whether calls are open;
    on expiry the timer calls `expire(reason)`, which must abort the connection.
    """

    def __init__(
        self,
        policy: KeepalivePolicy,
        *,
        send_ping: Callable[[bytes], None],
        has_open_calls: Callable[[], bool],
        expire: Callable[[str], None],
    ) -> None:
        self.policy = policy
        self.pings_sent = 0
        self._send_ping = send_ping
        self._has_open_calls = has_open_calls
        self._expire = expire
        self._heard = False
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(
            policy.interval, self._tick
        )

    def heard(self) -> None:
        """Inbound bytes arrived: the peer is alive."""
        self._heard = True

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        if self._heard or not (self.policy.permit_without_calls or self._has_open_calls()):
            self._heard = False
            self._handle = self._loop.call_later(self.policy.interval, self._tick)
            return
        self._send_ping(_PING_PAYLOAD.pack(self.pings_sent))
        self.pings_sent += 1
        self._handle = self._loop.call_later(self.policy.timeout, self._check_reply)

    def _check_reply(self) -> None:
        if self._heard:
            self._heard = False
            self._handle = self._loop.call_later(self.policy.interval, self._tick)
            return
        self._handle = None
        self._expire(
            f"connection presumed dead: no reply to an HTTP/2 PING within "
            f"{self.policy.timeout:g} s after {self.policy.interval:g} s of silence"
        )
