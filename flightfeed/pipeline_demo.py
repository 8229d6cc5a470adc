"""The main job's first step: a data pipeline on Spark over work discovered at runtime.

An embedded coordinator serves the seeds' `scan` table on local workers; a local Spark session
runs SQL over it. While Spark reads, the coordinator's provider discovers chunks of rows (as a
connector would discover pages of an API) and streams them to the workers, which turn each
chunk into rows for the Spark task that reads their partition. Progress bars follow the chunks
discovered and processed; the result is checked against the same table run in one process.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pyarrow as pa

from .cluster import serve_in_background
from .errors import FlightfeedError
from .examples.chunk_scan import catalog, observe_chunks
from .plan import collect, open_task_context

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

CHUNK_ROWS = 2_000
CHUNKS_PER_PARTITION = 150
PARTITIONS_PER_WORKER = 4
CHUNK_DELAY = 0.002
"""Seconds before each chunk is "discovered", as if polling a remote source."""


@dataclass(frozen=True)
class PipelineResult:
    ok: bool
    rows: int
    seconds: float


def pipeline_query(workers: int) -> tuple[str, tuple[object, ...]]:
    """The SQL and the scan's arguments: a task per worker, 4 partitions per task."""
    spec = ",".join([str(CHUNK_ROWS)] * CHUNKS_PER_PARTITION)
    specs = [spec] * (PARTITIONS_PER_WORKER * workers)
    arguments: tuple[object, ...] = (workers, *specs)
    call = f"scan({workers}, {', '.join(repr(s) for s in specs)})"
    query = (
        f"SELECT task, count(DISTINCT partition) AS partitions, count(*) AS rows FROM {call}"
        " GROUP BY task ORDER BY task"
    )
    return query, arguments


class _Progress:
    """Chunks discovered and processed, as rich progress bars (a ChunkObserver); called from
    the cluster's thread (rich's progress takes a lock)."""

    def __init__(self, progress: Progress, discovered: TaskID, processed: TaskID) -> None:
        self._progress = progress
        self._discovered = discovered
        self._processed = processed

    def discovered(self) -> None:
        self._progress.advance(self._discovered)

    def processed(self) -> None:
        self._progress.advance(self._processed)


def one_process_counts(arguments: tuple[object, ...]) -> pa.Table:
    """The same aggregation over the same table, run in this process without Spark."""
    table_catalog = catalog(delay=0.0)

    async def run() -> pa.Table:
        plan = table_catalog.plan("scan", arguments)
        async with open_task_context(table_catalog.session()) as ctx:
            rows = await collect(plan, ctx)
        counts = rows.group_by("task").aggregate(
            [("partition", "count_distinct"), ("task", "count")]
        )
        return counts.rename_columns(["task", "partitions", "rows"]).sort_by("task")

    return anyio.run(run)


def run_pipeline(workers: int = 2) -> PipelineResult:
    """Start a local Spark session and the embedded cluster, run the pipeline, check it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .spark import interruptible, java_runtime, local_session, sql

    try:
        java_runtime()
    except FlightfeedError as exc:
        raise FlightfeedError(
            f"{exc.message}; or run `flightfeed demo --no-spark`, the demo without Spark"
        ) from None

    console = Console()
    query, arguments = pipeline_query(workers)
    chunks = CHUNKS_PER_PARTITION * PARTITIONS_PER_WORKER * workers
    console.print("[bold]1. A Spark pipeline over work discovered at runtime[/bold]")
    # py4j logs each gateway connection it closes at INFO, the level `flightfeed` logs at.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # grpclib logs each stream a reader resets at INFO: Ctrl-C during the read resets them all.
    logging.getLogger("grpclib.server").setLevel(logging.WARNING)
    # A local session runs on this machine: bound to loopback, Spark does not warn that the
    # host name resolves to it; its log keeps warnings but not the start-up notices.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_config = Path(__file__).parent / "spark" / "demo-log4j2.properties"
    java_options = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}"}
    with console.status("starting a local Spark session (local[2])"):
        # ctrl_c: one line, not tracebacks
        spark = local_session("flightfeed-demo", ctrl_c="plain", **java_options)
    try:
        with serve_in_background(catalog(delay=CHUNK_DELAY), local_workers=workers) as cluster:
            console.print(f"coordinator {cluster.location}, {workers} local workers")
            console.print(f"Spark SQL: {query[:110]}...")
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            started = time.perf_counter()
            with Progress(*columns, console=console, transient=False) as progress:
                found = progress.add_task("chunks discovered on the coordinator", total=chunks)
                done = progress.add_task("chunks processed on the workers", total=chunks)
                with observe_chunks(_Progress(progress, found, done)):
                    result = interruptible(
                        spark, lambda: sql(spark, cluster.location, query).toArrow()
                    )
            seconds = time.perf_counter() - started
    finally:
        spark.stop()
    expected = one_process_counts(arguments)
    got = result.cast(expected.schema)
    ok = got.equals(expected)
    table = Table(*got.column_names)
    for row in got.to_pylist():
        table.add_row(*(f"{value:,}" for value in row.values()))
    console.print(table)
    verdict = "matches the one-process run" if ok else "MISMATCH with the one-process run"
    rows = sum(got.column("rows").to_pylist())
    console.print(f"Spark read {rows:,} rows in {seconds:.1f}s: {verdict}")
    return PipelineResult(ok, rows, seconds)
