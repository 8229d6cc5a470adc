"""GetWorkerInfo: the worker's version, so coordinators refuse mismatched workers."""

from __future__ import annotations

from ..._generated.flightfeed.v1 import GetWorkerInfoResponse
from ..._version import __version__


def get_worker_info() -> GetWorkerInfoResponse:
    return GetWorkerInfoResponse(version=__version__)
