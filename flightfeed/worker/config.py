"""Worker settings: the bounds that keep a worker's memory and state finite."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..feeds.inbox import MAX_FEED_WINDOW
from ..flight.auth import Authenticator
from ..flight.connection_limits import ConnectionLimits
from ..flight.idle_release import DEFAULT_QUIET_SECONDS
from ..flight.keepalive import WORKER_SERVER_KEEPALIVE, KeepalivePolicy
from ..flight.shared_memory import DEFAULT_DIRECTORY as DEFAULT_SHARED_MEMORY_DIRECTORY
from ..flight.tls import ClientTls, ServerTls
from ..plan.memory import default_memory_limit
from ..tables.payload import CompressionMode
from ..tables.snapshots import DEFAULT_SNAPSHOT_GRACE, DEFAULT_SNAPSHOT_TTL


@dataclass(frozen=True)
class WorkerConfig:
    """Limits and timeouts of a worker.

    plan_wait_timeout: how long an ExecuteTask waits for its task's SetPlan to come (once it
        has, the wait lasts while its session is built and its plan decoded).
    idle_ttl: a task with a plan but no consumer activity for this long is dropped.
    tombstone_ttl: how long a finished task's key answers "already finished".
    consumer_buffer_batches: per-consumer buffer of a fanned-out (repartition/broadcast) task.
    max_fanout_outputs: outputs a repartition or broadcast head may ask for (each output gets
        a buffer, and a broadcast sends every batch to each): more are RESOURCE_EXHAUSTED.
    fanout_claim_timeout: an output of a repartition or broadcast head that no consumer opens
        this long after the first one is dropped (its full buffer would stop the producer, and
        with it every other output); a consumer that comes later gets an error.
    max_concurrent_tasks: SetPlans beyond this are refused with RESOURCE_EXHAUSTED.
    feed_credits: work units in flight per feed partition (the per-partition window, at most
        65,536); GetWorkerInfo reports it, so coordinators send that many behind a SetPlan.
    max_feed_partitions: feed partitions one task may declare (each gets its own queue and
        credit), refused with RESOURCE_EXHAUSTED before any is allocated.
    replay_limit: work units kept per feed partition of a replayable task, so a partition read
        again yields the same rows; a partition that took more cannot be read again.
    keepalive: when to ping a caller whose calls went quiet, so the tasks of a coordinator
        that vanished without closing its connection are cancelled (None: never).
    connections: how many connections the worker holds at once, how long a new one has to
        send the HTTP/2 preface (so silent connections cannot use up its file descriptors), the
        largest request header block, the minimum rate at which a started request must arrive,
        and how long a connection without calls is kept (flight/connection_limits.py).
    memory_limit: bytes every task together may hold (the worker's memory pool); a task's own
        limit is its session's memory budget, if lower. None: unbounded. Default: half the
        machine's (or cgroup's) memory.
    parquet_roots: directories whose Parquet files plans may read (ParquetScan); empty: none,
        a plan with a ParquetScan is refused. A plan names files: without this, anyone who
        can send one could read any file the worker's user can.
    peers: the worker URLs its tasks may read other tasks from (NetworkShuffle and co.; its own
        URL always). None: any worker a plan names. A plan names the peers to connect to:
        with a list, nobody who can send one can point the worker at another host.
    release_memory_after: seconds without tasks or calls after which the worker hands freed
        memory back to the operating system (a burst's peak would otherwise stay resident;
        None: never).
    data_dir: where the worker keeps its durable tables (a DuckDB database in it); None: it
        holds no tables, ":memory:" keeps them in memory only (tests, demos).
    table_compression: zstd on the table reads' payloads: "auto" while it halves the bytes,
        "always" or "never".
    table_purge_interval: seconds between deletions of rows a table's TTL has expired (reads
        never return them either way).
    table_snapshot_grace, table_snapshot_ttl: a table read planned in several partitions holds
        one snapshot for them (tables/snapshots.py), released `grace` seconds after every one
        was read, or `ttl` seconds after the last read while some are unread; its tickets are
        then read while the worker's tables are unchanged, and refused once a write commits.
    table_plan_slots: plans pushed down to the tables (ExecutePhysicalPlan) that run at once;
        more wait, high priority first.
    tls: serve over TLS with this certificate (`grpc+tls://` locations); with a client CA,
        every client must present a certificate it signed (mutual TLS). None: plaintext.
    peer_tls: how this worker reaches `grpc+tls://` peers (their root CA, and the certificate
        it presents to them).
    auth: who may call the worker: every call on its port must carry credentials this accepts
        (flight/auth.py: BearerTokens, or any callable of the headers). None: anyone.
    peer_token: the bearer token this worker sends its peers (NetworkShuffle and co.).
    shared_memory_dir: where a reader on this host may be offered a shared-memory segment for
        its batches (flight/shared_memory.py; default /dev/shm: where it cannot make a file, the
        read streams). None: every read streams its batches through the socket.
    shared_memory_bytes: segment bytes the shared-memory reads may hold at once, in use or kept
        idle for their readers (a segment takes its pages when it is made); a read that
        would go past it streams instead.
    shared_memory_idle_ttl: seconds a segment is kept, unused, for the reader that maps it
        (Spark reuses its Python workers: their next read reuses its pages).
    """

    plan_wait_timeout: float = 10.0
    idle_ttl: float = 300.0
    tombstone_ttl: float = 600.0
    max_tombstones: int = 100_000
    consumer_buffer_batches: int = 4
    max_fanout_outputs: int = 4096
    fanout_claim_timeout: float = 60.0
    max_concurrent_tasks: int = 1024
    feed_credits: int = 256
    max_feed_partitions: int = 4096
    replay_limit: int = 100_000
    keepalive: KeepalivePolicy | None = WORKER_SERVER_KEEPALIVE
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    memory_limit: int | None = field(default_factory=default_memory_limit)
    release_memory_after: float | None = DEFAULT_QUIET_SECONDS
    parquet_roots: tuple[str, ...] = ()
    peers: frozenset[str] | None = None
    data_dir: str | None = None
    table_compression: CompressionMode = "auto"
    table_purge_interval: float = 600.0
    table_snapshot_ttl: float = DEFAULT_SNAPSHOT_TTL
    table_snapshot_grace: float = DEFAULT_SNAPSHOT_GRACE
    tls: ServerTls | None = None
    peer_tls: ClientTls | None = None
    auth: Authenticator | None = None
    peer_token: str | None = None
    table_plan_slots: int = field(default_factory=lambda: max(2, os.cpu_count() or 2))
    shared_memory_dir: str | None = DEFAULT_SHARED_MEMORY_DIRECTORY
    shared_memory_bytes: int = 256 << 20
    shared_memory_idle_ttl: float = 60.0

    def __post_init__(self) -> None:
        for name in ("plan_wait_timeout", "idle_ttl", "tombstone_ttl", "fanout_claim_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WorkerConfig.{name} must be positive")
        if (
            min(
                self.consumer_buffer_batches,
                self.max_concurrent_tasks,
                self.max_feed_partitions,
                self.max_fanout_outputs,
            )
            < 1
        ):
            raise ValueError("WorkerConfig buffers and limits must be at least 1")
        if not 1 <= self.feed_credits <= MAX_FEED_WINDOW:
            raise ValueError(f"WorkerConfig.feed_credits must be in 1..{MAX_FEED_WINDOW}")
        if self.memory_limit is not None and self.memory_limit < 1:
            raise ValueError("WorkerConfig.memory_limit must be positive (or None)")
        relative = [root for root in self.parquet_roots if not os.path.isabs(root)]
        if relative:
            raise ValueError(f"WorkerConfig.parquet_roots must be absolute, got {relative}")
        if self.release_memory_after is not None and not self.release_memory_after > 0:
            raise ValueError("WorkerConfig.release_memory_after must be positive (or None)")
        if self.table_compression not in ("auto", "always", "never"):
            raise ValueError("WorkerConfig.table_compression must be auto, always or never")
        if self.table_plan_slots < 1:
            raise ValueError("WorkerConfig.table_plan_slots must be at least 1")
        if self.shared_memory_dir is not None and not os.path.isabs(self.shared_memory_dir):
            raise ValueError("WorkerConfig.shared_memory_dir must be absolute (or None)")
        if self.shared_memory_bytes < 0:
            raise ValueError("WorkerConfig.shared_memory_bytes must not be negative")
        if not self.shared_memory_idle_ttl >= 0:
            raise ValueError("WorkerConfig.shared_memory_idle_ttl must not be negative")
        if not self.table_purge_interval > 0:
            raise ValueError("WorkerConfig.table_purge_interval must be positive")
        if not self.table_snapshot_ttl > 0:
            raise ValueError("WorkerConfig.table_snapshot_ttl must be positive")
        if not self.table_snapshot_grace >= 0:
            raise ValueError("WorkerConfig.table_snapshot_grace must not be negative")
