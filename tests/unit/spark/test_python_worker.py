"""settle_python_worker: once per process, malloc tuned; the heap frozen only in a reused Spark
Python worker (whose daemon collects the whole heap after every task), unless switched off.
Each case runs in a fresh interpreter: the result is cached, and a freeze is for good."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = (
    "import gc; from flightfeed.spark.python_worker import settle_python_worker as s;"
    "print(s(), s(), gc.get_freeze_count() > 0)"
)


@pytest.mark.parametrize(
    ("env", "frozen"),
    [
        ({"SPARK_REUSE_WORKER": "1"}, True),
        ({}, False),  # not a reused Spark worker: a test or an application, left alone
        ({"SPARK_REUSE_WORKER": "1", "FLIGHTFEED_NO_GC_TUNING": "1"}, False),
    ],
)
def test_the_heap_is_frozen_only_in_a_reused_spark_worker(
    env: dict[str, str], frozen: bool
) -> None:
    switches = ("SPARK_REUSE_WORKER", "FLIGHTFEED_NO_GC_TUNING")
    base = {k: v for k, v in os.environ.items() if k not in switches}
    out = subprocess.run(
        [sys.executable, "-c", CODE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == [str(frozen)] * 3
