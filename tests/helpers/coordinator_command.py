"""A `flightfeed coordinator` process serving the seeds' chunk scan, as a user starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def coordinator_command(*extra: str) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """`flightfeed coordinator --port 0 --tables flightfeed.examples.chunk_scan:catalog
    *extra` for the block: the process (stdout and stderr piped), its location and the line
    that announced it. Stopped with SIGTERM on the way out, killed if that does not end it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightfeed.cli", "coordinator", "--port", "0",
         "--tables", "flightfeed.examples.chunk_scan:catalog", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on grpc" in line, line + (proc.stderr.read() if proc.stderr else "")
        yield proc, line.split("listening on ", 1)[1].split(" ", 1)[0], line
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
