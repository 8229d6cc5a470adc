"""Talking to workers: the WorkerService client used by coordinators and tests."""

from .worker_client import TaskChannel, WorkerClient

__all__ = ["TaskChannel", "WorkerClient"]
