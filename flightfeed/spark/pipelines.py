"""flightfeed in Spark Declarative Pipelines (`spark-pipelines run`).

A transformation file calls `register_in_pipeline(spark)` instead of `register(spark)`:

- a pipeline forbids session changes in its transformation files, so filter pushdown is
  neither probed nor switched on here (`register` does both: see `pushdown.py`): every filter
  runs in Spark unless `spark.sql.python.filterPushdown.enabled: "true"` in the spec's
  `configuration` asks for them on the workers. On a Spark that reuses a pushed read (4.3.0
  does), a DataFrame must then not be queried again without its filter;
- it works around a pyspark bug (seen in 4.3.0, with any Python data source or UDF, not only
  flightfeed's): the Spark Connect server appends its Python workers' accumulator updates to
  the pipeline run's response as observed metrics named `__python_accumulator__`, and the
  `spark-pipelines` command, which expects only pipeline events there, fails with
  UNKNOWN_RESPONSE after the run COMPLETED. The pipeline's session drops those metrics (their
  only use, the UDF profiler, has read them by then). The work-around reaches into pyspark's
  Connect client (`_execute_and_fetch_as_iterator`, checked by tests/unit/spark); where the
  name is gone it does nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, Final

from pyspark.sql.metrics import ObservedMetrics

from .pushdown import FILTER_PUSHDOWN, pushdown_enabled
from .source import FlightfeedDataSource, FlightfeedPushdownSource

PYTHON_ACCUMULATOR_METRICS: Final = "__python_accumulator__"
CLIENT_RESPONSES: Final = "_execute_and_fetch_as_iterator"
"""The private method of pyspark's SparkConnectClient that yields a call's responses."""

log = logging.getLogger(__name__)


def register_in_pipeline(spark: Any) -> None:
    """Register the `flightfeed` data source in a pipeline's transformation file: the one that
    pushes filters if the spec turned pushdown on, the plain one otherwise."""
    if pushdown_enabled(spark):
        spark.dataSource.register(FlightfeedPushdownSource)
    else:
        spark.dataSource.register(FlightfeedDataSource)
        log.info(
            "%s is off: filters on flightfeed tables run in Spark (the pipeline spec's"
            " configuration can push them to the workers: see flightfeed.spark.pipelines)",
            FILTER_PUSHDOWN,
        )
    drop_python_accumulator_metrics(spark)


def drop_python_accumulator_metrics(spark: Any) -> bool:
    """Make a Spark Connect session's responses skip `__python_accumulator__` metrics (see the
    module docstring); False where the session has no such client method to wrap."""
    client = getattr(spark, "client", None)
    responses = getattr(client, CLIENT_RESPONSES, None)
    if responses is None or getattr(responses, "_flightfeed_filtered", False):
        return responses is not None
    setattr(client, CLIENT_RESPONSES, _without_accumulator_metrics(responses))
    return True


def _without_accumulator_metrics(responses: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    @functools.wraps(responses)
    def filtered(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for response in responses(*args, **kwargs):
            if not _accumulator_metrics(response):
                yield response

    filtered._flightfeed_filtered = True  # type: ignore[attr-defined]
    return filtered


def _accumulator_metrics(response: object) -> bool:
    return isinstance(response, ObservedMetrics) and response.name == PYTHON_ACCUMULATOR_METRICS


__all__ = ["drop_python_accumulator_metrics", "register_in_pipeline"]
