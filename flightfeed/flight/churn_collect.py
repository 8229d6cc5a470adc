"""A full garbage collection every so many closed connections, while connections churn.

A closed server connection is a reference cycle (h2's connection keeps a table of its own bound
methods, asyncio's transport and grpclib's protocol point at each other): about a hundred
objects that only the cyclic collector frees. Under the raised thresholds of tuning.py a
connection that lived through a young pass dies in an older generation and waits for a full
pass, which a load made only of connections (many short clients, a port scanner, a fuzzer)
seldom triggers. The pile grows to thousands of dead connections; freeing it later at the
idle release cannot shrink the process, because a few survivors pin each pymalloc arena the
pile spread over. With the pile bounded, the peak stays small: 10,000 fuzzed calls on 50
connections at a time left a worker 10% larger without this, 2% with it.

Long-lived connections (flightfeed's own pools) never reach the threshold; a collection costs
milliseconds, once per `every` connections, so a churning server pays microseconds a connection.
"""

from __future__ import annotations

import gc
from typing import Final

DEFAULT_EVERY: Final = 256
"""Closed connections between collections: a pile of ~256 dead connections is a few MB."""


class ChurnCollector:
    """Counts closed connections and collects all generations every `every` of them (one per
    server, loop-bound). Leaves a process whose collector is disabled alone."""

    def __init__(self, every: int = DEFAULT_EVERY) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.every = every
        self.closed = 0
        self.collections = 0

    def connection_closed(self) -> None:
        self.closed += 1
        if self.closed % self.every == 0 and gc.isenabled():
            self.collections += 1
            gc.collect()


__all__ = ["DEFAULT_EVERY", "ChurnCollector"]
