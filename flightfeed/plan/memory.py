"""Memory budget: a worker-wide pool, per-task limits, per-operator reservations.

Modelled on DataFusion's `MemoryPool` / `MemoryReservation`. Every operator that holds data
(collected join sides and join output, aggregate states, sort buffers, decoded MemoryScans,
fan-out buffers, queued work units) reserves the bytes *before* it allocates them. A task that
asks for more than its limit, or more than the worker has left, fails with ResourceExhausted
naming the operator, the bytes it asked for and the limit it hit; the other tasks keep what
they hold and keep running.

The pool is greedy (first come, first served), as DataFusion's `GreedyMemoryPool`: a worker's
operators cannot spill, so there is nothing to gain from holding memory back for later tasks.
Reservations are thread-safe, because Arrow C++ work that sizes its output (a join) runs on
worker threads.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from types import TracebackType
from typing import Self

import pyarrow as pa

from ..errors import Cancelled, InvalidArgument, ResourceExhausted

DEFAULT_MEMORY_FRACTION = 0.5
"""A worker's default memory limit: this share of the machine's (or its cgroup's) memory."""


def _format(nbytes: int) -> str:
    """Bytes as a short human figure with the exact count (error messages are read by people)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


SMALL_BATCH_BYTES = 64 * 1024
"""Batches whose buffers total at most this are sized by their buffers' whole size."""

_last_sized: tuple[weakref.ref[pa.RecordBatch | pa.Table], int] | None = None


def batch_nbytes(batch: pa.RecordBatch | pa.Table) -> int:
    """The bytes `batch` holds: exactly `batch.nbytes` above SMALL_BATCH_BYTES, at most
    SMALL_BATCH_BYTES more below it.

    pyarrow's `nbytes` measures the buffer ranges a (possibly sliced) batch references, at
    ~2 us a column: 6 us for a 3-column state row, 3% of a small query's CPU. The buffers'
    whole size costs 0.2 us; it counts a small slice at its buffers' size (never less than
    `nbytes`), so a reservation errs high by at most SMALL_BATCH_BYTES. A large batch is
    measured exactly, and remembered: it is sized twice in a row (by the metrics wrapper of
    the node that emits it, then by the node that reads it). A weak reference: the memo never
    keeps a batch alive.
    """
    size: int = batch.get_total_buffer_size()
    if size <= SMALL_BATCH_BYTES:
        return size
    global _last_sized
    last = _last_sized  # one read: threads may replace it meanwhile
    if last is not None and last[0]() is batch:
        return last[1]
    size = batch.nbytes
    _last_sized = (weakref.ref(batch), size)
    return size


class MemoryPool:
    """The memory a worker lets its tasks hold at once (`limit` None: unbounded, still counted)."""

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise InvalidArgument(f"a memory limit must be positive, got {limit}")
        self.limit = limit
        self._reserved = 0
        self._peak = 0
        self._lock = threading.Lock()

    @property
    def reserved(self) -> int:
        return self._reserved

    @property
    def peak(self) -> int:
        return self._peak

    def task(self, name: str, limit: int | None = None) -> TaskMemory:
        """The reservations of one task, at most `limit` bytes (None: the pool's limit)."""
        return TaskMemory(self, name, limit)

    def _grow(self, nbytes: int, consumer: str, task: TaskMemory) -> None:
        with self._lock:
            if task.closed:
                raise Cancelled(f"{consumer} of task {task.name}: the task has ended")
            task_after = task.reserved + nbytes
            if task.limit is not None and task_after > task.limit:
                raise ResourceExhausted(
                    f"{consumer} of task {task.name} asked for {_format(nbytes)} more; the task"
                    f" holds {_format(task.reserved)} of its memory budget of"
                    f" {_format(task.limit)}"
                )
            if self.limit is not None and self._reserved + nbytes > self.limit:
                raise ResourceExhausted(
                    f"{consumer} of task {task.name} asked for {_format(nbytes)}; the worker's"
                    f" memory limit is {_format(self.limit)}, of which"
                    f" {_format(self._reserved)} is held by running tasks"
                )
            self._reserved += nbytes
            self._peak = max(self._peak, self._reserved)
            task.reserved = task_after

    def _shrink(self, nbytes: int, task: TaskMemory) -> None:
        with self._lock:
            if task.closed:  # already returned in full by close()
                return
            self._reserved -= nbytes
            task.reserved -= nbytes

    def _close(self, task: TaskMemory) -> None:
        with self._lock:
            if not task.closed:
                self._reserved -= task.reserved
                task.reserved = 0
                task.closed = True


UNBOUNDED = MemoryPool(None)
"""The pool of tasks run without a worker (tests, one-process plans): counts, never refuses."""


class TaskMemory:
    """One task's share of a pool: hands out reservations to the task's operators."""

    def __init__(self, pool: MemoryPool, name: str, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise InvalidArgument(f"a task memory limit must be positive, got {limit}")
        self.pool = pool
        self.name = name
        self.limit = limit
        self.reserved = 0
        self.closed = False

    @classmethod
    def unbounded(cls) -> TaskMemory:
        return cls(UNBOUNDED, "(unnamed)", None)

    @property
    def effective_limit(self) -> int | None:
        """The most this task could ever hold: its own limit or the pool's, whichever is less."""
        limits = [x for x in (self.limit, self.pool.limit) if x is not None]
        return min(limits) if limits else None

    def reservation(self, consumer: str) -> MemoryReservation:
        """A reservation for one operator; free it when the operator lets its data go."""
        return MemoryReservation(self, consumer)

    def close(self) -> None:
        """Return everything the task still holds to the pool (the task ended; its operators'
        data goes with it). Later reservations of the task fail; later frees do nothing."""
        self.pool._close(self)


class MemoryReservation:
    """Bytes one operator holds. Grow before allocating; free (or leave the block) after."""

    def __init__(self, task: TaskMemory, consumer: str) -> None:
        self.task = task
        self.consumer = consumer
        self.size = 0

    def grow(self, nbytes: int) -> None:
        """Reserve `nbytes` more, or raise ResourceExhausted and reserve nothing."""
        if nbytes > 0:
            self.task.pool._grow(nbytes, self.consumer, self.task)
            self.size += nbytes

    def shrink(self, nbytes: int) -> None:
        nbytes = min(nbytes, self.size)
        if nbytes > 0:
            self.task.pool._shrink(nbytes, self.task)
            self.size -= nbytes

    def resize(self, nbytes: int) -> None:
        """Hold exactly `nbytes` (growing may raise; shrinking never does)."""
        if nbytes > self.size:
            self.grow(nbytes - self.size)
        else:
            self.shrink(self.size - nbytes)

    def free(self) -> None:
        self.shrink(self.size)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()


def machine_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when that is lower (a worker in a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


MACHINE_MEMORY_BYTES = machine_memory_bytes()
"""Read once, at import: the figure does not change while a worker runs, and reading it later
would be a blocking file read on the event loop."""


def default_memory_limit() -> int:
    return int(MACHINE_MEMORY_BYTES * DEFAULT_MEMORY_FRACTION)


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_memory_size(text: str) -> int:
    """`4GiB`, `512MiB`, `1000000` (bytes) or `25%` (of the machine's memory) as bytes."""
    value = text.strip().lower().replace(" ", "")
    percent = value.endswith("%")
    digits = value[:-1] if percent else value.rstrip("kmgtib")
    try:
        number = float(digits)
        scale = MACHINE_MEMORY_BYTES / 100 if percent else _UNITS[value[len(digits) :]]
    except (ValueError, KeyError):
        raise InvalidArgument(
            f"invalid memory size {text!r}: use bytes, KiB, MiB, GiB, TiB or a percentage"
        ) from None
    if percent and number > 100:
        raise InvalidArgument(f"a share of the machine's memory is at most 100%, got {text!r}")
    size = int(number * scale) if math.isfinite(number) else 0  # NaN and infinity are not sizes
    if size < 1:
        raise InvalidArgument(f"a memory size must be positive and finite, got {text!r}")
    return size
