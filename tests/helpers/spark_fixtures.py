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
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal

from flightfeed.cluster import CoordinatorCluster, serve_in_background
from flightfeed.errors import FlightfeedError
from flightfeed.worker import Worker, WorkerConfig
from helpers.spark_catalog import spark_test_catalog, tagging_session


def require_java() -> None:
    """Skip without a Java runtime, except on CI, whose machines have one."""
    from flightfeed.spark import java_runtime

    try:
        java_runtime()
    except FlightfeedError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def spark_env() -> dict[str, str]:
    """The environment for Spark's own programs: SPARK_HOME is the installed pyspark package,
    and Spark's Python workers run this interpreter."""
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": os.path.dirname(pyspark.__file__),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] session whose tasks may fail and be retried (up to 4 attempts)."""
    from flightfeed.spark import local_session

    require_java()
    session = local_session("flightfeed-tests", master="local[2,4]")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_keeps_pushed_reads_apart(spark: Any) -> bool:
    """What `register` found out about this Spark (see flightfeed.spark.pushdown)."""
    from flightfeed.spark.pushdown import filters_stay_with_their_query

    return filters_stay_with_their_query(spark)


@contextmanager
def filters_pushed(spark: Any, keeps_pushed_reads_apart: bool) -> Iterator[None]:
    """Filters on flightfeed reads pushed to the workers for the block, whatever `register`
    chose for this Spark; the session is as `register` left it after."""
    from flightfeed.spark import register
    from flightfeed.spark.pushdown import FILTER_PUSHDOWN, session_setting

    with session_setting(spark, FILTER_PUSHDOWN, "true"):
        register(spark, check_workers=False, filter_pushdown=True)
        try:
            yield
        finally:
            register(spark, check_workers=False, filter_pushdown=keeps_pushed_reads_apart)


@pytest.fixture(scope="session")
def service() -> Iterator[CoordinatorCluster]:
    """The test catalog on 4 local workers."""
    with serve_in_background(
        spark_test_catalog(), local_workers=4, session_builder=tagging_session
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def table_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A worker holding durable tables (in a data directory of its own), served in this
    process on an event loop of its own, on a free port: its store is
    `worker.state.tables.store` (read it in process: a second DuckDB connection to the file
    would find it locked)."""
    with worker_in_background(
        WorkerConfig(data_dir=str(tmp_path_factory.mktemp("table-worker")))
    ) as worker:
        yield worker


@contextmanager
def worker_in_background(config: WorkerConfig) -> Iterator[Worker]:
    """A worker served in this process on an event loop of its own, on a free port."""

    @asynccontextmanager
    async def serving() -> AsyncIterator[Worker]:
        # Made on the loop that serves it: its grpclib server keeps the loop current when made.
        async with Worker(config=config) as worker:
            yield worker

    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(serving()) as worker,
    ):
        yield worker


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
    """A real Spark standalone cluster on localhost: a master and a worker process (4 cores,
    4 GB: room for the Spark Connect server's executor and one application's); yields the
    master URL. Executors it starts are processes of their own."""
    require_java()
    env = spark_env()
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
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
            [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--cores", "4",
             "--memory", "4g", "--host", "127.0.0.1", "--webui-port", str(_free_port())],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        _wait_for_line(worker, "Successfully registered with master", "the Spark worker")
        _drain(worker)
        yield url
    finally:
        _stop(worker, master)


def _stop(*procs: subprocess.Popen[str] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass(frozen=True)
class ConnectServer:
    """A Spark Connect server whose applications run on the standalone cluster."""

    url: str
    warehouse: Path


@pytest.fixture(scope="session")
def connect_server(
    standalone_master: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectServer]:
    """A Spark Connect server (its driver a process of its own) on the standalone cluster,
    holding 2 of its 4 cores; tables it writes go under `warehouse`."""
    home = tmp_path_factory.mktemp("connect")
    warehouse = home / "warehouse"
    env = spark_env()
    port = _free_port()
    server = subprocess.Popen(
        [os.path.join(env["SPARK_HOME"], "bin", "spark-submit"),
         "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
         "--master", standalone_master, "--conf", "spark.cores.max=2",
         "--conf", f"spark.connect.grpc.binding.port={port}",
         "--conf", f"spark.sql.warehouse.dir={warehouse}", "--conf", "spark.ui.enabled=false"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=home,
    )  # fmt: skip
    try:
        _wait_for_line(server, "Spark Connect server started", "the Spark Connect server")
        _drain(server)
        yield ConnectServer(f"sc://127.0.0.1:{port}", warehouse)
    finally:
        _stop(server)
