"""Getting Spark ready for flightfeed: register the data source, and say clearly what is missing
(a Java runtime, flightfeed in the Python that Spark's workers run).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pyarrow as pa

from .._version import __version__
from ..errors import FlightfeedError, InvalidArgument
from .interrupts import held_interrupts, on_a_thread, plain_interrupts
from .pushdown import filters_stay_with_their_query, turn_pushdown_on
from .source import FlightfeedDataSource, FlightfeedPushdownSource

CtrlC = Literal["pyspark", "plain"]
"""What Ctrl-C does once a classic session started: PySpark's handler (cancel the jobs; right in
a notebook), or a plain KeyboardInterrupt (`plain_interrupts`; right in a script)."""

LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

log = logging.getLogger(__name__)


def register(
    spark: Any, *, check_workers: bool = True, filter_pushdown: bool | None = None
) -> None:
    """Register the `flightfeed` data source on a session (classic or Spark Connect), after
    checking that Spark's Python workers run this flightfeed.

    `filter_pushdown`: whether Spark's filters run on the workers. None (the default) pushes
    them where this Spark keeps a pushed read to the query that pushed it, and leaves them to
    Spark where a later query of the same DataFrame would reuse it and get wrong rows (Spark
    4.3.0 does: see `pushdown.py`); finding out takes two small queries, once. True pushes them
    whatever Spark does (then never query a DataFrame again without its filter); False never."""
    if check_workers:
        check_python_workers(spark)
    if filter_pushdown is None:
        filter_pushdown = filters_stay_with_their_query(spark)
        if not filter_pushdown:
            log.debug(
                "Spark runs filters on flightfeed reads itself: this Spark reuses a pushed"
                " filter in later queries of the same DataFrame"
            )
    if filter_pushdown:
        spark.dataSource.register(FlightfeedPushdownSource)
        turn_pushdown_on(spark)
    else:
        spark.dataSource.register(FlightfeedDataSource)


def _worker_version(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark Python worker: unpickling it imports flightfeed there (or fails)."""
    for _ in batches:
        yield pa.record_batch({"version": pa.array([__version__])})


def check_python_workers(spark: Any) -> None:
    """FlightfeedError unless Spark's Python workers run this flightfeed version."""
    try:
        rows = spark.range(1, numPartitions=1).mapInArrow(_worker_version, "version string")
        versions = {row.version for row in rows.collect()}
    except Exception as exc:
        text = str(exc)
        if "No module named 'flightfeed'" in text or "ModuleNotFoundError" in text:
            python = os.environ.get("PYSPARK_PYTHON") or "the default python3"
            raise FlightfeedError(
                f"Spark's Python workers cannot import flightfeed (PYSPARK_PYTHON={python}):"
                " install flightfeed[spark] in that interpreter, or set PYSPARK_PYTHON to one"
                f" that has it (this driver runs {sys.executable})"
            ) from None
        raise
    if versions != {__version__}:
        raise FlightfeedError(
            f"Spark's Python workers run flightfeed {sorted(versions)}, this driver runs"
            f" {__version__}: install the same version everywhere"
        )


def java_runtime() -> str:
    """The Java Spark will start, or FlightfeedError saying how to get one."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise FlightfeedError(f"JAVA_HOME={java_home} has no bin/java: point it at a JDK 17+")
    found = shutil.which("java")
    if found is None:
        raise FlightfeedError(
            "Spark needs a Java runtime (JDK 17 or newer) and none was found: install one"
            " (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def local_session(
    app_name: str = "flightfeed",
    master: str = "local[2]",
    *,
    ctrl_c: CtrlC = "pyspark",
    **conf: str,
) -> Any:
    """A SparkSession ready for flightfeed: a local one by default, or `master` (a cluster
    URL); Spark's Python workers run this interpreter unless PYSPARK_PYTHON says otherwise.
    `ctrl_c="plain"`: a Ctrl-C during the start (the JVM, the check of Spark's Python workers:
    a few seconds) stops the session once it is up and raises KeyboardInterrupt; after the
    start, `plain_interrupts()`."""
    if ctrl_c not in ("pyspark", "plain"):
        raise InvalidArgument(f"ctrl_c must be 'pyspark' or 'plain', not {ctrl_c!r}")
    java_runtime()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {**LOCAL_DEFAULTS, **conf}.items():
        builder = builder.config(key, value)
    if ctrl_c == "pyspark":
        spark = builder.getOrCreate()
        register(spark)
        return spark
    with held_interrupts() as interrupted:
        spark = on_a_thread(builder.getOrCreate, "flightfeed-spark-start")
        try:
            on_a_thread(lambda: register(spark), "flightfeed-spark-check")
        except BaseException:
            if not interrupted:
                raise
        if interrupted:  # the session is up (its JVM would outlive us): stop it
            spark.stop()
            raise KeyboardInterrupt
    plain_interrupts()
    return spark


def connect_session(remote: str, app_name: str = "flightfeed") -> Any:
    """A Spark Connect session (`sc://host:port`) ready for flightfeed. The server's Python
    workers must import flightfeed: `register` checks that they do."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    register(spark)
    return spark


def spark_session(
    app_name: str,
    *,
    master: str | None = None,
    remote: str | None = None,
    ctrl_c: CtrlC = "pyspark",
) -> Any:
    """A session for `master` (local[2] if neither is given) or, over Spark Connect, `remote`
    (whose client leaves Ctrl-C alone: `ctrl_c` is for a classic session)."""
    if master and remote:
        raise InvalidArgument("give a Spark master or a Spark Connect remote, not both")
    if remote:
        return connect_session(remote, app_name)
    return local_session(app_name, master=master or "local[2]", ctrl_c=ctrl_c)
