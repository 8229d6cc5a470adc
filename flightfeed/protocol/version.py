"""The GetWorkerInfo check: a coordinator gives plans only to flightfeed workers of its version
(and that take its token: a worker that refuses it is as unusable, CredentialsRefused).

Plans and feeds are encoded without a schema version, so a mismatched worker could decode a
plan wrongly instead of failing: refusing it up front gives one clear error instead. A port
that is something else (a plain Flight server, an HTTP server) is named as such.
"""

from __future__ import annotations

from typing import Final

from grpclib.const import Status

from .._generated.flightfeed.v1 import GetWorkerInfoResponse
from .._version import __version__
from ..errors import (
    CredentialsRefused,
    ErrorOrigin,
    FlightfeedError,
    RemoteError,
    VersionMismatch,
)
from .channel import WorkerChannel


async def check_worker_version(
    channel: WorkerChannel, url: str, expected: str = __version__
) -> str:
    """The worker's version; VersionMismatch naming the worker and both versions otherwise."""
    info = await checked_worker_info(channel, url, expected)
    version: str = info.version
    return version


async def checked_worker_info(
    channel: WorkerChannel, url: str, expected: str = __version__
) -> GetWorkerInfoResponse:
    """The worker's GetWorkerInfo, once its version is known to be `expected`."""
    origin = ErrorOrigin(worker_url=url)
    try:
        info = await channel.worker_info()
    except FlightfeedError as exc:
        raise _unusable(exc, url, origin) from None
    if info.version != expected:
        raise VersionMismatch(
            f"worker {url} runs flightfeed {info.version or '(unknown version)'}, "
            f"this coordinator runs flightfeed {expected}",
            origin=origin,
        )
    return info


REFUSED: Final = (Status.UNAUTHENTICATED, Status.PERMISSION_DENIED)
"""What a worker answers a call whose credentials it does not take."""


def refused_credentials(url: str, error: FlightfeedError, origin: ErrorOrigin) -> FlightfeedError:
    """A worker at `url` refused a call's credentials: FAILED_PRECONDITION naming it (the
    caller's own client is not at fault, a server's configuration is)."""
    status = getattr(error, "grpc_status", error.status)
    return CredentialsRefused(
        f"{url} refused this caller's credentials ({status.name}: {error.message}): give the"
        " coordinator (or the worker reading its peers) a token the worker accepts (the first"
        " token of its --auth-token-file, worker_token, or peer_token)",
        origin=origin,
    )


def _unusable(error: FlightfeedError, url: str, origin: ErrorOrigin) -> FlightfeedError:
    """What a failed GetWorkerInfo says about the peer."""
    status = getattr(error, "grpc_status", error.status)
    if status == Status.UNIMPLEMENTED:  # it speaks gRPC, but not the WorkerService
        return VersionMismatch(
            f"{url} is not a flightfeed worker: it does not serve GetWorkerInfo ({error.message})",
            origin=origin,
        )
    if status in REFUSED:  # it answered: it does not take this caller's token
        return refused_credentials(url, error, origin)
    if isinstance(error, RemoteError):  # no gRPC answer at all: down, or not gRPC
        return RemoteError(
            f"{url} did not answer GetWorkerInfo ({error.message}): is it a flightfeed worker, "
            "and is it up?",
            grpc_status=error.grpc_status,
            origin=origin,
        )
    return error.locate(origin)
