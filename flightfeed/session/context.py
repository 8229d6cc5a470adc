"""WorkerQueryContext: what a session builder gets for each request."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._generated.flightfeed.v1 import TaskKey
from .headers import Headers
from .state_builder import SessionStateBuilder


@dataclass(frozen=True)
class WorkerQueryContext:
    """The request's headers (auth, per-query configuration), the task it is for (None when
    the request is not tied to one task), and a builder pre-populated by the worker."""

    headers: Headers = field(default_factory=Headers)
    builder: SessionStateBuilder = field(default_factory=SessionStateBuilder)
    task_key: TaskKey | None = None
