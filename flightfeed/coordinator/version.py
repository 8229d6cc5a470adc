"""The GetWorkerInfo check: a coordinator talks only to workers of its own flightfeed version.

Plans and feeds are encoded without a schema version, so a mismatched worker could decode a
plan wrongly instead of failing: refusing it up front gives one clear error instead.
"""

from __future__ import annotations

from .._version import __version__
from ..errors import ErrorOrigin, VersionMismatch
from ..protocol import WorkerClient


async def check_worker_version(client: WorkerClient, url: str, expected: str = __version__) -> str:
    """The worker's version; VersionMismatch naming the worker and both versions otherwise."""
    info = await client.get_worker_info()
    if info.version != expected:
        raise VersionMismatch(
            f"worker {url} runs flightfeed {info.version or '(unknown version)'}, "
            f"this coordinator runs flightfeed {expected}",
            origin=ErrorOrigin(worker_url=url),
        )
    version: str = info.version
    return version
