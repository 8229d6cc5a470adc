"""Both transports implement the one WorkerChannel, and the worker the one WorkerEndpoint:
mypy checks these assignments, and the runtime checks that the calls exist."""

from __future__ import annotations

import inspect

from flightfeed.protocol import (
    GrpcTaskChannel,
    InProcessWorkerChannel,
    TaskChannel,
    WorkerChannel,
    WorkerClient,
    WorkerEndpoint,
)
from flightfeed.protocol.inprocess import InProcessTaskChannel
from flightfeed.worker.endpoint import WorkerHandlers


def as_worker_channel(channel: WorkerClient | InProcessWorkerChannel) -> WorkerChannel:
    return channel


def as_task_channel(channel: GrpcTaskChannel | InProcessTaskChannel) -> TaskChannel:
    return channel


def as_endpoint(handlers: WorkerHandlers) -> WorkerEndpoint:
    return handlers


def test_every_implementation_has_every_call() -> None:
    for protocol, implementations in (
        (WorkerChannel, (WorkerClient, InProcessWorkerChannel)),
        (TaskChannel, (GrpcTaskChannel, InProcessTaskChannel)),
        (WorkerEndpoint, (WorkerHandlers,)),
    ):
        calls = {
            name
            for name, _ in inspect.getmembers(protocol)
            if not name.startswith("_") or name in ("__aenter__", "__aexit__")
        }
        for implementation in implementations:
            missing = {name for name in calls if not hasattr(implementation, name)}
            assert not missing, f"{implementation.__name__} lacks {sorted(missing)}"
