"""The streaming table: the seeds' chunk scan, read as a stream from the flightfeed coordinator
at `flightfeed.uri` (the spec's configuration). Each pipeline run appends the units discovered
since the previous run; `awaitFeedEnd` lets a run wait (up to 120 s) for a finite feed to be
discovered whole before it reads."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame

from flightfeed.spark import register_in_pipeline

# `spark` is the pipeline's session: spark-pipelines defines it before this file runs.
register_in_pipeline(spark)


@dp.table(comment="One row per row of each chunk the scan's providers discovered")
def chunk_rows() -> DataFrame:
    return (
        spark.readStream.format("flightfeed")
        .option("uri", spark.conf.get("flightfeed.uri"))
        .option("table", "scan")
        .option("args", spark.conf.get("flightfeed.scan.args"))
        .option("awaitFeedEnd", "120")
        .load()
    )
