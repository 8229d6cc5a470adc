"""The worker runtime: a Flight server that runs tasks."""

from .config import WorkerConfig
from .server import Worker

__all__ = ["Worker", "WorkerConfig"]
