"""flightfeed.v1.WorkerService as a grpclib service sharing the Flight server's port."""

from __future__ import annotations

import grpclib.const
from grpclib.const import Cardinality

from .._generated.flightfeed.v1 import GetWorkerInfoRequest, GetWorkerInfoResponse
from ..flight.server import rpc_boundary
from .rpc.get_worker_info import get_worker_info

SERVICE = "/flightfeed.v1.WorkerService/"


class WorkerService:
    """Routes WorkerService RPCs to their handler modules."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            SERVICE + "GetWorkerInfo": grpclib.const.Handler(
                rpc_boundary(get_worker_info),
                Cardinality.UNARY_UNARY,
                GetWorkerInfoRequest,
                GetWorkerInfoResponse,
            ),
        }
