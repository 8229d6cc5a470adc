"""TLS and mutual TLS for flightfeed's gRPC servers and clients (`grpc+tls://` locations).

A server presents its certificate chain; given a client CA it also requires every client to
present a certificate that CA signed (mutual TLS). A client checks the server against a root
CA (the system's when none is given) and presents its own certificate when it has one. Both
sides speak HTTP/2 only (ALPN "h2"), as gRPC requires; TLS 1.2 is the oldest accepted.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from ..errors import InvalidArgument

TLS_SCHEME: Final = "grpc+tls"
_ALPN: Final = ["h2"]


@dataclass(frozen=True)
class ServerTls:
    """`cert_chain` and `private_key` (PEM files); `client_ca`: require client certificates
    signed by it (mutual TLS), or None to accept any client."""

    cert_chain: str
    private_key: str
    client_ca: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server context, made once per configuration (reading the files blocks)."""
        return _server_context(self)


@dataclass(frozen=True)
class ClientTls:
    """`root_ca`: the CA that signed the servers' certificates (None: the system's roots);
    `cert_chain` and `private_key`: this client's certificate, for servers that require one;
    `server_name`: the name to check the server's certificate against (default: its host)."""

    root_ca: str | None = None
    cert_chain: str | None = None
    private_key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_chain is None) != (self.private_key is None):
            raise InvalidArgument("a client certificate needs its private key, and the other way")

    def context(self) -> ssl.SSLContext:
        """The client context, made once per configuration (reading the files blocks)."""
        return _client_context(self)


@lru_cache(maxsize=64)
def _server_context(tls: ServerTls) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_chain, tls.private_key, password=_no_passphrase)
        if tls.client_ca is not None:
            context.load_verify_locations(cafile=tls.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except _Encrypted:
        raise _encrypted(tls.private_key or tls.cert_chain) from None
    except (ssl.SSLError, OSError) as exc:
        files = _files(cert=tls.cert_chain, key=tls.private_key, ca=tls.client_ca)
        raise InvalidArgument(f"cannot use the server's TLS files ({files}): {exc}") from exc
    context.set_alpn_protocols(_ALPN)
    return context


def _files(**paths: str | None) -> str:
    """Which file is which, and which of them is missing: ssl names none of them."""
    return ", ".join(
        f"{role} {path!r}{'' if os.path.exists(path) else ' missing'}"
        for role, path in paths.items()
        if path is not None
    )


@lru_cache(maxsize=64)
def _client_context(tls: ClientTls) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.root_ca)
        if tls.cert_chain is not None:
            context.load_cert_chain(tls.cert_chain, tls.private_key, password=_no_passphrase)
    except _Encrypted:
        raise _encrypted(tls.private_key or tls.cert_chain or "") from None
    except (ssl.SSLError, OSError) as exc:
        files = _files(ca=tls.root_ca, cert=tls.cert_chain, key=tls.private_key)
        raise InvalidArgument(f"cannot use the client's TLS files ({files}): {exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(_ALPN)
    return context


def is_tls_location(location: str) -> bool:
    return location.startswith(f"{TLS_SCHEME}://")


__all__ = ["TLS_SCHEME", "ClientTls", "ServerTls", "is_tls_location"]


class _Encrypted(Exception):
    """The private key asks for a passphrase."""


def _no_passphrase() -> str:
    """What OpenSSL calls for an encrypted key's passphrase: without it, OpenSSL prompts on the
    terminal (and a server without one failed with 'Invalid argument')."""
    raise _Encrypted


def _encrypted(key: str) -> InvalidArgument:
    return InvalidArgument(
        f"the TLS private key {key!r} is encrypted (it asks for a passphrase): give the key"
        " unencrypted, readable only by the server's user (openssl pkey -in KEY -out PLAIN)"
    )
