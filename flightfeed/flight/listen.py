"""The socket a server listens on, bound before it serves, or a clear error saying why not.

The socket is bound here rather than by the event loop's `create_server` so that its port is
known before serving (port 0 picks a free one). A port already taken, an address this machine
does not have or a host name that does not resolve are a user's mistake, not a bug: they become
`Unavailable` (or `InvalidArgument` for a port out of range) naming the address, instead of an
`OSError` traceback. The host name is resolved off the event loop, as `getaddrinfo` blocks.
"""

from __future__ import annotations

import socket

import anyio

from ..errors import InvalidArgument, Unavailable

MAX_PORT = 65535


async def listening_socket(host: str, port: int) -> socket.socket:
    """A bound IPv4 TCP socket on `host`:`port` for `Server.start(sock=...)`."""
    where = f"{host}:{port}"
    if not 0 <= port <= MAX_PORT:
        raise InvalidArgument(f"cannot listen on {where}: a port is 0-{MAX_PORT} (0: any free one)")
    try:
        found = await anyio.getaddrinfo(
            host or None,
            port,
            family=socket.AF_INET,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except OSError as exc:  # socket.gaierror: the name does not resolve to an IPv4 address
        raise Unavailable(f"cannot listen on {where}: {exc.strerror or exc}") from None
    address = found[0][4]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


__all__ = ["MAX_PORT", "listening_socket"]
