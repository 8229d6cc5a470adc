"""The same code on a real Spark standalone cluster (a master and a worker process on
localhost): the seeds' example program (also through a Spark Connect server on the cluster)
and a streaming query, whose executors, processes of their own, read from the flightfeed
workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.spark_fixtures import ConnectServer

ROOT = Path(__file__).resolve().parents[2]
SEED_SQL = (
    "SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task ORDER BY task"
)


def run_example(*args: str, script: str = "work_unit_feed.py") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def table_rows(output: str) -> list[list[str]]:
    """The rows of the table Spark's DataFrame.show printed."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_the_seed_query_on_a_standalone_cluster(standalone_master: str) -> None:
    done = run_example(SEED_SQL, "--master", standalone_master)
    assert done.returncode == 0, done.stderr[-3000:]
    assert table_rows(done.stdout) == [["6", "0"], ["6", "1"]]


def test_every_row_on_a_standalone_cluster(standalone_master: str) -> None:
    query = "SELECT * FROM scan(2, '3,1', '2', '4', '1,1') ORDER BY task, partition"
    done = run_example(query, "--master", standalone_master)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = [["0", "0"]] * 4 + [["0", "1"]] * 2 + [["1", "0"]] * 4 + [["1", "1"]] * 2
    assert table_rows(done.stdout) == expected


def test_the_example_reports_invalid_arguments_as_the_reference_does() -> None:
    done = run_example("SELECT * FROM scan(2, '3,1', '2', '4')")
    assert done.returncode == 1
    assert "partition count (3) must be a non-zero multiple of task_count (2)" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_seed_query_through_spark_connect(connect_server: ConnectServer) -> None:
    """A Spark Connect session: `register` works there too, and the server's executors (on the
    cluster) read the scan."""
    done = run_example(SEED_SQL, "--remote", connect_server.url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert table_rows(done.stdout) == [["6", "0"], ["6", "1"]]


def test_a_streaming_query_on_a_standalone_cluster(standalone_master: str) -> None:
    """examples/streaming_scan.py: chunks discovered over two seconds, read by a Structured
    Streaming query whose executors run on the cluster; every row arrives exactly once."""
    done = run_example(
        "--chunk-delay", "1", "--master", standalone_master, script="streaming_scan.py"
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "task 0: 6 rows\ntask 1: 6 rows\nmatches the one-process run: yes" in done.stdout
    batches = [line for line in done.stdout.splitlines() if line.startswith("micro-batch")]
    assert sum(int(line.split(": ")[1].split()[0]) for line in batches) == 12
