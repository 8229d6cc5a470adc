"""The GetWorkerInfo check: a coordinator gives plans only to flightfeed workers of its version.

Plans and feeds are encoded without a schema version, so a mismatched worker could decode a
plan wrongly instead of failing: refusing it up front gives one clear error instead. A port
that is something else (a plain Flight server, an HTTP server) is named as such.
"""

from __future__ import annotations

from .._version import __version__
from ..errors import ErrorOrigin, FlightfeedError, RemoteError, Unimplemented, VersionMismatch
from ..protocol import WorkerChannel


async def check_worker_version(
    channel: WorkerChannel, url: str, expected: str = __version__
) -> str:
    """The worker's version; VersionMismatch naming the worker and both versions otherwise."""
    origin = ErrorOrigin(worker_url=url)
    try:
        info = await channel.worker_info()
    except (Unimplemented, VersionMismatch) as exc:
        raise VersionMismatch(
            f"{url} is not a flightfeed worker: it does not serve GetWorkerInfo ({exc.message})",
            origin=origin,
        ) from None
    except RemoteError as exc:
        raise RemoteError(
            f"{url} did not answer GetWorkerInfo ({exc.message}): is it a flightfeed worker, "
            "and is it up?",
            grpc_status=exc.grpc_status,
            origin=origin,
        ) from None
    except FlightfeedError as exc:
        raise exc.locate(origin) from None
    if info.version != expected:
        raise VersionMismatch(
            f"worker {url} runs flightfeed {info.version or '(unknown version)'}, "
            f"this coordinator runs flightfeed {expected}",
            origin=origin,
        )
    version: str = info.version
    return version
