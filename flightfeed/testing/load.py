"""A load run: many small feed queries through a Coordinator, and what that leaves behind.

`sequential(c, n)` runs n small feed queries one after another; `burst(c, n)` runs n at once,
each holding its feed open until all n have started (a StartBarrier), so every one of them is
in flight at the same moment. `snapshot` records what the coordinator and its workers hold
(worker tasks, ExecuteTasks waiting for a plan, event-loop tasks, open files, resident
memory); comparing snapshots before and after shows whether anything leaked. Used by
benchmarks/load_test.py and by the suite's short run.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from ..coordinator import Coordinator
from ..plan import Coalesce, ExecutionPlan
from .feeds import COUNT_AT_END, StartBarrier, UnitProvider, unit_scan

PARTITIONS = 2
UNITS = 5
BODY = b"load-unit-0123456789"


def small_query(barrier: StartBarrier | None = None) -> ExecutionPlan:
    """A one-task feed query: PARTITIONS partitions of UNITS units, counted on the worker."""
    provider = UnitProvider([UNITS] * PARTITIONS, body=BODY, barrier=barrier)
    return Coalesce(unit_scan(provider, every=COUNT_AT_END))


async def _run(c: Coordinator, barrier: StartBarrier | None = None) -> None:
    table = await c.collect(small_query(barrier))
    units = sum(table.column("units").to_pylist())
    if units != PARTITIONS * UNITS:
        raise AssertionError(f"a load query read {units} units, not {PARTITIONS * UNITS}")


async def sequential(c: Coordinator, count: int) -> None:
    """`count` small queries, one after another."""
    for _ in range(count):
        await _run(c)


async def burst(c: Coordinator, count: int) -> None:
    """`count` small queries at once, none of which ends before all have started (the
    coordinator must admit `count` queries at once, and its workers take their tasks)."""
    barrier = StartBarrier(count)
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(_run, c, barrier)


@dataclass(frozen=True)
class WorkerSnapshot:
    url: str
    tasks: int
    plan_waiters: int
    event_loop_tasks: int
    open_files: int
    resident_bytes: int


@dataclass(frozen=True)
class Snapshot:
    """What the coordinator's process and each worker hold at one moment."""

    workers: list[WorkerSnapshot]
    event_loop_tasks: int
    open_files: int
    resident_bytes: int
    running_queries: int
    queued_queries: int
    connections: dict[str, int] = field(default_factory=dict)
    """Open connections per worker (the coordinator's pool)."""


async def snapshot(c: Coordinator, workers: dict[str, int]) -> Snapshot:
    """The state now; `workers` maps each worker's URL to its process id (for /proc)."""
    found = []
    connections: dict[str, int] = {}
    for url, pid in workers.items():
        channel = await c.channels.channel(url)
        info = await channel.worker_info()
        files, memory = await anyio.to_thread.run_sync(_process, pid)
        found.append(
            WorkerSnapshot(url, info.tasks, info.plan_waiters, info.event_loop_tasks, files, memory)
        )
        pool = getattr(channel, "connections", None)
        if isinstance(pool, int):
            connections[url] = pool
    files, memory = await anyio.to_thread.run_sync(_process, os.getpid())
    return Snapshot(
        found,
        len(asyncio.all_tasks()),
        files,
        memory,
        c.admission.running,
        c.admission.queued,
        connections,
    )


def _process(pid: int) -> tuple[int, int]:
    return open_files(pid), resident_bytes(pid)


def open_files(pid: int) -> int:
    """File descriptors the process holds (Linux /proc)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def resident_bytes(pid: int) -> int:
    """The process's resident set size (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
