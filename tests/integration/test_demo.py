"""The README's main job runs and its results match their references: the Spark pipeline over
runtime work first, then the layers under it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.spark
def test_flightfeed_demo_runs_and_matches() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", "demo"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "COLUMNS": "120"},
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "Spark read 2,400,000 rows" in out.stdout
    assert "chunks processed on the workers" in out.stdout
    assert "identical" in out.stdout
    assert out.stdout.count("matches the one-process run") == 3  # Spark; workers; coordinator
    assert "work discovered at runtime: 320 work units over 8 feed partitions" in out.stdout
    assert "poorly aligned" not in out.stderr


def test_the_demo_without_spark_runs_the_layers_under_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", "demo", "--no-spark"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Spark" not in out.stdout
    assert out.stdout.count("matches the one-process run") == 2
    sections = [line for line in out.stdout.splitlines() if line[:1].isdigit() and ". " in line]
    assert [line.split(".", 1)[0] for line in sections] == ["1", "2", "3"]


def test_the_demo_without_java_says_how_to_run_without_spark() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", "demo"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "JAVA_HOME": "/nonexistent"},
    )
    assert out.returncode == 2
    assert "has no bin/java" in out.stderr
    assert "or run `flightfeed demo --no-spark`, the demo without Spark" in out.stderr
    assert "Traceback" not in out.stderr
