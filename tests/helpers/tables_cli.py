"""`flightfeed tables` run in this process, its output captured (the CLI tests' one runner)."""

from __future__ import annotations

import pytest

from flightfeed.cli import main


def tables(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`flightfeed tables ARGV...`: exit status, stdout, stderr."""
    capsys.readouterr()
    code = main(["tables", *argv])
    out, err = capsys.readouterr()
    return code, out, err
