"""GetWorkerInfo: the worker's version, so coordinators refuse mismatched workers."""

from __future__ import annotations

from typing import Any

import grpclib.server

from ..._generated.flightfeed.v1 import GetWorkerInfoResponse
from ..._version import __version__
from ...flight.server import CallContext, receive_request


async def get_worker_info(stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
    await receive_request(stream)
    await stream.send_message(GetWorkerInfoResponse(version=__version__))
