"""The README's main job runs and its results match their references: the Spark pipeline over
runtime work first, then the layers under it; Ctrl-C stops it with one line at any point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEMO = [sys.executable, "-m", "flightfeed.cli", "demo"]
SPARK_ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable}


@pytest.mark.spark
def test_flightfeed_demo_runs_and_matches() -> None:
    out = subprocess.run(
        DEMO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**SPARK_ENV, "COLUMNS": "120"},
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
        [*DEMO, "--no-spark"],
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
        DEMO,
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


def _live_members(group: int) -> list[str]:
    """The processes of a process group that still run (zombies aside), as their command names."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name, _, rest = text.rpartition(")")
        state, _, pgrp = rest.split()[:3]
        if int(pgrp) == group and state != "Z":
            found.append(name.partition("(")[2])
    return found


@pytest.mark.spark
@pytest.mark.parametrize(
    ("moment", "marker"),
    [
        ("while Spark starts", "WARNING: Using incubator modules"),  # the JVM's first line
        ("while Spark reads", "Spark SQL:"),
    ],
)
def test_ctrl_c_stops_the_demo_with_one_line_and_leaves_no_jvm(moment: str, marker: str) -> None:
    """Ctrl-C as a terminal sends it, to the whole process group: as Spark's JVM starts, or a
    second into the pipeline's read (which takes several; any moment must do). In the first,
    the demo exited but the JVM (which ignores SIGINT) lived on, holding the terminal's output;
    in the second, py4j logged a traceback of the interrupted call."""
    demo = subprocess.Popen(
        DEMO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**SPARK_ENV, "PYTHONUNBUFFERED": "1"},
    )
    group = demo.pid
    try:
        assert demo.stdout is not None
        seen = [""]
        for line in demo.stdout:
            seen.append(line)
            if line.startswith(marker):
                break
        assert seen[-1].startswith(marker), "".join(seen)
        if moment == "while Spark reads":
            time.sleep(1)
        os.killpg(group, signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
        assert demo.returncode == 130, f"{moment}: {rest}"
        for sign in ("Traceback", "Exception", "ERROR", "WARN", "INFO"):
            assert sign not in rest, f"{moment}: {rest}"
        assert rest.strip().splitlines()[-1] == "flightfeed: interrupted", rest
        deadline = time.monotonic() + 30  # the JVM exits once its gateway is closed
        while _live_members(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _live_members(group) == [], moment
    finally:
        if _live_members(group):
            os.killpg(group, signal.SIGKILL)
        demo.wait()
