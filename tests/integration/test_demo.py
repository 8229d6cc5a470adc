"""The README's main job runs and its results match their references."""

from __future__ import annotations

import subprocess
import sys


def test_flightfeed_demo_runs_and_matches() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", "demo"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical" in out.stdout
    assert out.stdout.count("matches the one-process run") == 2  # workers; coordinator + feed
    assert "work discovered at runtime: 320 work units over 8 feed partitions" in out.stdout
    assert "poorly aligned" not in out.stderr
