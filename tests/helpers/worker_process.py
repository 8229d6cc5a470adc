"""A `flightfeed worker` process, as a user starts it, for tests that need a live worker in
another process (hostile input, resource limits): its location and its resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parents[1])


def start_worker(*extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start `flightfeed worker --port 0 ...`; the process and its grpc:// location."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightfeed.cli", "worker", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": TESTS_DIR},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on grpc://" in line, line + (proc.stderr.read() if proc.stderr else "")
    return proc, line.rsplit(" ", 1)[1].strip()


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


def resident_bytes(pid: int) -> int:
    """The process's resident set size (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
