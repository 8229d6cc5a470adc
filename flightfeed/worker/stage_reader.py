"""How a worker's tasks read other tasks: peers over gRPC, its own tasks without the network.

A network node of a task (NetworkShuffle, NetworkBroadcast, NetworkCoalesce) opens each
producer task it reads with an ExecuteTask carrying the head it needs. A producer on another
worker is called over that worker's pooled channel (`WorkerState.peers`, one per URL for the
worker's lifetime; not version-checked: the coordinator checked every worker it placed tasks
on). A producer on this worker, the URL the coordinator placed the consumer at (the SetPlan's
target_worker_url), is called through the worker's own handlers in memory: no serialization,
no socket, the same claim and head logic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pyarrow as pa

from .._generated.flightfeed.v1 import RepartitionExecHead, TaskKey
from ..errors import ErrorOrigin, InvalidArgument, RemoteError
from ..plan.partitioning import encode_partitioning
from ..plan.stage_input import Copies, HashBuckets, OwnPartitions, ReadHead, StageInput
from ..protocol import WorkerChannel, execute_task_request
from ..protocol.inprocess import InProcessWorkerChannel
from ..protocol.version import REFUSED, refused_credentials
from .state import WorkerState


class WorkerStageReader:
    """The StageReader of one task on this worker (placed at `own_url`)."""

    def __init__(self, state: WorkerState, own_url: str) -> None:
        self._state = state
        self._own_url = own_url

    @asynccontextmanager
    async def read(
        self, source: StageInput, task_number: int, head: ReadHead, partitions: range
    ) -> AsyncIterator[AsyncIterator[pa.RecordBatch]]:
        if not source.is_placed or not 0 <= task_number < source.task_count:
            raise InvalidArgument(f"{source} has no placed task {task_number}")
        url = source.worker_urls[task_number]
        key = TaskKey(
            query_id=source.query_id,
            stage_id=source.stage_id,
            task_number=task_number,
            attempt=source.attempt,
        )
        if isinstance(head, HashBuckets):
            request = execute_task_request(
                key,
                partitions.start,
                partitions.stop,
                head=RepartitionExecHead(partitioning=encode_partitioning(head.partitioning)),
            )
        elif isinstance(head, Copies):
            request = execute_task_request(
                key, partitions.start, partitions.stop, head="broadcast", outputs=head.outputs
            )
        else:
            assert isinstance(head, OwnPartitions)
            request = execute_task_request(key, partitions.start, partitions.stop)
        channel = await self._channel(url)
        try:
            async with channel.execute_task(request) as batches:
                yield aiter(batches)
        except RemoteError as exc:  # (the peer's own answer: it names no place)
            if exc.grpc_status not in REFUSED:
                raise
            raise refused_credentials(url, exc, ErrorOrigin(worker_url=url)) from None

    async def _channel(self, url: str) -> WorkerChannel:
        endpoint = self._state.endpoint
        if url == self._own_url and endpoint is not None:
            return InProcessWorkerChannel(url, endpoint=endpoint)
        allowed = self._state.config.peers
        if allowed is not None and url not in allowed:
            raise InvalidArgument(
                f"the plan reads a task on {url!r}, not one of this worker's peers"
                " (WorkerConfig.peers, flightfeed worker --peer)"
            )
        return await self._state.peers.channel(url)
