"""Connecting to a worker by its location: gRPC for `grpc://host:port`, memory for
`inproc://name` (a worker of this process)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InvalidArgument
from ..flight.client import parse_location
from ..flight.keepalive import KeepalivePolicy
from ..flight.tls import ClientTls
from .channel import WorkerChannel
from .inprocess import SCHEME as INPROC_SCHEME
from .inprocess import InProcessWorkerChannel
from .worker_client import WorkerClient


def check_worker_url(url: str) -> None:
    """InvalidArgument unless `url` is a worker location flightfeed can connect to."""
    if not isinstance(url, str):
        raise InvalidArgument(f"a worker location is a string, got {type(url).__name__}")
    if url.startswith(INPROC_SCHEME):
        if len(url) == len(INPROC_SCHEME):
            raise InvalidArgument(f"in-process worker location {url!r} has no name")
        return
    parse_location(url)


def connect_worker(
    url: str,
    *,
    metadata: Mapping[str, str | bytes] | None = None,
    keepalive: KeepalivePolicy | None = None,
    tls: ClientTls | None = None,
) -> WorkerChannel:
    """A channel to the worker at `url` (nothing is sent until the first call); a
    `grpc+tls://` worker is reached over TLS with `tls`'s root CA and client certificate."""
    check_worker_url(url)
    if url.startswith(INPROC_SCHEME):
        return InProcessWorkerChannel(url, metadata=metadata)
    return WorkerClient(url, metadata=metadata, keepalive=keepalive, tls=tls)
