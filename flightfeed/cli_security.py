"""The command line's TLS and token flags, as configuration: `--tls-cert`, `--tls-key`,
`--tls-ca` and `--auth-token-file`, shared by `flightfeed worker`, `flightfeed coordinator`
(which serve with them and call their peers or workers with them) and `flightfeed tables` (a
client); `--peer-tls-ca`, of the worker and the coordinator, trusts their peers' CA without
asking their own clients for certificates.
"""

from __future__ import annotations

import argparse

from .errors import InvalidArgument
from .flight.auth import BearerTokens, read_tokens
from .flight.tls import ClientTls, ServerTls


def auth(args: argparse.Namespace) -> BearerTokens | None:
    """--auth-token-file: the tokens a call may carry (one per line)."""
    return BearerTokens(read_tokens(args.auth_token_file)) if args.auth_token_file else None


def own_token(args: argparse.Namespace) -> str | None:
    """The token this process sends the servers it calls: the file's first."""
    tokens = read_tokens(args.auth_token_file) if args.auth_token_file else []
    return tokens[0] if tokens else None


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    """--tls-cert and --tls-key serve over TLS; --tls-ca then requires client certificates it
    signed (mutual TLS)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    if args.tls_cert is None:
        if args.tls_ca is not None:
            raise InvalidArgument(
                "--tls-ca needs --tls-cert and --tls-key (it asks clients for certificates); to"
                " trust the CA of grpc+tls:// peers only, give it as --peer-tls-ca"
            )
        return None
    return ServerTls(args.tls_cert, args.tls_key, args.tls_ca)


def peer_tls(args: argparse.Namespace) -> ClientTls | None:
    """How a worker or a coordinator reaches grpc+tls:// peers: --peer-tls-ca (else --tls-ca)
    as their root CA, and its own --tls-cert/--tls-key as its client certificate."""
    ca = args.peer_tls_ca or args.tls_ca
    if ca is None and args.tls_cert is None:
        return None
    tls = ClientTls(ca, args.tls_cert, args.tls_key)
    tls.context()  # the files, read and checked before anything starts (else: every peer call)
    return tls


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """How this process reaches grpc+tls:// servers: --tls-ca as their root CA, and its own
    --tls-cert/--tls-key as its client certificate."""
    if args.tls_ca is None and args.tls_cert is None:
        return None
    return ClientTls(args.tls_ca, args.tls_cert, args.tls_key)


__all__ = ["auth", "client_tls", "own_token", "peer_tls", "server_tls"]
