"""What the worker's RPC handlers work with, and nothing more: its limits, its live tasks,
how sessions are built, and where it can be reached."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from ..concurrency import Signal
from ..errors import Unavailable, Unimplemented
from ..flight.auth import bearer
from ..flight.call_count import CallCount
from ..flight.shared_memory import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS
from ..plan.memory import MemoryPool
from ..plan.nodes import ParquetScanCodec
from ..protocol.channel import WorkerEndpoint
from ..protocol.resolver import ChannelResolver
from ..session import SessionBuilder
from ..tables.engine import TableEngine
from ..tables.priority import PriorityGate
from .config import WorkerConfig
from .registry import TaskRegistry
from .shared_memory_pool import SegmentPool

TABLES_SHUTTING_DOWN: Final = (
    "the worker is shutting down: it lets the table reads and writes under way end, takes no new"
)


@dataclass
class SharedMemoryStats:
    """Shared-memory reads on this worker (counters only grow; `held_bytes` is now)."""

    offered: int = 0
    """Reads offered a segment."""
    mapped: int = 0
    """Of those, reads whose reader mapped it (the others streamed)."""
    reused: int = 0
    """Of those, reads of a segment the reader kept from an earlier read."""
    streamed: int = 0
    """Reads that asked for shared memory and streamed: no directory, budget spent, a table."""
    placed_batches: int = 0
    placed_bytes: int = 0
    inline_batches: int = 0
    """Batches of mapped reads that streamed anyway: too large for a slot, or none free."""


@dataclass(eq=False)
class WorkerState:
    config: WorkerConfig
    registry: TaskRegistry
    session_builder: SessionBuilder
    location: str = ""
    """The worker's location (known once it serves); error origins name it."""
    memory: MemoryPool = field(init=False)
    """What every task's operators reserve from (WorkerConfig.memory_limit)."""
    calls: CallCount = field(default_factory=CallCount)
    """The calls running on the worker's port (none in process: calls are not counted)."""
    memory_releases: int = 0
    """Times the worker handed freed memory back after going quiet."""
    shared_memory: SharedMemoryStats = field(default_factory=SharedMemoryStats)
    """Reads offered shared memory, and where their batches went (rpc/shared_memory_read.py)."""
    segments: SegmentPool | None = field(init=False)
    """The shared-memory segments of reads on this host (None: WorkerConfig.shared_memory_dir
    is None, every read streams)."""
    endpoint: WorkerEndpoint | None = None
    """The worker's own handlers (set when it starts): its tasks read each other through them."""
    peers: ChannelResolver = field(init=False)
    """Channels to the workers its tasks read from (NetworkShuffle and co.), by URL."""
    tables: TableEngine | None = None
    """The worker's durable tables (WorkerConfig.data_dir), open while it serves."""
    plan_gate: PriorityGate = field(init=False)
    """Where plans pushed down to the tables (ExecutePhysicalPlan) wait, by priority."""
    parquet_codec: ParquetScanCodec = field(init=False)
    """Decodes ParquetScans of files under WorkerConfig.parquet_roots (of none without)."""

    def __post_init__(self) -> None:
        self.memory = MemoryPool(self.config.memory_limit)
        config = self.config
        self.segments = (
            None
            if config.shared_memory_dir is None
            else SegmentPool(
                config.shared_memory_dir,
                config.shared_memory_bytes,
                DEFAULT_SLOTS,
                DEFAULT_SLOT_BYTES,
                config.shared_memory_idle_ttl,
            )
        )
        self.parquet_codec = ParquetScanCodec(self.config.parquet_roots)
        self.plan_gate = PriorityGate(self.config.table_plan_slots)
        token = self.config.peer_token
        self.peers = ChannelResolver(
            check_version=False,
            tls=self.config.peer_tls,
            metadata=bearer(token) if token is not None else None,
        )

    calls_under_way: int = field(default=0, init=False)
    """Calls a graceful stop lets end (`call_under_way`): table reads, writes and actions, and
    task reads through shared memory."""
    _calls_under_way_ended: Signal = field(default_factory=Signal, init=False, repr=False)

    def table_engine(self) -> TableEngine:
        """The worker's tables, or a clear refusal when it keeps none, or is shutting down."""
        if self.tables is None:
            raise Unimplemented("this worker holds no tables: start it with --data-dir DIR")
        if self.registry.draining:
            raise Unavailable(TABLES_SHUTTING_DOWN)
        return self.tables

    @contextmanager
    def call_under_way(self) -> Iterator[None]:
        """Count a call while it runs: a graceful stop lets those under way end
        (`calls_under_way_ended`), where it had cut a DoPut one second from its end, and a
        shared-memory read whose task was read whole while its reader still took the last
        slots (the task no longer held the stop)."""
        self.calls_under_way += 1
        try:
            yield
        finally:
            self.calls_under_way -= 1
            if not self.calls_under_way:
                self._calls_under_way_ended.notify()

    async def calls_under_way_ended(self) -> None:
        """Until no call a graceful stop waits for is under way."""
        while self.calls_under_way:
            await self._calls_under_way_ended.wait()
