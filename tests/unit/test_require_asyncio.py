"""Servers and the coordinator start only on an asyncio loop (uvloop's too): under anyio's
trio backend a coordinator started, then every query failed with "no running event loop" and
its healthy workers were logged as broken (found by a probe). Code that no asyncio loop runs,
as trio's tasks are not, is refused at once, saying what to run instead."""

from __future__ import annotations

import pytest

from flightfeed.concurrency import require_asyncio
from flightfeed.coordinator import Coordinator, StaticWorkerResolver


def test_without_an_asyncio_loop_it_says_what_to_run_instead() -> None:
    with pytest.raises(RuntimeError, match=r"a Coordinator runs on asyncio \(or uvloop\)"):
        require_asyncio("a Coordinator")


@pytest.mark.anyio
async def test_on_asyncio_and_uvloop_a_coordinator_starts() -> None:
    require_asyncio("a Coordinator")
    async with Coordinator(StaticWorkerResolver(["grpc://127.0.0.1:9"])) as coordinator:
        assert coordinator.admission.running == 0
