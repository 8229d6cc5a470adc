"""Arrow's allocator is configured by importing flightfeed, before pyarrow loads: each case runs
in a fresh interpreter, because mimalloc reads its options once, when the library loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from flightfeed._allocator import OPTIONS, PURGE_DELAY_MS

PROBE = """
import json, os, sys
{first}
import flightfeed, pyarrow  # noqa: F401
from flightfeed._allocator import OPTIONS, configure_arrow_allocator
print(json.dumps({{
    "environment": {{name: os.environ.get(name) for name in OPTIONS}},
    "in_force": configure_arrow_allocator(),
}}))
"""


def probe(first: str = "", **env: str) -> dict[str, dict[str, object]]:
    environ = {k: v for k, v in os.environ.items() if k not in OPTIONS} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_importing_flightfeed_first_keeps_freed_pages_and_skips_huge_pages() -> None:
    seen = probe()
    assert seen["environment"] == {
        "MIMALLOC_PURGE_DELAY": str(PURGE_DELAY_MS),
        "MIMALLOC_ALLOW_THP": "0",
    }
    assert seen["in_force"] == dict.fromkeys(OPTIONS, True)


def test_a_value_the_user_chose_wins() -> None:
    seen = probe(MIMALLOC_PURGE_DELAY="25")
    assert seen["environment"]["MIMALLOC_PURGE_DELAY"] == "25"
    assert seen["environment"]["MIMALLOC_ALLOW_THP"] == "0"  # the other one is still set
    assert seen["in_force"] == {"MIMALLOC_PURGE_DELAY": False, "MIMALLOC_ALLOW_THP": True}


def test_pyarrow_loaded_first_is_left_alone_and_not_claimed() -> None:
    seen = probe(first="import pyarrow")
    assert seen["environment"] == dict.fromkeys(OPTIONS)  # too late for mimalloc: not set
    assert seen["in_force"] == dict.fromkeys(OPTIONS, False)


def test_settings_a_parent_process_passed_on_are_in_force_whatever_loads_first() -> None:
    seen = probe(first="import pyarrow", **OPTIONS)
    assert seen["in_force"] == dict.fromkeys(OPTIONS, True)
