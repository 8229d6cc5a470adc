"""flightfeed in Spark Declarative Pipelines (flightfeed.spark.pipelines): the work-around that
drops `__python_accumulator__` observed metrics from a Spark Connect client's responses, and the
guard that the private pyspark method it wraps is still there (a pyspark upgrade that renames
it fails here, not in a pipeline run)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.connect.client import SparkConnectClient
from pyspark.sql.connect.client.core import PlanObservedMetrics
from pyspark.sql.metrics import ObservedMetrics
from pyspark.sql.types import LongType, StructField, StructType

from flightfeed.spark.pipelines import (
    CLIENT_RESPONSES,
    PYTHON_ACCUMULATOR_METRICS,
    drop_python_accumulator_metrics,
    register_in_pipeline,
)
from flightfeed.spark.pushdown import FILTER_PUSHDOWN
from flightfeed.spark.source import FlightfeedDataSource, FlightfeedPushdownSource


def test_the_wrapped_pyspark_method_still_exists() -> None:
    method = getattr(SparkConnectClient, CLIENT_RESPONSES, None)
    assert method is not None, f"pyspark's SparkConnectClient has no {CLIENT_RESPONSES}"
    assert inspect.isgeneratorfunction(method)  # the wrapper iterates what it returns
    source = inspect.getsource(method)
    assert PYTHON_ACCUMULATOR_METRICS in source  # still how accumulator updates arrive
    assert "PlanObservedMetrics(" in source
    assert issubclass(PlanObservedMetrics, ObservedMetrics)


SCHEMA = StructType([StructField("id", LongType())])
BATCH = pa.record_batch({"id": [1, 2]})
ACCUMULATORS = PlanObservedMetrics(PYTHON_ACCUMULATOR_METRICS, [], [])
USER_METRICS = PlanObservedMetrics("rows_seen", [], ["n"])


class Client:
    """A Spark Connect client's response stream, as pyspark's yields it, and the calls made."""

    def __init__(self, responses: list[Any]) -> None:
        self.responses = responses
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def _execute_and_fetch_as_iterator(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.calls.append((args, kwargs))
        yield from self.responses


def test_accumulator_metrics_are_dropped_and_everything_else_kept() -> None:
    responses = [SCHEMA, ACCUMULATORS, BATCH, USER_METRICS, {"progress": 1}, ACCUMULATORS]
    client = Client(responses)
    assert drop_python_accumulator_metrics(SimpleNamespace(client=client)) is True
    got = list(client._execute_and_fetch_as_iterator("request", {}, progress=None))
    assert got == [SCHEMA, BATCH, USER_METRICS, {"progress": 1}]
    assert client.calls == [(("request", {}), {"progress": None})]


def test_the_wrapper_is_installed_once() -> None:
    client = Client([ACCUMULATORS, BATCH])
    session = SimpleNamespace(client=client)
    drop_python_accumulator_metrics(session)
    wrapped = client._execute_and_fetch_as_iterator
    assert wrapped.__name__ == CLIENT_RESPONSES
    assert drop_python_accumulator_metrics(session) is True
    assert client._execute_and_fetch_as_iterator is wrapped
    assert list(wrapped()) == [BATCH]
    assert len(client.calls) == 1  # not wrapped twice: one call of the original


@pytest.mark.parametrize(
    "session",
    [
        pytest.param(SimpleNamespace(), id="classic-session"),
        pytest.param(SimpleNamespace(client=SimpleNamespace()), id="client-without-the-method"),
    ],
)
def test_sessions_without_the_method_are_left_alone(session: Any) -> None:
    assert drop_python_accumulator_metrics(session) is False
    assert not hasattr(getattr(session, "client", None), CLIENT_RESPONSES)


class Conf:
    """A pipeline's session config: reading is fine, changing it is forbidden."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def get(self, key: str, default: str) -> str:
        return self.settings.get(key, default)

    def set(self, key: str, value: str) -> None:
        raise AssertionError(f"a pipeline forbids session changes ({key})")


def pipeline_session(settings: dict[str, str]) -> tuple[Any, list[type], Client]:
    registered: list[type] = []
    client = Client([ACCUMULATORS, BATCH])
    session = SimpleNamespace(
        conf=Conf(settings),
        dataSource=SimpleNamespace(register=registered.append),
        client=client,
    )
    return session, registered, client


def test_register_in_pipeline_registers_and_filters(caplog: pytest.LogCaptureFixture) -> None:
    session, registered, client = pipeline_session({FILTER_PUSHDOWN: "true"})
    with caplog.at_level(logging.INFO, logger="flightfeed.spark.pipelines"):
        register_in_pipeline(session)
    assert registered == [FlightfeedPushdownSource]  # the spec turned pushdown on
    assert list(client._execute_and_fetch_as_iterator()) == [BATCH]
    assert caplog.records == []


def test_register_in_pipeline_says_when_pushdown_is_off(caplog: pytest.LogCaptureFixture) -> None:
    session, registered, _ = pipeline_session({})
    with caplog.at_level(logging.INFO, logger="flightfeed.spark.pipelines"):
        register_in_pipeline(session)  # does not try to switch it on (Conf.set would fail)
    assert registered == [FlightfeedDataSource]
    [record] = caplog.records
    assert FILTER_PUSHDOWN in record.getMessage()
    assert "pipeline spec's configuration" in record.getMessage()
