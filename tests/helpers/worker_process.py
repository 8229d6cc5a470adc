"""A `flightfeed worker` process, as a user starts it, for tests that need a live worker in
another process (hostile input, resource limits): its location and its resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parents[1])


_LOGS: dict[int, Path] = {}
_LINES: dict[int, str] = {}


def start_worker(*extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start `flightfeed worker --port 0 ...`; the process and its location (grpc://, or
    grpc+tls:// with --tls-cert). Its log
    goes to a file (`worker_log`): a pipe nobody reads would fill and block the worker."""
    log = Path(tempfile.mkstemp(prefix="flightfeed-worker-", suffix=".log")[1])
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightfeed.cli", "worker", "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": TESTS_DIR},
        )
    _LOGS[proc.pid] = log
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on grpc://" in line or "listening on grpc+tls://" in line, (
        line + log.read_text()
    )
    _LINES[proc.pid] = line
    return proc, line.split("listening on ", 1)[1].split(" ", 1)[0]


def start_line(proc: subprocess.Popen[str]) -> str:
    """The line the worker announced itself with (its location, then its setup)."""
    return _LINES[proc.pid]


def worker_log(proc: subprocess.Popen[str]) -> str:
    """What the worker wrote to its log so far."""
    return _LOGS[proc.pid].read_text()


@contextmanager
def worker_process(*extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A live worker for the block; killed on the way out if still running."""
    proc, location = start_worker(*extra)
    try:
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        _LOGS.pop(proc.pid).unlink(missing_ok=True)
        _LINES.pop(proc.pid, None)


def resident_bytes(pid: int) -> int:
    """The process's resident set size (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def peak_resident_bytes(pid: int) -> int:
    """The most the process's resident set has been since it started (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")
