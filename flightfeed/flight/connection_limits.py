"""What a server grants one TCP connection, and how many connections it holds at once.

A connection costs a file descriptor, and a call on it a task and buffers. Without these limits,
clients that connect and never send a byte keep their descriptors forever, and enough of them
lock every other client out (1,100 of them did under a 1,024-descriptor limit); a 240 MB header
block in CONTINUATION frames grew a worker to 1.5 GB; a request sent a byte a second held its
call for as long as the client liked. So:

- a connection must complete the HTTP/2 preface within `handshake_timeout`, and beyond
  `max_connections` new connections are closed at once, while open ones keep being served;
- a request header block may be `max_header_list_size` bytes, checked frame by frame while it
  arrives (connection_guard.py says what happens beyond);
- what a client started sending (a request message, a frame, a header block) must keep arriving
  at `min_receive_rate`, after `receive_grace`; time between messages does not count;
- a connection without calls for `idle_timeout` is closed with GOAWAY.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from typing import Final

DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
DESCRIPTORS_KEPT: Final = 64
"""Descriptors left for everything else a process opens (files, its own clients)."""
DEFAULT_MAX_HEADER_LIST_SIZE: Final = 64 * 1024
"""What h2 already advertised and its HPACK decoder enforced once a block was whole, now also
enforced while it arrives: 4 to 8 times grpc-core's own limits (8 KiB soft, 16 KiB hard), and
at most ~32 MB held in header blocks by the default 480 connections."""
DEFAULT_MIN_RECEIVE_RATE: Final = 1024
"""Bytes a second. No client on a working network sends a started message slower; a trickling
one holds its call ~`receive_grace` seconds, or must pay for longer in bytes."""
DEFAULT_RECEIVE_GRACE: Final = 10.0
"""Seconds any started message, frame or header block gets before its rate counts: room for a
TCP retransmission or two on a lossy link."""
DEFAULT_IDLE_TIMEOUT: Final = 300.0
"""Seconds a connection may go without calls: coordinators reconnect when they need to."""


def default_max_connections() -> int:
    """Half of the process's open-files limit, less what it keeps for itself (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(16, (soft - DESCRIPTORS_KEPT) // 2)


@dataclass(frozen=True)
class ConnectionLimits:
    """handshake_timeout: seconds a new connection has to send the HTTP/2 preface (None: no
    limit). max_connections: connections served at once; more are closed on arrival.
    max_header_list_size: bytes of one request header block (SETTINGS_MAX_HEADER_LIST_SIZE).
    min_receive_rate: bytes a second a started request message, frame or header block must
    keep arriving at, after `receive_grace` seconds (None: no minimum). idle_timeout: seconds
    a connection without calls is kept (None: forever)."""

    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT
    max_connections: int = field(default_factory=default_max_connections)
    max_header_list_size: int = DEFAULT_MAX_HEADER_LIST_SIZE
    min_receive_rate: float | None = DEFAULT_MIN_RECEIVE_RATE
    receive_grace: float = DEFAULT_RECEIVE_GRACE
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "min_receive_rate", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        if not self.receive_grace > 0:
            raise ValueError(f"receive_grace must be positive, got {self.receive_grace}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        if self.max_header_list_size < 1024:
            # below this not even a plain gRPC call's headers fit
            raise ValueError(
                f"max_header_list_size must be at least 1024, got {self.max_header_list_size}"
            )


class ConnectionCount:
    """The connections a server holds now, against its limit (one per server, loop-bound)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0

    def admit(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1


__all__ = ["ConnectionCount", "ConnectionLimits", "default_max_connections"]
