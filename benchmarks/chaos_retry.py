"""Chaos: a worker process killed (SIGKILL) or stopped (SIGSTOP) at a random moment of a query.

Each trial runs one query on 3 `flightfeed worker` processes: a running feed (UnitProvider, 6
partitions of 200 units, one every 3 ms per partition: ~0.6 s of work turning up while the
query runs) read by 3 leaf tasks with a partial aggregate, a NetworkShuffle and a final
aggregate by body. The exact result is 1,200 rows: each body b"<p>:<i>" once, with n == 1.

A task in the query's task group picks one of the workers at random and signals it at a random
moment: once the provider has handed out a random number of units in [1, all of them]
(`--moment units`, the default: always while the query runs, but never in its last ~20 ms,
after the last unit), or after a random delay in [0, the no-failure query time) from the query's
start (`--moment time`: the whole query, a trial may end before its moment). The coordinator
runs a query that lost a worker again on the others, its feed replayed, as long as no result
batch reached the caller (coordinator/retries.py).

A trial is `exact` (the exact 1,200 rows), `error` (a clear error: a FlightfeedError), `WRONG`
(rows that are not the exact result: never acceptable), `unclear` (an exception that is no
FlightfeedError) or `hung` (no end within `--trial-timeout`). The signalled worker is killed
(a stopped one with SIGKILL) at the end of its trial and replaced by a fresh process; the
others stay for the next trial, and so does the coordinator.

- SIGKILL: target at least 95% of the trials exact, the rest clear errors, none wrong. Reported
  too: the median extra time a retry costs, a retried exact trial's time less the median
  no-failure query time (`--warmup` queries measured first, in the same run).
- SIGSTOP: the stopped worker sends nothing and closes nothing; the coordinator's keepalive
  must notice within 10 s (flight/keepalive.py). Detection time: from the signal to the
  coordinator's first look for lost workers once the attempt failed (`WorkerHealth.lost`,
  timestamped here by wrapping the method on the coordinator's instance), or to the error.

- held (`--mode held`, or `all`: kill, stop and held): a held query, read the way Spark reads
  it. Each trial serves a catalog (`flightfeed.cluster.serve`, in this event loop) whose one
  table is the same running feed, read by 3 tasks over the 3 workers, 2 partitions each, one
  endpoint a partition, and no aggregate. GetFlightInfo goes through the Spark data source's
  client; then every endpoint is read at once, each in a thread, with
  `client.read_endpoint(..., coordinator=<the service>)` (an endpoint it cannot reach, it asks
  the coordinator where it went: "relocate"). A read that fails with a FlightfeedError is done
  again from the start, its rows so far dropped, up to 4 reads a partition (Spark's default
  spark.task.maxFailures). Meanwhile a random worker is SIGKILLed once the provider has handed
  out a random number of units in [1, all of them]; the coordinator runs the lost worker's
  tasks again on the others, their feed partitions replayed. A trial is `exact` (the union of
  the partitions' rows is every body once), `error` (a partition failed 4 times, or
  GetFlightInfo failed), `WRONG`, `unclear` or `hung` as above. Reported: the outcomes, the
  partition re-reads, and the median trial time against the median no-failure held read
  (`--warmup` of them, measured first). Target: at least 95% exact, none wrong.

RESULT lines, each ratio meeting its target at or above it, as in every benchmark here: the
exact trials of each mode (target 0.95), the slowest SIGSTOP detection as 10 s over it (target
1), and a retry's median extra time as the no-failure query's time over a retried query's (no
target: 1 would be a retry that costs nothing).

Exit code 1 if any trial returned a wrong result.

Run: python benchmarks/chaos_retry.py [--trials 100] [--stop-trials 10] [--held-trials 30]
     [--mode kill|stop|both|held|all] [--seed N] [--moment units|time] [--warmup 5]
     [--trial-timeout 60] [--worker-logs DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anyio
import anyio.to_thread
import pyarrow as pa
from _common import median, result_line
from anyio.abc import TaskGroup

from flightfeed.cluster import serve
from flightfeed.coordinator import Catalog, Coordinator
from flightfeed.coordinator.health import WorkerHealth
from flightfeed.coordinator.held import HeldQuery
from flightfeed.coordinator.table_query import table_command
from flightfeed.errors import FlightfeedError
from flightfeed.plan import ExecutionPlan, agg, plan_from
from flightfeed.spark import client
from flightfeed.testing.feeds import (
    UNIT_SCHEMA,
    UnitProvider,
    UnitScan,
    UnitScanCodec,
    UnitScanEstimator,
    unit_coordinator_options,
    unit_scan,
)

SESSION_BUILDER = "flightfeed.testing.feeds:unit_session_builder"  # decodes UnitScan
WORKERS = 3
TASKS = 3
PARTITIONS = 6
UNITS = 200
INTERVAL = 0.003
TOTAL_UNITS = PARTITIONS * UNITS
EXPECTED = frozenset(f"{p}:{i}".encode() for p in range(PARTITIONS) for i in range(UNITS))
EXACT_TARGET = 0.95
DETECTION_TARGET = 10.0
"""Seconds within which a stopped worker must be noticed."""
ERROR_CHARS = 200
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
HELD_TABLE = "units"
HELD_READS = 4
"""Reads of a partition before its query fails: Spark's default spark.task.maxFailures."""


class WorkerProcess:
    """A `flightfeed worker --port 0` process; its log goes to a file (a pipe nobody reads
    would fill and block it)."""

    def __init__(self, log_path: Path) -> None:
        command = [sys.executable, "-m", "flightfeed.cli", "--log-level", "WARNING", "worker"]
        command += ["--port", "0", "--session-builder", SESSION_BUILDER]
        self.log_path = log_path
        self.stopped = False
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
        except BaseException:
            self.kill()
            raise
        found = re.search(r"listening on (\S+)", line)
        if found is None:
            self.kill()
            raise RuntimeError(f"worker failed to start: {line!r} (log: {log_path})")
        self.url = found.group(1)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)
        self.stopped = sig == signal.SIGSTOP

    def kill(self) -> None:
        """SIGKILL (a stopped process too) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        """Terminate it (kill a stopped one, or one that does not end within 10 s)."""
        if self.proc.poll() is not None:
            return
        if self.stopped:
            self.kill()
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


class Cluster:
    """The worker processes; also the coordinator's WorkerResolver (asked once per query, so
    a replaced worker's successor is used from the next query on)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[WorkerProcess] = []
        self._started = 0

    def _new(self) -> WorkerProcess:
        self._started += 1
        return WorkerProcess(self.log_dir / f"worker-{self._started}.log")

    def start(self, count: int) -> None:
        for _ in range(count):
            self.processes.append(self._new())

    def replace(self, index: int) -> None:
        """Kill worker `index` (if it still runs) and start a fresh one in its place."""
        self.processes[index].kill()
        self.processes[index] = self._new()

    def close(self) -> None:
        for process in self.processes:
            process.close()

    async def workers(self) -> list[str]:
        return [process.url for process in self.processes]

    def __repr__(self) -> str:
        return f"Cluster({[process.url for process in self.processes]!r})"


class Notices:
    """When the coordinator looked for lost workers after a failed attempt, and what it found:
    `WorkerHealth.lost` wrapped on the coordinator's instance."""

    def __init__(self, health: WorkerHealth) -> None:
        self.times: list[float] = []
        """When each look began."""
        self.done: list[float] = []
        """When each look ended: the retry (if any) is planned from then on."""
        self.found: list[dict[str, str]] = []
        original = health.lost

        async def lost(urls: Sequence[str]) -> dict[str, str]:
            self.times.append(time.monotonic())
            found = await original(urls)
            self.done.append(time.monotonic())
            self.found.append(found)
            return found

        health.lost = lost  # type: ignore[method-assign]

    def clear(self) -> None:
        self.times.clear()
        self.done.clear()
        self.found.clear()


@dataclass
class Trial:
    mode: str
    number: int
    victim: int
    victim_url: str
    threshold: int | None
    """Units handed out before the signal (`--moment units`)."""
    delay: float | None
    """Seconds from the query's start to the signal (`--moment time`)."""
    outcome: str = ""
    seconds: float = 0.0
    attempts: int = 0
    """Failed attempts (`QueryMetrics.failed_attempts`): 0 means the query was not retried."""
    failed_attempts: list[str] = field(default_factory=list)
    signalled: bool = False
    pulled_at_signal: int = 0
    detection: float | None = None
    """Seconds from the signal to the first look for lost workers, or to the error."""
    lost_after: float | None = None
    """Seconds from the signal to the end of that look: the retry is planned from then on."""
    lost: dict[str, str] = field(default_factory=dict)
    """Workers the coordinator found lost over the trial's failed attempts, and why."""
    error: str = ""
    wrong: str = ""
    notes: list[str] = field(default_factory=list)
    """Anything unexpected (also listed in the summary)."""

    @property
    def retried_exact(self) -> bool:
        return self.outcome == "exact" and self.attempts > 0


def query_plan(provider: UnitProvider) -> ExecutionPlan:
    """Leaf stage (3 tasks, partial aggregate) → NetworkShuffle → final aggregate by body."""
    return plan_from(unit_scan(provider)).aggregate(["body"], [agg("count", name="n")]).plan


def new_provider() -> UnitProvider:
    return UnitProvider([UNITS] * PARTITIONS, interval=INTERVAL)


def what_is_wrong(batches: list[pa.RecordBatch], schema: pa.Schema) -> str:
    """ "" for the exact result, else what differs from it."""
    table = pa.Table.from_batches(batches, schema=schema)
    bodies = Counter(table.column("body").to_pylist())
    ns = table.column("n").to_pylist()
    problems = []
    if table.num_rows != TOTAL_UNITS:
        problems.append(f"{table.num_rows} rows")
    if missing := len(EXPECTED - bodies.keys()):
        problems.append(f"{missing} bodies missing")
    if unknown := len(bodies.keys() - EXPECTED):
        problems.append(f"{unknown} unknown bodies")
    if duplicated := sum(count - 1 for count in bodies.values() if count > 1):
        problems.append(f"{duplicated} duplicate rows")
    if bad := sum(1 for n in ns if n != 1):
        problems.append(f"{bad} rows with n != 1 (sum of n {sum(ns)})")
    return ", ".join(problems)


async def baseline_times(coordinator: Coordinator, runs: int) -> list[float]:
    """No-failure query times (after one untimed run: connections, imports), each checked."""
    times = []
    for run in range(runs + 1):
        provider = new_provider()
        plan = query_plan(provider)
        started = time.monotonic()
        async with coordinator.execute(plan) as stream:
            batches = [batch async for batch in stream]
        elapsed = time.monotonic() - started
        if wrong := what_is_wrong(batches, plan.schema):
            raise RuntimeError(f"a query without failures returned a wrong result: {wrong}")
        if run:
            times.append(elapsed)
    return times


async def run_trial(
    coordinator: Coordinator,
    cluster: Cluster,
    notices: Notices,
    trial: Trial,
    limit: float,
) -> None:
    """One query, its victim signalled from a task next to it; fills in `trial`."""
    provider = new_provider()
    plan = query_plan(provider)
    victim = cluster.processes[trial.victim]
    sig = SIGNALS[trial.mode]
    notices.clear()
    signalled_at = 0.0
    batches: list[pa.RecordBatch] = []

    async def strike() -> None:
        nonlocal signalled_at
        if trial.threshold is not None:
            threshold = trial.threshold
            await provider.waiters.until(lambda: sum(provider.pulls) >= threshold)
        else:
            assert trial.delay is not None
            await anyio.sleep(trial.delay)
        victim.signal(sig)
        signalled_at = time.monotonic()
        trial.signalled = True
        trial.pulled_at_signal = sum(provider.pulls)

    async def query(tg: TaskGroup) -> None:
        stream = coordinator.execute(plan)
        try:
            async with stream:
                batches.extend([batch async for batch in stream])
            trial.wrong = what_is_wrong(batches, plan.schema)
            trial.outcome = "WRONG" if trial.wrong else "exact"
        except FlightfeedError as exc:
            trial.outcome = "error"
            trial.error = str(exc)[:ERROR_CHARS]
        except Exception as exc:
            trial.outcome = "unclear"
            trial.error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        finally:
            metrics = stream.metrics
            if metrics is not None:
                trial.failed_attempts = list(metrics.failed_attempts)
                trial.attempts = len(trial.failed_attempts)
            tg.cancel_scope.cancel()  # the striker, were the query over before its moment

    started = time.monotonic()
    with anyio.move_on_after(limit) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(strike, name="strike")
            tg.start_soon(query, tg, name="query")
    ended = time.monotonic()
    trial.seconds = ended - started
    if deadline.cancelled_caught:
        trial.outcome = "hung"
    if trial.signalled:
        if notices.times:
            trial.detection = notices.times[0] - signalled_at
            if notices.done:
                trial.lost_after = notices.done[0] - signalled_at
            if trial.detection < 0:
                trial.notes.append("an attempt failed before the signal")
        elif trial.outcome in ("error", "unclear", "hung"):
            trial.detection = ended - signalled_at  # (hung: at least this long)
    elif notices.times:
        trial.notes.append("an attempt failed, with no worker signalled")
    trial.lost = {url: why for found in notices.found for url, why in found.items()}
    if trial.signalled and trial.attempts and victim.url not in trial.lost:
        trial.notes.append(f"retried, but the victim was not among the lost workers {trial.lost}")
    if extra := [url for url in trial.lost if url != victim.url]:
        trial.notes.append(f"live workers found lost: {extra}")


def trial_line(trial: Trial) -> str:
    if trial.threshold is not None:
        moment = f"at {trial.threshold:4d}/{TOTAL_UNITS} units"
    else:
        assert trial.delay is not None
        moment = f"at {trial.delay:5.3f} s"
    pulled = f"(pulled {trial.pulled_at_signal:4d})" if trial.signalled else "(not signalled)"
    port = trial.victim_url.rsplit(":", 1)[-1]
    line = (
        f"{trial.mode} {trial.number:3d}  victim {trial.victim} (:{port})  {moment} {pulled}"
        f"  {trial.outcome:7s}  failed attempts {trial.attempts}  {trial.seconds:6.3f} s"
    )
    if trial.detection is not None:
        line += f"  noticed after {trial.detection:6.3f} s"
    if trial.lost_after is not None:
        line += f" (lost after {trial.lost_after:6.3f} s)"
    why = trial.lost.get(trial.victim_url, "") if trial.mode == "stop" else ""
    for detail in [trial.error, trial.wrong, *trial.notes, why and f"victim lost: {why}"]:
        if detail:
            line += f"\n      {detail}"
    return line


@dataclass
class PartitionRead:
    """One endpoint read the way a Spark task reads it: again from its start after a failure,
    up to HELD_READS times."""

    endpoint: client.Endpoint
    table: pa.Table | None = None
    """The rows of the read that went through to the end (None: none did)."""
    failures: list[str] = field(default_factory=list)
    """Why each failed read failed (a FlightfeedError), in order."""
    failed_at: list[float] = field(default_factory=list)
    """When each failed read failed (time.monotonic())."""
    unclear: str = ""
    """An exception that is no FlightfeedError (the partition is not read again)."""
    ended: float = 0.0

    @property
    def rereads(self) -> int:
        return len(self.failures) if self.table is not None else max(len(self.failures) - 1, 0)


def read_partition(read: PartitionRead, coordinator: str) -> None:
    """In a thread: read `read.endpoint` until a read goes through (see PartitionRead)."""
    try:
        for _ in range(HELD_READS):
            try:
                batches = list(client.read_endpoint(read.endpoint, {}, coordinator=coordinator))
            except FlightfeedError as exc:
                read.failures.append(str(exc))
                read.failed_at.append(time.monotonic())
                continue
            except Exception as exc:
                read.unclear = f"{type(exc).__name__}: {exc}"
                return
            read.table = pa.Table.from_batches(batches, schema=UNIT_SCHEMA)
            return
    finally:
        read.ended = time.monotonic()


@dataclass
class HeldTrial:
    number: int
    victim: int | None
    """None: a no-failure read (the baseline)."""
    victim_url: str
    threshold: int | None
    outcome: str = ""
    phase: str = ""
    """Where an error, a hang or something unexpected came: "GetFlightInfo" or "read"."""
    seconds: float = 0.0
    """From GetFlightInfo to the end of the last partition's read."""
    endpoints: int = 0
    victim_endpoints: int = 0
    """Endpoints GetFlightInfo placed on the victim."""
    rereads: int = 0
    """Partition reads done again after a failed one."""
    reread_endpoints: int = 0
    """Partitions read more than once."""
    moved: list[str] = field(default_factory=list)
    """The held query's failed attempts: its tasks moved to other workers."""
    signalled: bool = False
    pulled_at_signal: int = 0
    detection: float | None = None
    """Seconds from the signal to the coordinator's first look for lost workers."""
    recovered: float | None = None
    """Seconds from the signal to the end of the last read of a partition read again."""
    lost: dict[str, str] = field(default_factory=dict)
    error: str = ""
    errors: list[str] = field(default_factory=list)
    """Every failed read's message (of a trial with an error: the partition that failed 4 times
    first)."""
    wrong: str = ""
    notes: list[str] = field(default_factory=list)


def held_catalog(made: list[UnitProvider], created: anyio.Event) -> Catalog:
    """One table over a new running feed per query (the providers made go to `made`)."""
    catalog = Catalog()
    catalog.with_codec(UnitScanCodec()).with_feed(UnitScan, lambda node: node.feed)
    catalog.with_estimator(UnitScan.name, UnitScanEstimator(TASKS))

    @catalog.table(HELD_TABLE)
    def units() -> ExecutionPlan:
        provider = new_provider()
        made.append(provider)
        created.set()
        return unit_scan(provider)

    return catalog


def what_is_wrong_held(tables: list[pa.Table]) -> str:
    """ "" when the partitions hold every body once (and nothing else), else what differs."""
    table = pa.concat_tables(tables) if tables else UNIT_SCHEMA.empty_table()
    bodies = Counter(table.column("body").to_pylist())
    problems = []
    if table.num_rows != TOTAL_UNITS:
        problems.append(f"{table.num_rows} rows")
    if missing := len(EXPECTED - bodies.keys()):
        problems.append(f"{missing} bodies missing")
    if unknown := len(bodies.keys() - EXPECTED):
        problems.append(f"{unknown} unknown bodies")
    if duplicated := sum(count - 1 for count in bodies.values() if count > 1):
        problems.append(f"{duplicated} duplicate rows")
    if bad := sum(1 for units in table.column("units").to_pylist() if units != 1):
        problems.append(f"{bad} rows with units != 1")
    columns = table.column("partition").to_pylist(), table.column("body").to_pylist()
    pairs = zip(*columns, strict=True)
    if misplaced := sum(1 for p, body in pairs if body.split(b":", 1)[0] != str(p).encode()):
        problems.append(f"{misplaced} rows whose partition is not their body's")
    return ", ".join(problems)


async def run_held_trial(cluster: Cluster, trial: HeldTrial, limit: float) -> None:
    """Serve the catalog, GetFlightInfo, read every endpoint in threads while the victim (if
    any) is killed from a task next to them; fills in `trial`."""
    made: list[UnitProvider] = []
    created = anyio.Event()
    urls = [process.url for process in cluster.processes]
    victim = cluster.processes[trial.victim] if trial.victim is not None else None
    reads: list[PartitionRead] = []
    held: HeldQuery | None = None
    query_id = b""
    signalled_at = 0.0
    async with serve(held_catalog(made, created), workers=urls) as served:
        notices = Notices(served.coordinator.health)
        location = served.location

        async def strike() -> None:
            nonlocal signalled_at
            assert victim is not None
            assert trial.threshold is not None
            threshold = trial.threshold
            await created.wait()
            provider = made[0]
            await provider.waiters.until(lambda: sum(provider.pulls) >= threshold)
            victim.signal(signal.SIGKILL)
            signalled_at = time.monotonic()
            trial.signalled = True
            trial.pulled_at_signal = sum(provider.pulls)

        async def query(tg: TaskGroup) -> None:
            nonlocal held, query_id
            command = table_command(HELD_TABLE, [])
            try:
                trial.phase = "GetFlightInfo"
                get = partial(client.get_endpoints, location, command, {})
                query_id, endpoints = await anyio.to_thread.run_sync(get, abandon_on_cancel=True)
                held = served.service.held.get(query_id)
                trial.endpoints = len(endpoints)
                trial.victim_endpoints = sum(
                    1 for e in endpoints if victim is not None and victim.url in e.locations
                )
                trial.phase = "read"
                reads.extend(PartitionRead(endpoint) for endpoint in endpoints)
                async with anyio.create_task_group() as readers:
                    for read in reads:
                        job = partial(read_partition, read, location)
                        readers.start_soon(
                            partial(anyio.to_thread.run_sync, job, abandon_on_cancel=True)
                        )
                if unclear := [read.unclear for read in reads if read.unclear]:
                    trial.outcome = "unclear"
                    trial.error = unclear[0][:ERROR_CHARS]
                elif failed := [read for read in reads if read.table is None]:
                    trial.outcome = "error"
                    trial.error = failed[0].failures[-1][:ERROR_CHARS]
                else:
                    tables = [read.table for read in reads if read.table is not None]
                    trial.wrong = what_is_wrong_held(tables)
                    trial.outcome = "WRONG" if trial.wrong else "exact"
                trial.phase = "" if trial.outcome == "exact" else trial.phase
            except FlightfeedError as exc:
                trial.outcome = "error"
                trial.error = str(exc)[:ERROR_CHARS]
            except Exception as exc:
                trial.outcome = "unclear"
                trial.error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
            finally:
                tg.cancel_scope.cancel()  # the striker, were the reads over before its moment

        started = time.monotonic()
        with anyio.move_on_after(limit) as deadline:
            async with anyio.create_task_group() as tg:
                if victim is not None:
                    tg.start_soon(strike, name="strike")
                tg.start_soon(query, tg, name="query")
        trial.seconds = time.monotonic() - started
        if deadline.cancelled_caught:
            trial.outcome = "hung"
            stuck = [i for i, read in enumerate(reads) if not read.ended]
            if trial.phase == "read":
                trial.notes.append(f"partitions still being read: {stuck}")
        if query_id:
            release = partial(client.release, location, query_id, {})
            await anyio.to_thread.run_sync(release, abandon_on_cancel=True)
        if held is not None:
            trial.moved = list(held.runtime.metrics.failed_attempts)
            if held.runtime.failure is not None:
                trial.notes.append(f"held query failed: {str(held.runtime.failure)[:ERROR_CHARS]}")
        elif query_id:
            trial.notes.append("the service did not hold the query GetFlightInfo answered")
        lost_times = list(notices.times)
        trial.lost = {url: why for found in notices.found for url, why in found.items()}
    if len(made) != 1:
        trial.notes.append(f"{len(made)} providers made (one query expected)")
    trial.rereads = sum(read.rereads for read in reads)
    trial.reread_endpoints = sum(1 for read in reads if read.failures)
    trial.errors = [f for read in reads for f in read.failures]
    if trial.signalled:
        if lost_times:
            trial.detection = lost_times[0] - signalled_at
        again = [read.ended for read in reads if read.failures]
        if again:
            trial.recovered = max(again) - signalled_at
        early = [t for read in reads for t in read.failed_at if t < signalled_at]
        if early:
            trial.notes.append(f"{len(early)} reads failed before the signal")
    elif trial.errors or lost_times or trial.moved:
        trial.notes.append("reads failed or tasks moved, with no worker signalled")
    if victim is not None:
        others = [
            read.endpoint.locations
            for read in reads
            if read.failures and victim.url not in read.endpoint.locations
        ]
        if others:
            trial.notes.append(f"partitions not on the victim read again: {others}")
        if trial.moved and not all(victim.url in moved for moved in trial.moved):
            trial.notes.append("a task moved off a worker that was not the victim")
        if trial.signalled and trial.rereads and victim.url not in trial.lost:
            trial.notes.append(f"read again, but the victim was not found lost {trial.lost}")
    if extra := [url for url in trial.lost if victim is None or url != victim.url]:
        trial.notes.append(f"live workers found lost: {extra}")


def held_trial_line(trial: HeldTrial) -> str:
    port = trial.victim_url.rsplit(":", 1)[-1]
    pulled = f"(pulled {trial.pulled_at_signal:4d})" if trial.signalled else "(not signalled)"
    line = (
        f"held {trial.number:3d}  victim {trial.victim} (:{port}, {trial.victim_endpoints}"
        f"/{trial.endpoints} endpoints)  at {trial.threshold or 0:4d}/{TOTAL_UNITS} units"
        f" {pulled}  {trial.outcome:7s}  re-reads {trial.rereads}"
        f" ({trial.reread_endpoints} partitions)  moved {len(trial.moved)}"
        f"  {trial.seconds:6.3f} s"
    )
    if trial.detection is not None:
        line += f"  noticed after {trial.detection:6.3f} s"
    if trial.recovered is not None:
        line += f"  re-read done after {trial.recovered:6.3f} s"
    details = [trial.error and f"[{trial.phase}] {trial.error}", trial.wrong, *trial.notes]
    if trial.outcome != "exact":
        details += [f"read failed: {e[:ERROR_CHARS]}" for e in trial.errors]
    for detail in details:
        if detail:
            line += f"\n      {detail}"
    return line


async def held_baseline(cluster: Cluster, args: argparse.Namespace) -> list[float]:
    """No-failure held read times (after one untimed read), each checked."""
    times = []
    for run in range(args.warmup + 1):
        trial = HeldTrial(0, None, "", None)
        await run_held_trial(cluster, trial, args.trial_timeout)
        if trial.outcome != "exact" or trial.notes:
            raise RuntimeError(
                f"a held read without failures was {trial.outcome}:"
                f" {trial.error or trial.wrong} {trial.notes}"
            )
        if run:
            times.append(trial.seconds)
    return times


async def held_chaos(
    cluster: Cluster, args: argparse.Namespace, rng: random.Random
) -> tuple[float, list[HeldTrial]]:
    """The no-failure held read's median time, then the held trials."""
    times = await held_baseline(cluster, args)
    baseline = median(times)
    print(
        f"no-failure held read: median {baseline:.3f} s over {len(times)} runs"
        f" ({', '.join(f'{t:.3f}' for t in times)})",
        flush=True,
    )
    trials = []
    for number in range(1, args.held_trials + 1):
        victim = rng.randrange(WORKERS)
        threshold = rng.randint(1, TOTAL_UNITS)
        url = cluster.processes[victim].url
        trial = HeldTrial(number, victim, url, threshold)
        await run_held_trial(cluster, trial, args.trial_timeout)
        if trial.signalled:
            await anyio.to_thread.run_sync(cluster.replace, victim)
        for index, process in enumerate(cluster.processes):
            if process.proc.poll() is not None:
                trial.notes.append(
                    f"worker {index} ({process.url}) ended unasked,"
                    f" exit code {process.proc.returncode}: replaced"
                )
                await anyio.to_thread.run_sync(cluster.replace, index)
        trials.append(trial)
        print(held_trial_line(trial), flush=True)
    return baseline, trials


def summarize_held(trials: list[HeldTrial], baseline: float) -> None:
    outcomes = Counter(trial.outcome for trial in trials)
    exact = [trial for trial in trials if trial.outcome == "exact"]
    reread = [trial for trial in exact if trial.rereads]
    print(f"\nHELD: {len(trials)} trials, SIGKILL while a held query is read (Spark-style reads)")
    print(
        f"  exact {len(exact)} ({len(reread)} with partitions read again,"
        f" {len(exact) - len(reread)} without), clear errors {outcomes['error']},"
        f" WRONG {outcomes['WRONG']}, unclear errors {outcomes['unclear']},"
        f" hung {outcomes['hung']}"
    )
    unsignalled = sum(1 for trial in trials if not trial.signalled)
    if unsignalled:
        print(f"  {unsignalled} trials ended before their moment (no worker signalled)")
    rereads = Counter(trial.rereads for trial in trials)
    print(
        f"  partition re-reads: {sum(trial.rereads for trial in trials)} in all;"
        f" trials by re-reads {dict(sorted(rereads.items()))};"
        f" tasks moved {sum(len(trial.moved) for trial in trials)}"
    )
    if exact:
        seconds = [trial.seconds for trial in exact]
        line = f"  time: exact trials median {median(seconds):.3f} s"
        if reread:
            again = [trial.seconds for trial in reread]
            line += (
                f", with re-reads median {median(again):.3f} s ({median(again) - baseline:+.3f} s)"
                f" max {max(again):.3f} s"
            )
        print(line + f"; no-failure held read {baseline:.3f} s")
    detections = [trial.detection for trial in trials if trial.detection is not None]
    if detections:
        print(
            f"  lost worker looked for after: median {median(detections):.3f} s,"
            f" max {max(detections):.3f} s ({len(detections)} trials)"
        )
    recovered = [trial.recovered for trial in trials if trial.recovered is not None]
    if recovered:
        print(
            f"  partitions read again done after the kill: median {median(recovered):.3f} s,"
            f" max {max(recovered):.3f} s"
        )
    errors = Counter(
        f"[{trial.phase}] " + re.sub(r"[0-9a-f]{32}|:\d{2,5}\b", "…", trial.error)[:120]
        for trial in trials
        if trial.outcome in ("error", "unclear", "hung") and trial.error
    )
    for message, count in errors.most_common():
        print(f"  {count} x {message}")
    failed_reads = Counter(
        re.sub(r"[0-9a-f]{32}|:\d{2,5}\b", "…", error)[:120]
        for trial in trials
        for error in trial.errors
    )
    if failed_reads:
        print("  failed reads (each read again):")
        for message, count in failed_reads.most_common():
            print(f"    {count} x {message}")
    for trial in trials:
        if trial.notes:
            print(f"  trial {trial.number}: {'; '.join(trial.notes)}")


@dataclass
class Results:
    baseline: float = float("nan")
    """The median no-failure query time (kill and stop modes)."""
    trials: list[Trial] = field(default_factory=list)
    held_baseline: float = float("nan")
    """The median no-failure held read time."""
    held: list[HeldTrial] = field(default_factory=list)


def modes_of(mode: str) -> list[str]:
    return {"both": ["kill", "stop"], "all": ["kill", "stop", "held"]}.get(mode, [mode])


async def chaos(cluster: Cluster, args: argparse.Namespace, rng: random.Random) -> Results:
    """Every mode's baseline and trials."""
    results = Results()
    modes = modes_of(args.mode)
    signals = [mode for mode in modes if mode in SIGNALS]
    if signals:
        results.baseline, results.trials = await signal_chaos(cluster, args, rng, signals)
    if "held" in modes:
        results.held_baseline, results.held = await held_chaos(cluster, args, rng)
    return results


async def signal_chaos(
    cluster: Cluster, args: argparse.Namespace, rng: random.Random, modes: list[str]
) -> tuple[float, list[Trial]]:
    """The baseline, then the trials of `modes` (kill, stop): the median no-failure time, and
    the trials."""
    trials: list[Trial] = []
    options = unit_coordinator_options(tasks=TASKS)
    async with Coordinator(cluster, **options) as coordinator:
        notices = Notices(coordinator.health)
        times = await baseline_times(coordinator, args.warmup)
        baseline = median(times)
        print(
            f"no-failure query: median {baseline:.3f} s over {len(times)} runs"
            f" ({', '.join(f'{t:.3f}' for t in times)})",
            flush=True,
        )
        for mode in modes:
            count = args.trials if mode == "kill" else args.stop_trials
            for number in range(1, count + 1):
                victim = rng.randrange(WORKERS)
                threshold = delay = None
                if args.moment == "units":
                    threshold = rng.randint(1, TOTAL_UNITS)
                else:
                    delay = rng.uniform(0.0, baseline)
                url = cluster.processes[victim].url
                trial = Trial(mode, number, victim, url, threshold, delay)
                await run_trial(coordinator, cluster, notices, trial, args.trial_timeout)
                if trial.signalled:  # (a stopped worker: SIGKILL and wait, then replaced)
                    await anyio.to_thread.run_sync(cluster.replace, victim)
                for index, process in enumerate(cluster.processes):
                    if process.proc.poll() is not None:
                        trial.notes.append(
                            f"worker {index} ({process.url}) ended unasked,"
                            f" exit code {process.proc.returncode}: replaced"
                        )
                        await anyio.to_thread.run_sync(cluster.replace, index)
                trials.append(trial)
                print(trial_line(trial), flush=True)
    return baseline, trials


def summarize(mode: str, trials: list[Trial], baseline: float) -> None:
    outcomes = Counter(trial.outcome for trial in trials)
    exact = outcomes["exact"]
    retried = [trial for trial in trials if trial.retried_exact]
    print(f"\n{mode.upper()}: {len(trials)} trials, signal SIG{mode.upper()}")
    print(
        f"  exact {exact} ({len(retried)} after a retry, {exact - len(retried)} not retried),"
        f" clear errors {outcomes['error']}, WRONG {outcomes['WRONG']},"
        f" unclear errors {outcomes['unclear']}, hung {outcomes['hung']}"
    )
    unsignalled = sum(1 for trial in trials if not trial.signalled)
    if unsignalled:
        print(f"  {unsignalled} trials ended before their moment (no worker signalled)")
    several = Counter(trial.attempts for trial in trials if trial.attempts > 1)
    if several:
        print(f"  trials with more than one failed attempt: {dict(sorted(several.items()))}")
    if retried:
        extra = [trial.seconds - baseline for trial in retried]
        print(
            f"  a retry's extra time: median {median(extra):.3f} s, max {max(extra):.3f} s"
            f" (baseline {baseline:.3f} s)"
        )
    detections = [trial.detection for trial in trials if trial.detection is not None]
    if detections:
        print(
            f"  noticed after: median {median(detections):.3f} s, max {max(detections):.3f} s"
            f" ({len(detections)} trials)"
        )
    lost_after = [trial.lost_after for trial in trials if trial.lost_after is not None]
    if lost_after:
        print(
            f"  lost worker confirmed (retry planned) after: median {median(lost_after):.3f} s,"
            f" max {max(lost_after):.3f} s"
        )
    errors = Counter(
        re.sub(r"[0-9a-f]{32}|:\d{2,5}\b", "…", trial.error)[:120]
        for trial in trials
        if trial.outcome in ("error", "unclear", "hung") and trial.error
    )
    for message, count in errors.most_common():
        print(f"  {count} x {message}")
    for trial in trials:
        if trial.notes:
            print(f"  trial {trial.number}: {'; '.join(trial.notes)}")


def main() -> None:
    from flightfeed.flight.tuning import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="SIGKILL trials")
    parser.add_argument("--stop-trials", type=int, default=10, help="SIGSTOP trials (~15 s each)")
    parser.add_argument("--held-trials", type=int, default=30, help="held query trials")
    parser.add_argument(
        "--mode",
        choices=["kill", "stop", "both", "held", "all"],
        default="both",
        help="both: kill and stop; all: kill, stop and held",
    )
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument(
        "--moment",
        choices=["units", "time"],
        default="units",
        help="signal after a random number of units handed out, or after a random delay",
    )
    parser.add_argument("--warmup", type=int, default=5, help="timed no-failure queries")
    parser.add_argument("--trial-timeout", type=float, default=60.0)
    parser.add_argument("--worker-logs", type=Path, default=None, help="keep worker logs here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed} (--seed {seed} repeats the victims and moments)", flush=True)
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        if args.worker_logs is not None:
            args.worker_logs.mkdir(parents=True, exist_ok=True)
            log_dir = args.worker_logs
        else:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        cluster = Cluster(log_dir)
        stack.callback(cluster.close)  # (after the coordinator, which `run` has closed)
        cluster.start(WORKERS)
        results = run(lambda: chaos(cluster, args, rng))

    baseline, trials = results.baseline, results.trials
    lines = []
    kill = [trial for trial in trials if trial.mode == "kill"]
    stop = [trial for trial in trials if trial.mode == "stop"]
    if kill:
        summarize("kill", kill, baseline)
        exact = sum(1 for trial in kill if trial.outcome == "exact")
        lines.append(
            result_line("chaos_sigkill_exact", exact, "trials", exact / len(kill), EXACT_TARGET)
        )
        extra = [trial.seconds - baseline for trial in kill if trial.retried_exact]
        value = median(extra) if extra else float("nan")
        # No target: the no-failure query's time over a retried one's (1: a retry costs nothing).
        ratio = baseline / (baseline + value)
        lines.append(result_line("chaos_retry_extra", value, "s", ratio, 1.0))
    if stop:
        summarize("stop", stop, baseline)
        exact = sum(1 for trial in stop if trial.outcome == "exact")
        lines.append(
            result_line("chaos_sigstop_exact", exact, "trials", exact / len(stop), EXACT_TARGET)
        )
        detections = [trial.detection for trial in stop if trial.detection is not None]
        worst = max(detections) if detections else float("nan")
        ratio = DETECTION_TARGET / worst  # (≥ 1: the slowest detection within the bound)
        lines.append(result_line("chaos_sigstop_detect", worst, "s", ratio, 1.0))
    if results.held:
        summarize_held(results.held, results.held_baseline)
        exact = sum(1 for trial in results.held if trial.outcome == "exact")
        count = len(results.held)
        lines.append(result_line("chaos_held_exact", exact, "trials", exact / count, EXACT_TARGET))
    outcomes = [trial.outcome for trial in trials] + [trial.outcome for trial in results.held]
    wrong = outcomes.count("WRONG")
    print(f"\n{wrong or 'no'} trial(s) returned a wrong result")
    for line in lines:
        print(line)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
