"""flightfeed: an asyncio Arrow Flight framework for distributed query execution over work
discovered at runtime. The public API is what `__all__` lists; everything else is internal."""

from . import _allocator  # noqa: F401  (first: configures Arrow's allocator before pyarrow loads)
from ._version import __version__
from .coordinator import (
    Coordinator,
    StaticWorkerResolver,
    TaskEstimation,
    TaskEstimator,
    WorkerResolver,
)
from .errors import (
    Cancelled,
    DataError,
    ErrorOrigin,
    ExecutionError,
    FeedError,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    PlanDecodeError,
    RemoteError,
    ResourceExhausted,
    Unimplemented,
    UnknownUdfError,
    VersionMismatch,
)
from .feeds import FeedRegistry, WorkUnitFeed, WorkUnitFeedProvider
from .flight import (
    CallContext,
    ConnectionLimits,
    FlightClient,
    FlightDataReader,
    FlightDataWriter,
    FlightHandler,
    FlightServer,
    KeepalivePolicy,
)
from .plan import ExecutionPlan, PlanCodec, TaskContext
from .protocol import WorkerClient
from .session import Session, SessionBuilder, SessionStateBuilder, WorkerQueryContext
from .worker import Worker, WorkerConfig

__all__ = [
    "CallContext",
    "Cancelled",
    "Coordinator",
    "ErrorOrigin",
    "DataError",
    "ExecutionError",
    "ExecutionPlan",
    "FeedError",
    "FeedRegistry",
    "FlightClient",
    "FlightDataReader",
    "FlightDataWriter",
    "FlightHandler",
    "FlightServer",
    "FlightfeedError",
    "InvalidArgument",
    "ConnectionLimits",
    "KeepalivePolicy",
    "NotFound",
    "PlanCodec",
    "PlanDecodeError",
    "RemoteError",
    "ResourceExhausted",
    "Session",
    "StaticWorkerResolver",
    "SessionBuilder",
    "SessionStateBuilder",
    "TaskContext",
    "TaskEstimation",
    "TaskEstimator",
    "Unimplemented",
    "UnknownUdfError",
    "VersionMismatch",
    "WorkUnitFeed",
    "WorkUnitFeedProvider",
    "Worker",
    "WorkerClient",
    "WorkerConfig",
    "WorkerQueryContext",
    "WorkerResolver",
    "__version__",
]
