"""The session a plan runs in on this worker: the builder's, from the request's headers, held
to the worker's memory pool and reading Parquet files only under the worker's roots. Tasks
(CoordinatorChannel) and plans pushed down to the tables (ExecutePhysicalPlan) get theirs here.
"""

from __future__ import annotations

from dataclasses import replace

import anyio

from .._generated.flightfeed.v1 import TaskKey
from ..concurrency import cancelled_for_real
from ..errors import ErrorOrigin, ExecutionError, as_flightfeed_error
from ..flight.auth import AUTHORIZATION
from ..plan.nodes import ParquetScan, ParquetScanCodec
from ..protocol.channel import Headers
from ..session import Headers as SessionHeaders
from ..session import Session, WorkerQueryContext
from .state import WorkerState

SESSION_BUILDER = "session builder"


async def build_session(
    state: WorkerState, headers: Headers, task_key: TaskKey | None, origin: ErrorOrigin
) -> Session:
    """The builder's session for the request; its failure names the builder and keeps the
    original exception's class."""
    if AUTHORIZATION in headers:  # (checked by the server already: a builder that logs
        headers = SessionHeaders(  # its headers would log the caller's token)
            (name, value) for name, value in _pairs(headers) if name != AUTHORIZATION
        )
    elif not isinstance(headers, SessionHeaders):  # (over gRPC it is one: repeats kept)
        headers = SessionHeaders(headers.items())
    context = WorkerQueryContext(headers=headers, task_key=task_key)
    try:
        session = await state.session_builder.build(context)
    except anyio.get_cancelled_exc_class() as exc:
        if cancelled_for_real():
            raise
        # (its own: the request waited for a plan that never came, then was NOT_FOUND)
        raise _failed(f"raised {type(exc).__name__} itself", origin) from None
    except SystemExit as exc:  # (it ended the worker)
        raise _failed(f"called exit({exc.code!r})", origin) from None
    except Exception as exc:
        raise as_flightfeed_error(exc, SESSION_BUILDER).locate(origin) from exc
    return _with_parquet_roots(_within_pool(session, state), state.parquet_codec)


def _failed(what: str, origin: ErrorOrigin) -> ExecutionError:
    return ExecutionError(f"{SESSION_BUILDER} failed: it {what}", origin=origin)


def _pairs(headers: Headers) -> list[tuple[str, str]]:
    """Every (name, value), repeats included when `headers` keeps them."""
    if isinstance(headers, SessionHeaders):
        return list(headers.pairs())
    return [(name.lower(), value) for name, value in headers.items()]


def _with_parquet_roots(session: Session, codec: ParquetScanCodec) -> Session:
    """The session decoding ParquetScans of files under the worker's roots (none without
    --parquet-root: a clear refusal), unless its builder chose a ParquetScan codec itself."""
    if ParquetScan.name in session.codecs.kinds:
        return session
    return replace(session, codecs=session.codecs.with_codec(codec))


def _within_pool(session: Session, state: WorkerState) -> Session:
    """The session with a memory budget no larger than the worker's pool: the budget is what
    the plan's embedded data and size-checked functions are measured against."""
    pool = state.memory.limit
    budget = session.memory_budget_bytes
    if pool is None or (budget is not None and budget <= pool):
        return session
    return replace(session, memory_budget_bytes=pool)


__all__ = ["SESSION_BUILDER", "build_session"]
