"""The session layer: per-request sessions (UDFs, configuration, memory budget, codecs)."""

from __future__ import annotations

from ..plan.functions import AggregateUdf, ScalarUdf
from .builder import (
    DEFAULT_SESSION_BUILDER,
    FunctionSessionBuilder,
    SessionBuilder,
    SessionBuilderFunction,
    as_session_builder,
    default_session_builder,
)
from .context import WorkerQueryContext
from .headers import Headers
from .loader import load_session_builder
from .session import Session
from .state_builder import SessionStateBuilder

__all__ = [
    "DEFAULT_SESSION_BUILDER",
    "AggregateUdf",
    "FunctionSessionBuilder",
    "Headers",
    "ScalarUdf",
    "Session",
    "SessionBuilder",
    "SessionBuilderFunction",
    "SessionStateBuilder",
    "WorkerQueryContext",
    "as_session_builder",
    "default_session_builder",
    "load_session_builder",
]
