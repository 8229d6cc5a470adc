"""The seeds' chunk scan as a Spark Structured Streaming query.

The coordinator's provider discovers the chunks over time (`--chunk-delay` seconds each); a
streaming query reads the flightfeed table `scan` with a processing-time trigger, so each
micro-batch holds the chunks discovered since the previous one. When every chunk was
discovered and processed, the program prints the micro-batches, the rows per task, and whether
they match the same scan run in one process.

    python examples/streaming_scan.py
    python examples/streaming_scan.py --master spark://host:7077 --chunk-delay 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid

from flightfeed.cli_types import non_negative_seconds, positive_count

SEED_ARGUMENTS = '[2, "3,1", "2", "4", "1,1"]'


def json_list(text: str) -> list[object]:
    """The scan's arguments: a JSON list, or the parser's one-line error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"not a JSON list: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--args", type=json_list, default=SEED_ARGUMENTS, help="scan's arguments, a JSON list"
    )
    parser.add_argument(
        "--chunk-delay", type=non_negative_seconds, default=1.0, help="seconds per chunk (1)"
    )
    parser.add_argument("--trigger", default="1 second", help="processing-time trigger")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="Spark master URL (default local[2])")
    where.add_argument("--remote", help="Spark Connect server, sc://host:port")
    parser.add_argument(
        "--workers", type=positive_count, default=2, help="local flightfeed workers (2)"
    )
    args = parser.parse_args(argv)
    arguments = args.args

    from flightfeed.cluster import serve_in_background
    from flightfeed.coordinator import table_command
    from flightfeed.examples.chunk_scan import catalog, scan_rows
    from flightfeed.spark import client, error_message, spark_session

    with serve_in_background(catalog(args.chunk_delay), local_workers=args.workers) as cluster:
        spark = spark_session(
            "streaming_scan", master=args.master, remote=args.remote, ctrl_c="plain"
        )
        sink = f"scan_{uuid.uuid4().hex}"
        try:
            rows = (
                spark.readStream.format("flightfeed")
                .option("uri", cluster.location)
                .option("table", "scan")
                .option("args", json.dumps(arguments))
                .load()
            )
            with tempfile.TemporaryDirectory() as checkpoint:
                query = (
                    rows.writeStream.format("memory")
                    .queryName(sink)
                    .option("checkpointLocation", checkpoint)
                    .trigger(processingTime=args.trigger)
                    .start()
                )
                # Until the provider discovered every chunk, then until Spark read them all.
                # (Opening the stream is idempotent: the query opens the same one.)
                opened = client.stream_action(
                    cluster.location, "stream_open", table_command("scan", arguments), {}
                )
                wait = json.dumps({"stream": opened["stream"], "timeout": 120}).encode()
                client.stream_action(cluster.location, "stream_wait", wait, {}, timeout=180)
                query.processAllAvailable()
                batches = [
                    (p["batchId"], p["numInputRows"])
                    for p in query.recentProgress
                    if p["numInputRows"]
                ]
                query.stop()
            counts = spark.sql(
                f"SELECT task, count(*) AS cnt FROM {sink} GROUP BY task ORDER BY task"
            ).collect()
        except Exception as exc:
            print(f"error: {error_message(exc)}", file=sys.stderr)
            return 1
        finally:
            spark.stop()
    for batch, count in batches:
        print(f"micro-batch {batch}: {count} rows")
    for row in counts:
        print(f"task {row.task}: {row.cnt} rows")
    expected = scan_rows(*arguments).group_by("task").aggregate([("task", "count")])
    reference = sorted(expected.to_pylist(), key=lambda row: row["task"])
    same = [(row.task, row.cnt) for row in counts] == [
        (row["task"], row["task_count"]) for row in reference
    ]
    print(f"matches the one-process run: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: the session and the cluster were stopped on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
