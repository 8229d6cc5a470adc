"""Talking to workers: the transport-neutral WorkerChannel, its gRPC and in-process
implementations, typed errors on the wire, task keys and tickets, and the protocol's messages.

The messages are betterproto2 classes generated from `protos/flightfeed/v1/worker.proto`;
they are exported here so users never import `flightfeed._generated`.
"""

from .._generated.flightfeed.v1 import (
    BroadcastExecHead,
    CancelTask,
    CoordinatorToWorkerMsg,
    ErrorCode,
    ErrorDetail,
    ExecuteTaskRequest,
    FeedCredits,
    FeedPartitionEnd,
    FeedPartitionError,
    FlightAppMetadata,
    GetWorkerInfoRequest,
    GetWorkerInfoResponse,
    Metric,
    MetricsSet,
    NoneHead,
    PartitionsRead,
    PercentileLatency,
    RepartitionExecHead,
    SetPlanRequest,
    SetPlanRequestWorkUnitFeedDeclaration,
    StreamRange,
    TableArgument,
    TableCommand,
    TableQuery,
    TaskKey,
    TaskMetrics,
    WorkerToCoordinatorMsg,
    WorkUnit,
    WorkUnitBatch,
    WorkUnitFeedProto,
)
from ..flight.keepalive import WORKER_CLIENT_KEEPALIVE, KeepalivePolicy
from .channel import (
    ChannelClosed,
    PartitionSink,
    TaskChannel,
    WorkerChannel,
    WorkerEndpoint,
)
from .connect import check_worker_url, connect_worker
from .errors import ERROR_TRAILER, TYPED_ERRORS, TypedErrors, from_detail, to_detail
from .inprocess import SCHEME as INPROC_SCHEME
from .inprocess import InProcessWorkerChannel
from .keys import TaskId, task_id
from .tickets import execute_task_request, execute_task_ticket, parse_ticket
from .worker_client import GrpcTaskChannel, WorkerClient

__all__ = [
    "ChannelClosed",
    "ERROR_TRAILER",
    "INPROC_SCHEME",
    "TYPED_ERRORS",
    "WORKER_CLIENT_KEEPALIVE",
    "BroadcastExecHead",
    "CancelTask",
    "CoordinatorToWorkerMsg",
    "ErrorCode",
    "ErrorDetail",
    "ExecuteTaskRequest",
    "FeedCredits",
    "FeedPartitionEnd",
    "FeedPartitionError",
    "FlightAppMetadata",
    "GetWorkerInfoRequest",
    "GetWorkerInfoResponse",
    "Metric",
    "MetricsSet",
    "GrpcTaskChannel",
    "InProcessWorkerChannel",
    "KeepalivePolicy",
    "NoneHead",
    "PartitionSink",
    "PartitionsRead",
    "PercentileLatency",
    "RepartitionExecHead",
    "SetPlanRequest",
    "SetPlanRequestWorkUnitFeedDeclaration",
    "StreamRange",
    "TableArgument",
    "TableCommand",
    "TableQuery",
    "TaskChannel",
    "TaskId",
    "TaskKey",
    "TaskMetrics",
    "TypedErrors",
    "WorkUnit",
    "WorkUnitBatch",
    "WorkUnitFeedProto",
    "WorkerChannel",
    "WorkerClient",
    "WorkerEndpoint",
    "WorkerToCoordinatorMsg",
    "check_worker_url",
    "connect_worker",
    "execute_task_request",
    "execute_task_ticket",
    "from_detail",
    "parse_ticket",
    "task_id",
    "to_detail",
]
