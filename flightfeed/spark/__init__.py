"""flightfeed for PySpark (the `spark` extra): read a coordinator's tables as DataFrames.

    from flightfeed.spark import local_session
    spark = local_session()            # or flightfeed.spark.register(your_session)
    df = (spark.read.format("flightfeed").option("uri", uri).option("table", "scan")
          .option("args", '[2, "3,1", "2", "4", "1,1"]').load())

Nothing else in flightfeed imports this package.
"""

from .session import check_python_workers, java_runtime, local_session, register
from .source import SOURCE_NAME, FlightfeedDataSource, FlightfeedReader, TableOptions
from .sql import TableCall, catalog_tables, error_message, explain, rewrite, sql

__all__ = [
    "SOURCE_NAME",
    "FlightfeedDataSource",
    "FlightfeedReader",
    "TableCall",
    "TableOptions",
    "catalog_tables",
    "check_python_workers",
    "error_message",
    "explain",
    "java_runtime",
    "local_session",
    "register",
    "rewrite",
    "sql",
]
