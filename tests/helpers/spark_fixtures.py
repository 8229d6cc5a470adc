"""Spark test fixtures (a pytest plugin, see tests/conftest.py): one real local SparkSession
for the whole run, and a coordinator with the test catalog and local workers, served on an
event loop of its own (Spark's calls block).

Spark's executors are Python worker processes: they read from the workers over loopback gRPC,
as they would across machines.
"""

from __future__ import annotations

import os
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
