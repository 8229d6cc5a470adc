"""SessionBuilder: turns a request (WorkerQueryContext) into the Session its query runs in."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio.to_thread

from .context import WorkerQueryContext
from .session import Session

SessionBuilderFunction = Callable[[WorkerQueryContext], Awaitable[Session] | Session]
"""A plain (async) function works as a session builder too."""


@runtime_checkable
class SessionBuilder(Protocol):
    async def build(self, ctx: WorkerQueryContext, /) -> Session: ...


class FunctionSessionBuilder:
    """Adapts a function (async or not) to the SessionBuilder protocol. A plain function runs
    on a worker thread: it may block (read a file, call a service), and on the event loop it
    held up every other request the worker serves."""

    def __init__(self, function: SessionBuilderFunction) -> None:
        self.function = function
        call = type(function).__call__ if not inspect.isroutine(function) else function
        # (an object whose __call__ is async is as async as a coroutine function)
        self._is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)

    async def build(self, ctx: WorkerQueryContext, /) -> Session:
        if self._is_async:
            result = self.function(ctx)
        else:
            result = await anyio.to_thread.run_sync(self.function, ctx)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Session):
            raise TypeError(
                f"session builder {self.function!r} returned {type(result).__name__},"
                " expected a flightfeed Session (use ctx.builder....build())"
            )
        return result

    def __repr__(self) -> str:
        return f"FunctionSessionBuilder({self.function!r})"


def as_session_builder(builder: SessionBuilder | SessionBuilderFunction) -> SessionBuilder:
    """A SessionBuilder from either a builder object or a function."""
    if isinstance(builder, SessionBuilder):
        return builder
    if callable(builder):
        return FunctionSessionBuilder(builder)
    raise TypeError(f"not a session builder: {builder!r}")


async def default_session_builder(ctx: WorkerQueryContext) -> Session:
    """The worker's pre-populated session, unchanged."""
    return ctx.builder.build()


DEFAULT_SESSION_BUILDER: SessionBuilder = FunctionSessionBuilder(default_session_builder)
