"""examples/pipeline, the Spark Declarative Pipelines project, run with `spark-pipelines run` on
the standalone cluster (through its Spark Connect server) and in local mode (with the project's
spark.conf), against a `flightfeed coordinator` process: the streaming table holds every row of
the seeds' scan once, and the materialized view over it gives the seed query's answer. A second
run reads no unit twice."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers.coordinator_command import coordinator_command
from helpers.spark_fixtures import ConnectServer, spark_env

from flightfeed.examples.chunk_scan import scan_rows

ROOT = Path(__file__).resolve().parents[2]
SEED = (2, "3,1", "2", "4", "1,1")
BY_TASK_AND_PARTITION = [("task", "ascending"), ("partition", "ascending")]


@pytest.fixture(scope="module")
def coordinator() -> Iterator[str]:
    """`flightfeed coordinator` serving the seeds' chunk scan on two local workers."""
    with coordinator_command("--local-workers", "2") as (_, location, _):
        yield location


def pipeline_project(destination: Path, coordinator: str) -> Path:
    """A copy of examples/pipeline whose spec points at `coordinator` and stores under the
    copy; returns the spec's path."""
    project = destination / "pipeline"
    shutil.copytree(ROOT / "examples" / "pipeline", project)
    spec_path = project / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["storage"] = (project / "storage").as_uri()
    spec["configuration"]["flightfeed.uri"] = coordinator
    spec_path.write_text(yaml.safe_dump(spec))
    return spec_path


def run_pipeline(spec: Path, *how: str) -> subprocess.CompletedProcess[str]:
    """`spark-pipelines run` of the spec, `how`: `--remote URL`, or `--properties-file FILE`."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("spark-pipelines")), "run", "--spec", str(spec),
         *how],
        capture_output=True, text=True, timeout=600, check=False, env=spark_env(),
        cwd=spec.parent,
    )  # fmt: skip


def local_properties(project: Path) -> tuple[Path, Path]:
    """The project's spark.conf with its metastore, warehouse and Derby log in `project`/state:
    the file, and the warehouse."""
    conf = project / "spark.conf"
    conf.write_text(conf.read_text().replace("/tmp/flightfeed_chunks", str(project / "state")))
    return conf, project / "state" / "warehouse"


def pairs(rows: pa.Table) -> list[tuple[int, int]]:
    """(task, partition) of every row, sorted."""
    ordered = rows.sort_by(BY_TASK_AND_PARTITION)
    return list(zip(ordered["task"].to_pylist(), ordered["partition"].to_pylist(), strict=True))


def table(server: ConnectServer, name: str) -> pa.Table:
    return pq.read_table(server.warehouse / name)


def test_the_pipeline_project_runs_with_spark_pipelines(
    connect_server: ConnectServer, coordinator: str, tmp_path: Path
) -> None:
    spec = pipeline_project(tmp_path, coordinator)
    first = run_pipeline(spec, "--remote", connect_server.url)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Run is COMPLETED" in first.stdout + first.stderr
    rows = table(connect_server, "chunk_rows")
    assert pairs(rows) == pairs(scan_rows(*SEED))
    per_task = table(connect_server, "rows_per_task").sort_by("task")
    assert per_task.to_pylist() == [{"cnt": 6, "task": 0}, {"cnt": 6, "task": 1}]

    again = run_pipeline(spec, "--remote", connect_server.url)  # resumes from its checkpoint
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert table(connect_server, "chunk_rows").num_rows == rows.num_rows
    assert table(connect_server, "rows_per_task").sort_by("task").equals(per_task)


def test_the_pipeline_project_runs_again_in_local_mode(coordinator: str, tmp_path: Path) -> None:
    """Without a Connect server each run is a new local Spark: spark.conf's metastore keeps the
    tables, so the second run resumes the stream (it failed with LOCATION_ALREADY_EXISTS)."""
    spec = pipeline_project(tmp_path, coordinator)
    conf, warehouse = local_properties(spec.parent)
    for run in ("first", "second"):
        done = run_pipeline(spec, "--properties-file", str(conf))
        assert done.returncode == 0, run + done.stdout[-3000:] + done.stderr[-3000:]
        assert "Run is COMPLETED" in done.stdout + done.stderr
        assert pairs(pq.read_table(warehouse / "chunk_rows")) == pairs(scan_rows(*SEED))
        per_task = pq.read_table(warehouse / "rows_per_task").sort_by("task")
        assert per_task.to_pylist() == [{"cnt": 6, "task": 0}, {"cnt": 6, "task": 1}]
    assert (spec.parent / "state" / "derby.log").exists()  # where spark.conf says,
    assert not (spec.parent / "derby.log").exists()  # not in the directory it runs from
