"""Helpers for users' tests and ours: real workers on port 0, in this process's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from .worker import Worker, WorkerConfig


@asynccontextmanager
async def start_workers(
    count: int,
    *,
    session_builder: Any = None,
    config: WorkerConfig | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[list[Worker]]:
    """`count` real workers (Flight + WorkerService over loopback gRPC) on free ports."""
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                Worker(host=host, port=0, session_builder=session_builder, config=config)
            )
            for _ in range(count)
        ]
        yield workers


__all__ = ["start_workers"]
