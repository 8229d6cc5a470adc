"""flightfeed for PySpark (the `spark` extra): read a coordinator's tables, and read and write a
worker's durable tables, as DataFrames.

    from flightfeed.spark import local_session
    spark = local_session()            # or flightfeed.spark.register(your_session)
    df = (spark.read.format("flightfeed").option("uri", uri).option("table", "scan")
          .option("args", '[2, "3,1", "2", "4", "1,1"]').load())
    df.write.format("flightfeed").mode("append").option("uri", worker).option("table", "t").save()
    spark.read.format("flightfeed").option("source", "table").option("uri", worker)
        .option("table", "t").option("partitions", "4").load()

Nothing else in flightfeed imports this package.
"""

try:
    import pyspark  # noqa: F401
    import sqlglot  # noqa: F401
except ImportError as missing:  # say what to install, not only what is missing
    raise ModuleNotFoundError(
        f"flightfeed.spark needs the spark extra: pip install 'flightfeed[spark]' ({missing})",
        name=missing.name,
    ) from missing

from .interrupts import interruptible, plain_interrupts
from .pipelines import register_in_pipeline
from .session import (
    check_python_workers,
    connect_session,
    java_runtime,
    local_session,
    register,
    spark_session,
)
from .source import (
    SOURCE_NAME,
    FlightfeedDataSource,
    FlightfeedPushdownReader,
    FlightfeedPushdownSource,
    FlightfeedReader,
    TableOptions,
)
from .sql import TableCall, catalog_tables, error_message, explain, rewrite, sql
from .writer import (
    FlightfeedStreamTableWriter,
    FlightfeedTableWriter,
    TableCommitMessage,
    TableWriteRefused,
    stream_job,
)

__all__ = [
    "SOURCE_NAME",
    "FlightfeedDataSource",
    "FlightfeedPushdownReader",
    "FlightfeedPushdownSource",
    "FlightfeedReader",
    "FlightfeedStreamTableWriter",
    "FlightfeedTableWriter",
    "TableCall",
    "TableCommitMessage",
    "TableOptions",
    "TableWriteRefused",
    "catalog_tables",
    "check_python_workers",
    "connect_session",
    "error_message",
    "explain",
    "interruptible",
    "java_runtime",
    "local_session",
    "plain_interrupts",
    "register",
    "register_in_pipeline",
    "rewrite",
    "spark_session",
    "sql",
    "stream_job",
]
