"""Closing a provider's stream: its cleanup runs even when the reader is cancelled, an error in
it is returned, and closing a generator that ran to its end (which closed itself: close_feed
skips its scopes for it) is as quiet as closing any other finished stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest

from flightfeed.feeds.provider import close_feed

pytestmark = pytest.mark.anyio


class Closes:
    """An async iterator that is not a generator: its `aclose` is always called."""

    def __init__(self) -> None:
        self.closed = 0

    def __aiter__(self) -> Closes:
        return self

    async def __anext__(self) -> int:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_stream_stopped_midway_runs_its_cleanup_even_when_cancelled() -> None:
    cleaned: list[str] = []

    async def units() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            await anyio.lowlevel.checkpoint()  # an await: needs the shield when cancelled
            cleaned.append("done")

    stream = units()
    assert await anext(stream) == 1
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert await close_feed(stream) is None
    assert cleaned == ["done"]


async def test_an_error_in_cleanup_is_returned() -> None:
    async def units() -> AsyncIterator[int]:
        try:
            yield 1
        finally:
            raise RuntimeError("cleanup failed")

    stream = units()
    await anext(stream)
    error = await close_feed(stream)
    assert isinstance(error, RuntimeError)
    assert str(error) == "cleanup failed"


async def test_finished_generators_close_quietly_and_other_iterators_get_aclose() -> None:
    async def units() -> AsyncIterator[int]:
        yield 1

    finished = units()
    assert [unit async for unit in finished] == [1]
    assert finished.ag_frame is None  # type: ignore[attr-defined]
    assert await close_feed(finished) is None
    other = Closes()
    assert await close_feed(other) is None
    assert other.closed == 1
    assert await close_feed(object()) is None  # nothing to close
