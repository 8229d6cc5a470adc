"""Real workers for tests: on free ports (or in-process), and a Coordinator over them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from ..coordinator import Coordinator, InProcessWorkerResolver
from ..worker import Worker, WorkerConfig


@asynccontextmanager
async def start_workers(
    count: int,
    *,
    session_builder: Any = None,
    config: WorkerConfig | None = None,
    host: str = "127.0.0.1",
    in_process: bool = False,
) -> AsyncIterator[list[Worker]]:
    """`count` real workers: over loopback gRPC on free ports, or with `in_process=True`
    reachable only from this process (inproc:// locations, memory instead of sockets; the same
    HTTP/2 and gRPC code runs, for tests about logic rather than transport)."""
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                Worker(
                    host=host,
                    port=0,
                    session_builder=session_builder,
                    config=config,
                    in_process=in_process,
                )
            )
            for _ in range(count)
        ]
        yield workers


@asynccontextmanager
async def start_cluster(
    count: int,
    *,
    session_builder: Any = None,
    config: WorkerConfig | None = None,
    host: str = "127.0.0.1",
    in_process: bool = False,
    **coordinator_options: Any,
) -> AsyncIterator[tuple[Coordinator, list[Worker]]]:
    """`count` workers (see start_workers) and a Coordinator over them (options go to it)."""
    async with start_workers(
        count, session_builder=session_builder, config=config, host=host, in_process=in_process
    ) as workers:
        resolver = InProcessWorkerResolver(workers)
        async with Coordinator(resolver, **coordinator_options) as coordinator:
            yield coordinator, workers


async def wait_for_no_tasks(workers: list[Worker]) -> None:
    """Until no worker holds any task state (woken by each registry change, never polled)."""
    for worker in workers:
        while len(worker.registry):
            await worker.registry.changed()
