"""Several senders on one stream: each message's pieces stay together."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from flightfeed.concurrency import one_at_a_time

pytestmark = pytest.mark.anyio


def piecewise(wire: list[str]) -> Callable[[str], Coroutine[Any, Any, None]]:
    """A send that writes a message in two pieces with a wait between them, as grpclib does
    when the transport pauses in the middle of a message."""

    async def send(message: str) -> None:
        wire.append(f"{message}:1")
        await anyio.lowlevel.checkpoint()
        wire.append(f"{message}:2")

    return send


async def send_all(send: Callable[[str], Coroutine[Any, Any, None]], messages: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for message in messages:
            tg.start_soon(send, message)


async def test_concurrent_senders_do_not_interleave_pieces() -> None:
    wire: list[str] = []
    await send_all(one_at_a_time(piecewise(wire)), ["credits", "reads", "metrics"])
    pairs = [wire[i : i + 2] for i in range(0, len(wire), 2)]
    assert sorted(pairs) == [[f"{m}:1", f"{m}:2"] for m in ("credits", "metrics", "reads")]


async def test_without_it_the_same_senders_interleave() -> None:
    """The case above is a real one: unserialized, the pieces do mix."""
    wire: list[str] = []
    await send_all(piecewise(wire), ["credits", "reads", "metrics"])
    pairs = [wire[i : i + 2] for i in range(0, len(wire), 2)]
    assert any(first.split(":")[0] != second.split(":")[0] for first, second in pairs)


async def test_a_failed_send_lets_the_next_one_go() -> None:
    wire: list[str] = []
    send = piecewise(wire)

    async def failing(message: str) -> None:
        if message == "bad":
            raise ConnectionError("stream reset")
        await send(message)

    serialized = one_at_a_time(failing)
    with pytest.raises(ConnectionError):
        await serialized("bad")
    await serialized("next")
    assert wire == ["next:1", "next:2"]
