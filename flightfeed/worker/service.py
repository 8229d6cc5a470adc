"""flightfeed.v1.WorkerService as a grpclib service sharing the Flight server's port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpclib.const
import grpclib.server
from grpclib.const import Cardinality

from .._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoRequest,
    GetWorkerInfoResponse,
    WorkerToCoordinatorMsg,
)
from ..flight.grpc import RawBytes
from ..flight.server import CallContext, rpc_boundary
from .rpc.coordinator_channel import coordinator_channel
from .rpc.execute_task import execute_task
from .rpc.get_worker_info import get_worker_info

if TYPE_CHECKING:
    from .server import Worker

SERVICE = "/flightfeed.v1.WorkerService/"
WorkerRpc = Callable[["Worker", grpclib.server.Stream[Any, Any], CallContext], Awaitable[None]]


class WorkerService:
    """Routes WorkerService RPCs to their handler modules."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def _bind(self, rpc: WorkerRpc) -> Callable[[grpclib.server.Stream[Any, Any]], Awaitable[None]]:
        async def body(stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
            await rpc(self.worker, stream, ctx)

        return rpc_boundary(body)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        async def info(worker: Worker, stream: Any, ctx: CallContext) -> None:
            await get_worker_info(stream, ctx)

        return {
            SERVICE + "CoordinatorChannel": grpclib.const.Handler(
                self._bind(coordinator_channel),
                Cardinality.STREAM_STREAM,
                CoordinatorToWorkerMsg,
                WorkerToCoordinatorMsg,
            ),
            SERVICE + "ExecuteTask": grpclib.const.Handler(
                self._bind(execute_task),
                Cardinality.UNARY_STREAM,
                ExecuteTaskRequest,
                RawBytes,
            ),
            SERVICE + "GetWorkerInfo": grpclib.const.Handler(
                self._bind(info),
                Cardinality.UNARY_UNARY,
                GetWorkerInfoRequest,
                GetWorkerInfoResponse,
            ),
        }
