"""The seeds' work_unit_feed example, end to end on Spark.

`scan(task_count, 'chunks_p0', 'chunks_p1', ...)` is a table whose rows come from chunks that
a provider on the coordinator discovers while the query runs; workers turn each chunk of n
rows into n rows (task, partition). This program starts an embedded coordinator with local
workers, and runs the SQL on Spark (local mode, a cluster with --master, or a Spark Connect
server with --remote), which reads the scan in parallel, one Spark partition per flightfeed
partition, straight from the workers.

    python examples/work_unit_feed.py "SELECT count(*) AS cnt, task
        FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task ORDER BY task"
    python examples/work_unit_feed.py --show-distributed-plan "SELECT *
        FROM scan(2, '3,1', '2', '4', '1,1') ORDER BY task, partition"
"""

from __future__ import annotations

import argparse
import sys

from flightfeed.cli_types import positive_count
from flightfeed.cluster import serve_in_background
from flightfeed.examples.chunk_scan import catalog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("query", help="the SQL query to run")
    parser.add_argument(
        "--show-distributed-plan",
        action="store_true",
        help="show Spark's plan and flightfeed's stages, tasks and workers instead of running it",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="Spark master URL (default local[2])")
    where.add_argument("--remote", help="Spark Connect server, sc://host:port")
    parser.add_argument(
        "--workers", type=positive_count, default=4, help="local flightfeed workers (4)"
    )
    args = parser.parse_args(argv)

    from flightfeed.spark import error_message, explain, interruptible, spark_session, sql

    with serve_in_background(catalog(), local_workers=args.workers) as cluster:
        spark = spark_session(
            "work_unit_feed", master=args.master, remote=args.remote, ctrl_c="plain"
        )
        try:
            df = interruptible(spark, lambda: sql(spark, cluster.location, args.query))
            if args.show_distributed_plan:
                interruptible(spark, lambda: df.explain(mode="formatted"))
                print(explain(cluster.location, args.query))
            else:
                interruptible(spark, lambda: df.show(n=1000, truncate=False))
        except Exception as exc:
            print(f"error: {error_message(exc)}", file=sys.stderr)
            return 1
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: the session and the cluster were stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
