"""The code stays as `tox -e lint,type` wants it: ruff clean and formatted, mypy --strict clean.

Run here so that CI, which runs the README's test command, proves them too: `tox -e type`
and `tox -e lint` had drifted (twelve type errors in tests and benchmarks, unformatted Python
blocks in the README) while only `mypy flightfeed` was run by hand. The tools come with the
`dev` extra; without them (a `tox -e tests` environment) these tests skip, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), cwd=ROOT, capture_output=True, text=True, check=False, timeout=600
    )


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (the dev extra brings it)")
    return found


def test_ruff_finds_nothing() -> None:
    result = _run(_ruff(), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_would_change_nothing() -> None:
    result = _run(_ruff(), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_finds_nothing(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra brings it)")
    # pyproject.toml names the files (flightfeed, tests, benchmarks, scripts) and strictness.
    result = _run(sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found")
