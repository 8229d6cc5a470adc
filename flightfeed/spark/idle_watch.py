"""A read's longest wait for a batch, where a deadline on the whole call would bound the read.

A partition of a feed streams for as long as its work is discovered: hours, a batch now and
then. With the `timeout` option as the DoGet's gRPC deadline, a read that took longer than it
(60 s by default) failed with "Deadline Exceeded" while its rows kept coming. `IdleWatch`
cancels the read only when one wait for a batch lasts `timeout` seconds; the time Spark spends
on a batch before asking for the next is not counted. One thread per read, woken when a wait
begins or ends, not per batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class IdleWatch:
    """`with IdleWatch(timeout) as watch:`, then `watch.reading(reader)` for each reader and
    `with watch.waiting():` around each wait for a batch; `expired` once it cancelled one."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.expired = False
        self._reader: Cancellable | None = None
        self._since: float | None = None
        """When the wait under way began (None: not waiting)."""
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(
            target=self._watch, name="flightfeed read watch", daemon=True
        )

    def __enter__(self) -> IdleWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def reading(self, reader: Cancellable) -> None:
        """The reader a wait that lasts too long cancels."""
        with self._changed:
            self._reader = reader

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait for the next batch (or the call's first answer)."""
        with self._changed:
            self._since = time.monotonic()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._since = None

    def _watch(self) -> None:
        with self._changed:
            while not self._stopped:
                if self._since is None:
                    self._changed.wait()
                    continue
                left = self._since + self.timeout - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self.expired = True
                if self._reader is not None:
                    self._reader.cancel()
                self._since = None


__all__ = ["Cancellable", "IdleWatch"]
