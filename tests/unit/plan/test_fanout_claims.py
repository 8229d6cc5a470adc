"""An output of a fan-out that nobody opens is dropped after the claim timeout, so the outputs
that are read finish; opening it later says why it is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from flightfeed.errors import Cancelled, InvalidArgument
from flightfeed.plan.fanout import Fanout, FanoutSender

ITEMS = 10


async def read_all(outputs: list[AsyncIterator[int]]) -> list[list[int]]:
    """Every output to its end, concurrently (one after the other would stall the producer)."""
    got: list[list[int]] = [[] for _ in outputs]

    async def drain(index: int) -> None:
        got[index] = [item async for item in outputs[index]]

    async with anyio.create_task_group() as tg:
        for index in range(len(outputs)):
            tg.start_soon(drain, index)
    return got


async def produce(sender: FanoutSender[int]) -> None:
    for item in range(ITEMS):
        for output in range(sender.outputs):
            await sender.send(output, item)


@pytest.mark.anyio
async def test_an_unclaimed_output_no_longer_blocks_the_others() -> None:
    async with anyio.create_task_group() as tg:
        fanout: Fanout[int] = Fanout(3, 1, produce, tg, claim_timeout=0.2)
        with anyio.fail_after(10):
            got = await read_all([fanout.open(0), fanout.open(1)])
        assert got == [list(range(ITEMS))] * 2
        with pytest.raises(Cancelled, match=r"output 2 was not opened within 0.2s"):
            fanout.open(2)


@pytest.mark.anyio
async def test_outputs_all_opened_in_time_lose_nothing() -> None:
    async with anyio.create_task_group() as tg:
        fanout: Fanout[int] = Fanout(2, 1, produce, tg, claim_timeout=0.2)
        first = fanout.open(0)
        assert await anext(first) == 0
        second = fanout.open(1)
        with anyio.fail_after(10):
            rest, other = await read_all([first, second])
        assert rest == list(range(1, ITEMS))
        assert other == list(range(ITEMS))


def test_the_claim_timeout_must_be_positive() -> None:
    async def nothing(sender: FanoutSender[int]) -> None:
        return None

    with pytest.raises(InvalidArgument, match="claim_timeout"):
        Fanout(2, 1, nothing, None, claim_timeout=0)  # type: ignore[arg-type]
