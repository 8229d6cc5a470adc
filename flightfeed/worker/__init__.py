"""The worker runtime: a Flight server that runs tasks."""

from .server import Worker

__all__ = ["Worker"]
