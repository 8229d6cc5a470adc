"""The socket a server listens on, bound before it serves, or a clear error saying why not.

The socket is bound here rather than by the event loop's `create_server` so that its port is
known before serving (port 0 picks a free one). A port already taken, an address this machine
does not have or a host name that does not resolve are a user's mistake, not a bug: they become
`Unavailable` (or `InvalidArgument` for a port out of range) naming the address, instead of an
`OSError` traceback. The host name is resolved off the event loop, as `getaddrinfo` blocks.

An IPv4 address is preferred when the host has one, so a name such as `localhost` listens where
the clients of its location have always found it; an IPv6 address (`::1`, or `::` for every
interface) is used when the host has no other.
"""

from __future__ import annotations

import contextlib
import socket

import anyio

from ..errors import InvalidArgument, Unavailable

MAX_PORT = 65535


async def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket on `host`:`port` for `Server.start(sock=...)` ("" is every IPv4
    interface, as "0.0.0.0")."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not 0 <= port <= MAX_PORT:
        raise InvalidArgument(f"cannot listen on {where}: a port is 0-{MAX_PORT} (0: any free one)")
    try:
        found = await anyio.getaddrinfo(
            host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:  # socket.gaierror: the name does not resolve
        raise Unavailable(f"cannot listen on {where}: {exc.strerror or exc}") from None
    ipv4 = [entry for entry in found if entry[0] == socket.AF_INET]
    family, _, _, _, address = (ipv4 or found)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and address[0] == "::":
            _dual_stack(sock)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


def _dual_stack(sock: socket.socket) -> None:
    """Every interface means IPv4 ones too, whatever the system's default (Linux's
    net.ipv6.bindv6only, which some systems set to 1). Where the system refuses, IPv6 alone is
    served (`local_address` then says ::1)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


def local_address(sock: socket.socket) -> str:
    """The loopback address a client on this machine reaches a socket bound to every
    interface through: 127.0.0.1 where it takes IPv4, ::1 where it is IPv6 alone."""
    if sock.family != socket.AF_INET6:
        return "127.0.0.1"
    if sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
        return "::1"
    return "127.0.0.1"


__all__ = ["MAX_PORT", "listening_socket", "local_address"]
