"""ParquetScan over real Parquet files: every row read once whatever the partitions and tasks,
projection and filter pushed into the reader, answers equal to DuckDB reading the same files,
and a codec that decodes only files under its roots."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flightfeed.errors import InvalidArgument, PlanDecodeError, UnknownUdfError
from flightfeed.plan import (
    BUILTINS,
    CodecRegistry,
    ExecutionPlan,
    ParquetScan,
    ParquetScanCodec,
    agg,
    call,
    col,
    collect,
    decode_plan,
    encode_plan,
    lit,
    open_task_context,
    plan_from,
)
from flightfeed.plan.nodes.parquet_scan import RowGroups
from flightfeed.session import Session

from .helpers import run, sorted_rows

ROW_GROUPS = {"a.parquet": (300, 100), "b.parquet": (50, 50), "c.parquet": (420, 70)}
"""File → (rows, row group size): 3 + 1 + 6 = 10 row groups."""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    rng = np.random.default_rng(7)
    start = 0
    for name, (rows, group) in ROW_GROUPS.items():
        table = pa.table(
            {
                "id": pa.array(range(start, start + rows), pa.int64()),
                "k": pa.array(rng.integers(0, 9, rows), pa.int64()),
                "x": pa.array(rng.normal(size=rows)),
                "s": pa.array([f"s{i % 5}" for i in range(rows)]),
            }
        )
        pq.write_table(table, root / name, row_group_size=group)
        start += rows
    return root


def duck(data_dir: Path, sql: str) -> pa.Table:
    connection = duckdb.connect()
    connection.sql(f"CREATE VIEW t AS SELECT * FROM read_parquet('{data_dir}/*.parquet')")
    return connection.sql(sql).to_arrow_table()


async def run_tasks(scan: ParquetScan) -> pa.Table:
    """Every task's partitions, each task in its own context, as the workers would."""
    tables = []
    for task in range(scan.task_count):
        async with open_task_context(
            Session(), task_number=task, task_count=scan.task_count
        ) as ctx:
            tables.append(await collect(scan, ctx))
    return pa.concat_tables(tables)


@pytest.mark.parametrize("partitions", [1, 2, 5, 10])
def test_every_row_is_read_once_over_any_partitions(data_dir: Path, partitions: int) -> None:
    scan = ParquetScan.from_paths(str(data_dir), partitions=partitions)
    assert scan.output_partitions == partitions
    groups = [(f.path, g) for part in scan.partitions for f in part for g in f.row_groups]
    assert len(groups) == len(set(groups)) == 10
    got = anyio.run(run, scan)
    assert sorted_rows(got) == sorted_rows(duck(data_dir, "SELECT * FROM t"))


@pytest.mark.parametrize("tasks", [1, 2, 3, 6])
def test_tasks_share_the_partitions(data_dir: Path, tasks: int) -> None:
    scan = ParquetScan.from_paths(str(data_dir), partitions=6).for_tasks(tasks)
    assert scan.output_partitions == 6 // tasks
    got = anyio.run(run_tasks, scan)
    assert sorted(got.column("id").to_pylist()) == list(range(770))


def test_default_partitions_are_row_groups_at_most_twelve(data_dir: Path) -> None:
    assert ParquetScan.from_paths(str(data_dir)).output_partitions == 10
    one_file = ParquetScan.from_paths(str(data_dir / "b.parquet"))
    assert one_file.output_partitions == 1


def test_projection_and_filter_are_pushed_into_the_reader(data_dir: Path) -> None:
    predicate = call("and", call("greater", col("k"), lit(5)), call("equal", col("s"), lit("s1")))
    scan = ParquetScan.from_paths(
        str(data_dir), partitions=4, columns=["id", "x"], filter=predicate
    )
    assert scan.schema.names == ["id", "x"]
    got = anyio.run(run, scan)
    expected = duck(data_dir, "SELECT id, x FROM t WHERE k > 5 AND s = 's1'")
    assert got.num_rows == expected.num_rows > 0
    assert sorted_rows(got) == sorted_rows(expected)


def test_functions_with_options_and_keyword_names_are_pushed(data_dir: Path) -> None:
    predicate = call(
        "or",
        call("is_in", col("k"), options=pc.SetLookupOptions(pa.array([1, 3], pa.int64()))),
        call("equal", col("s"), lit("s4")),
    )
    scan = ParquetScan.from_paths(str(data_dir), partitions=3, columns=["id"], filter=predicate)
    got = anyio.run(run, scan)
    expected = duck(data_dir, "SELECT id FROM t WHERE k IN (1, 3) OR s = 's4'")
    assert sorted_rows(got) == sorted_rows(expected)


def test_a_file_not_as_the_plan_says_is_a_clear_error(data_dir: Path, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64())])
    missing = ParquetScan(schema, [[RowGroups(str(tmp_path / "gone.parquet"), (0,))]])
    with pytest.raises(InvalidArgument, match=r"ParquetScan cannot read .*gone.parquet"):
        anyio.run(run, missing)
    no_such_group = ParquetScan(schema, [[RowGroups(str(data_dir / "b.parquet"), (7,))]])
    with pytest.raises(InvalidArgument, match="row group 7"):
        anyio.run(run, no_such_group)


def test_an_aggregate_over_the_scan_answers_as_duckdb(data_dir: Path) -> None:
    built = (
        plan_from(ParquetScan.from_paths(str(data_dir), partitions=5))
        .aggregate(["k"], [agg("sum", col("x"), name="sx"), agg("count", name="n")])
        .sort("k")
    )
    got = anyio.run(run, built.plan)
    expected = duck(data_dir, "SELECT k, sum(x) AS sx, count(*) AS n FROM t GROUP BY k ORDER BY k")
    assert got.column("k").to_pylist() == expected.column("k").to_pylist()
    assert got.column("n").to_pylist() == expected.column("n").to_pylist()
    assert np.allclose(got.column("sx").to_numpy(), expected.column("sx").to_numpy())


def test_bad_arguments_fail_clearly(data_dir: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"no column\(s\) \['nope'\]"):
        ParquetScan.from_paths(str(data_dir), columns=["nope"])
    with pytest.raises(InvalidArgument, match="must be boolean"):
        ParquetScan.from_paths(str(data_dir), filter=col("k"))
    with pytest.raises(UnknownUdfError, match="my_udf"):
        ParquetScan.from_paths(str(data_dir), filter=call("my_udf", col("k")))
    with pytest.raises(InvalidArgument, match="cannot be split into 4 tasks"):
        ParquetScan.from_paths(str(data_dir), partitions=6).for_tasks(4)


def roundtrip(plan: ExecutionPlan, codec: ParquetScanCodec) -> ExecutionPlan:
    data = encode_plan(plan, CodecRegistry.builtin().with_codec(ParquetScanCodec()))
    return decode_plan(data, CodecRegistry.builtin().with_codec(codec), BUILTINS)


def test_the_codec_round_trips_under_its_roots(data_dir: Path) -> None:
    predicate = call("less", col("id"), lit(100))
    scan = ParquetScan.from_paths(str(data_dir), partitions=2, columns=["id"], filter=predicate)
    decoded = roundtrip(scan.for_tasks(2), ParquetScanCodec([data_dir]))
    assert isinstance(decoded, ParquetScan)
    assert (decoded.task_count, decoded.output_partitions) == (2, 1)
    assert decoded.columns == ("id",)
    assert decoded.filter == predicate
    assert anyio.run(run_tasks, decoded).column("id").to_pylist() == list(range(100))


def test_the_codec_reads_nothing_outside_its_roots(data_dir: Path, tmp_path: Path) -> None:
    scan = ParquetScan.from_paths(str(data_dir))
    with pytest.raises(PlanDecodeError, match="reads no Parquet files: start it with"):
        roundtrip(scan, ParquetScanCodec())
    elsewhere = tmp_path / "allowed"
    elsewhere.mkdir()
    with pytest.raises(PlanDecodeError, match="outside this worker's roots"):
        roundtrip(scan, ParquetScanCodec([elsewhere]))
    # `..` is resolved when decoding; a symbolic link when the files are opened (off the loop)
    os.symlink(data_dir / "a.parquet", elsewhere / "link.parquet")
    linked = roundtrip(
        ParquetScan.from_paths(str(elsewhere / "link.parquet")), ParquetScanCodec([elsewhere])
    )
    with pytest.raises(InvalidArgument, match="leads outside this worker's roots"):
        anyio.run(run, linked)
    with pytest.raises(ValueError, match="must be absolute"):
        ParquetScanCodec(["relative/dir"])
    climbing = os.path.join(elsewhere, os.path.relpath(data_dir / "a.parquet", elsewhere))
    assert "/../" in climbing
    dotted = ParquetScan.from_paths(climbing)
    with pytest.raises(PlanDecodeError, match="outside"):
        roundtrip(dotted, ParquetScanCodec([elsewhere]))


@pytest.fixture(scope="module")
def unlike_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files that disagree on layout: columns in another order, a narrower type, a column
    missing, and a value that needs the first file's wider type."""
    root = tmp_path_factory.mktemp("unlike")
    int32 = pa.int32()
    pq.write_table(pa.table({"k": [1, 2], "v": [10, 20], "s": ["a", "b"]}), root / "1.parquet")
    pq.write_table(
        pa.table({"v": pa.array([30, 40], int32), "s": ["c", "d"], "k": [3, 4]}), root / "2.parquet"
    )
    pq.write_table(pa.table({"s": ["e"], "k": [5]}), root / "3.parquet")
    pq.write_table(pa.table({"k": [6], "s": ["f"], "v": [2**40]}), root / "4.parquet")
    return root


@pytest.mark.parametrize("partitions", [1, 2, 3, 4])
def test_files_are_read_as_the_first_ones_schema_however_split(
    unlike_files: Path, partitions: int
) -> None:
    """Each partition used to be read as its own first file's schema: reordered columns failed
    with INTERNAL, and a narrower type in a partition's first file refused the values of the
    wider files after it, all depending on how the files were split."""
    scan = ParquetScan.from_paths(str(unlike_files), partitions=partitions)
    expected = duckdb.sql(
        f"SELECT k, v, s FROM read_parquet('{unlike_files}/*.parquet', union_by_name=true)"
    ).to_arrow_table()
    got = anyio.run(run, scan)
    assert got.schema == pq.read_schema(unlike_files / "1.parquet")
    assert sorted_rows(got) == sorted_rows(expected)
    projected = ParquetScan.from_paths(
        str(unlike_files),
        partitions=partitions,
        columns=["s"],
        filter=call("greater", col("v"), lit(15)),
    )
    got = anyio.run(run, roundtrip(projected, ParquetScanCodec([unlike_files])))
    assert sorted(got.column("s").to_pylist()) == ["b", "c", "d", "f"]


def test_a_value_the_plans_type_cannot_hold_fails_naming_the_file(tmp_path: Path) -> None:
    narrow = pa.table({"v": pa.array([1], pa.int32())})
    pq.write_table(narrow, tmp_path / "1.parquet")
    pq.write_table(pa.table({"v": [2**40]}), tmp_path / "2.parquet")
    for partitions in (1, 2):
        scan = ParquetScan.from_paths(str(tmp_path), partitions=partitions)
        with pytest.raises(InvalidArgument, match=r"cannot read \[.*2\.parquet'\]: .*not in range"):
            anyio.run(run, scan)


def test_relative_paths_are_planned_absolute(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(data_dir)
    for paths in ("b.parquet", ["b.parquet", "a.parquet"]):
        scan = ParquetScan.from_paths(paths)
        assert {f.path for part in scan.partitions for f in part} <= {
            str(data_dir / "a.parquet"),
            str(data_dir / "b.parquet"),
        }
        decoded = roundtrip(scan, ParquetScanCodec([data_dir]))
        assert anyio.run(run, decoded).num_rows == (50 if paths == "b.parquet" else 350)


def test_a_file_schema_must_hold_the_output_columns(data_dir: Path) -> None:
    files = [[RowGroups(str(data_dir / "b.parquet"), (0,))]]
    read_as = pa.schema([("id", pa.int64()), ("s", pa.string())])
    with pytest.raises(InvalidArgument, match=r"output column 'id' \(int32\) is not one column"):
        ParquetScan(pa.schema([("id", pa.int32())]), files, file_schema=read_as)
    with pytest.raises(InvalidArgument, match="output column 'k'"):
        ParquetScan(pa.schema([("k", pa.int64())]), files, columns=["k"], file_schema=read_as)
