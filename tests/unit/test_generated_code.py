"""The committed generated code is exactly what scripts/generate_protos.py produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_protos_changes_nothing() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout
