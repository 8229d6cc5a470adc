"""Arrow's allocator is configured by importing flightfeed, before pyarrow loads: each case runs
in a fresh interpreter, because mimalloc reads its options once, when the library loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from flightfeed._allocator import PURGE_DELAY_MS

PROBE = """
import json, os, sys
{first}
import flightfeed, pyarrow  # noqa: F401
from flightfeed._allocator import keep_freed_pages
print(json.dumps({{
    "delay": os.environ.get("MIMALLOC_PURGE_DELAY"),
    "in_force": keep_freed_pages(),
}}))
"""


def probe(first: str = "", **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "MIMALLOC_PURGE_DELAY"} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_importing_flightfeed_first_keeps_freed_pages_for_the_delay() -> None:
    seen = probe()
    assert seen["delay"] == str(PURGE_DELAY_MS)
    assert seen["in_force"] is True


def test_a_delay_the_user_chose_wins() -> None:
    seen = probe(MIMALLOC_PURGE_DELAY="25")
    assert seen["delay"] == "25"
    assert seen["in_force"] is False


def test_pyarrow_loaded_first_is_left_alone_and_not_claimed() -> None:
    seen = probe(first="import pyarrow")
    assert seen["delay"] is None  # too late for mimalloc: setting it would only mislead
    assert seen["in_force"] is False
