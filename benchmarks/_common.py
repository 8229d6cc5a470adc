"""Shared helpers for benchmarks: RESULT lines, subprocess servers, statistics."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path


def result_line(name: str, value: float, unit: str, ratio: float, target: float) -> str:
    """The machine-readable last line(s) every benchmark prints."""
    return f"RESULT {name} value={value:.4g} unit={unit} ratio={ratio:.3f} target={target:g}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


class ServerProcess:
    """A benchmark server in its own process; it prints its port on the first stdout line."""

    def __init__(self, args: Sequence[str]) -> None:
        self._proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self._proc.kill()
            raise RuntimeError(f"benchmark server failed to start: {line!r}")
        self.port = int(line)

    @property
    def location(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def worker_process(session_builder: str) -> Iterator[str]:
    """A `flightfeed worker --port 0` in its own process, with `session_builder`
    (pkg.module:attr); yields its URL."""
    with worker_process_pid(session_builder) as (url, _):
        yield url


@contextmanager
def worker_process_pid(session_builder: str | None, *extra: str) -> Iterator[tuple[str, int]]:
    """`worker_process`, yielding the URL and the process id (for its CPU time and memory);
    `extra` goes to `flightfeed worker` (no session builder: the default one)."""
    command = [sys.executable, "-m", "flightfeed.cli", "--log-level", "WARNING", "worker"]
    command += ["--port", "0", *extra]
    if session_builder is not None:
        command += ["--session-builder", session_builder]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"listening on (\S+)", line)
        if found is None:
            raise RuntimeError(f"worker failed to start: {line!r}")
        yield found.group(1), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, every thread included (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_key_value_parquet(
    root: Path, rows: int, *, files: int, keys: int, row_group: int, seed: int
) -> None:
    """`rows` rows of `k` (int64 in [0, keys)) and `v` (double in [0, 1)) over `files` Parquet
    files of `row_group`-row row groups, written a row group at a time (bounded memory)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    per_file = rows // files
    for index in range(files):
        count = per_file if index < files - 1 else rows - per_file * (files - 1)
        with pq.ParquetWriter(root / f"part-{index}.parquet", schema) as writer:
            for start in range(0, count, row_group):
                n = min(row_group, count - start)
                table = pa.table({"k": rng.integers(0, keys, n), "v": rng.random(n)}, schema=schema)
                writer.write_table(table, row_group_size=row_group)


def parquet_worker_urls(stack: ExitStack, root: Path, count: int) -> list[str]:
    """`count` `flightfeed worker` processes allowed to read `root`'s Parquet files (closed
    with `stack`); their URLs."""
    return [
        stack.enter_context(worker_process_pid(None, "--parquet-root", str(root)))[0]
        for _ in range(count)
    ]
