"""What a server grants one TCP connection before it has proven to be an HTTP/2 client, and
how many connections it holds at once.

A connection costs a file descriptor. Without these limits, clients that connect and never send
a byte keep their descriptors forever, and enough of them lock every other client out (1,100 of
them did under a 1,024-descriptor limit). So a connection must complete the HTTP/2 preface
within `handshake_timeout`, and beyond `max_connections` new connections are closed at once,
while the ones already open keep being served.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from typing import Final

DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
DESCRIPTORS_KEPT: Final = 64
"""Descriptors left for everything else a process opens (files, its own clients)."""


def default_max_connections() -> int:
    """Half of the process's open-files limit, less what it keeps for itself (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(16, (soft - DESCRIPTORS_KEPT) // 2)


@dataclass(frozen=True)
class ConnectionLimits:
    """handshake_timeout: seconds a new connection has to send the HTTP/2 preface (None: no
    limit). max_connections: connections served at once; more are closed on arrival."""

    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT
    max_connections: int = field(default_factory=default_max_connections)

    def __post_init__(self) -> None:
        if self.handshake_timeout is not None and self.handshake_timeout <= 0:
            raise ValueError(
                f"handshake_timeout must be positive or None, got {self.handshake_timeout}"
            )
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")


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
