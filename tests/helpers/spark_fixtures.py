"""Spark test fixtures (a pytest plugin, see tests/conftest.py): one real local SparkSession
for the whole run, and a coordinator with the test catalog and local workers, served on an
event loop of its own (Spark's calls block).

Spark's executors are Python worker processes: they read from the workers over loopback gRPC,
as they would across machines.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightfeed.cluster import CoordinatorCluster, serve_in_background
from flightfeed.errors import FlightfeedError
from helpers.spark_catalog import spark_test_catalog, tagging_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] session whose tasks may fail and be retried (up to 4 attempts)."""
    from flightfeed.spark import java_runtime, local_session

    try:
        java_runtime()
    except FlightfeedError as exc:
        if os.environ.get("CI"):
            raise  # CI machines have Java: a missing one is a failure there
        pytest.skip(str(exc))
    session = local_session("flightfeed-tests", master="local[2,4]")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def service() -> Iterator[CoordinatorCluster]:
    """The test catalog on 4 local workers."""
    with serve_in_background(
        spark_test_catalog(), local_workers=4, session_builder=tagging_session
    ) as cluster:
        yield cluster


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_line(proc: subprocess.Popen[str], needle: str, what: str) -> None:
    """Read the process's log until `needle` (it logs to stderr); fail with the log if it dies."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if needle in line:
            return
    raise RuntimeError(f"{what} did not start:\n{''.join(seen[-40:])}")


def _drain(proc: subprocess.Popen[str]) -> None:
    """Keep reading a process's log so it never blocks on a full pipe."""
    assert proc.stderr is not None
    threading.Thread(target=proc.stderr.read, daemon=True).start()


@pytest.fixture(scope="session")
def standalone_master() -> Iterator[str]:
    """A real Spark standalone cluster on localhost: a master and a worker process (2 cores,
    2 GB); yields the master URL. Executors it starts are processes of their own."""
    import pyspark

    from flightfeed.spark import java_runtime

    try:
        java_runtime()
    except FlightfeedError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1"}
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(_free_port())],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    worker: subprocess.Popen[str] | None = None
    try:
        _wait_for_line(master, "I have been elected leader", "the Spark master")
        _drain(master)
        worker = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--cores", "2",
             "--memory", "2g", "--host", "127.0.0.1", "--webui-port", str(_free_port())],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        _wait_for_line(worker, "Successfully registered with master", "the Spark worker")
        _drain(worker)
        yield url
    finally:
        for proc in (worker, master):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
