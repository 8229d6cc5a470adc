"""Big control messages never hold a worker's event loop (issue 14: a 20 MB WorkUnitBatch
froze a worker for 7 s, and a plan nested 200,000 deep for 1.3 s).

The worker runs in this process so that the suite's loop guard (tests/conftest.py) watches its
loop: the test fails if any callback holds it longer than LOOP_STALL_SECONDS. Meanwhile other
calls keep being answered, and the bad input gets its precise error.
"""

from __future__ import annotations

import uuid

import anyio
import pytest
from helpers.feed_scan import feed_session_builder, feed_task

from flightfeed._generated.flightfeed.v1 import (
    PlanNode,
    SetPlanRequest,
    TaskKey,
    WorkUnit,
    WorkUnitBatch,
)
from flightfeed.errors import Cancelled, InvalidArgument, RemoteError
from flightfeed.feeds.codec import UnitRun, encode_batch
from flightfeed.protocol import WorkerClient
from flightfeed.protowire import len_field_header
from flightfeed.testing import start_workers

pytestmark = pytest.mark.anyio
UNITS = 200_000
BODY = b"x" * 96  # 200,000 units of ~100 bytes: a 20 MB message


def reference_batch(feed_id: bytes) -> WorkUnitBatch:
    """The reference's form: one WorkUnit message per unit."""
    units = [
        WorkUnit(id=feed_id, partition=0, body=BODY, created_timestamp_unix_nanos=1)
        for _ in range(UNITS)
    ]
    return WorkUnitBatch(batch=units)


def packed_batch(feed_id: bytes) -> WorkUnitBatch:
    return encode_batch([UnitRun(feed_id, 0, [BODY] * UNITS, [1] * UNITS)], 1)


async def answered_meanwhile(location: str, done: anyio.Event) -> int:
    """GetWorkerInfo calls answered until `done`: the worker serves others throughout."""
    answered = 0
    async with WorkerClient(location) as other:
        while not done.is_set():
            assert (await other.worker_info()).version
            answered += 1
            await anyio.sleep(0.01)
    return answered


async def run_task(client: WorkerClient, request: SetPlanRequest, batch: WorkUnitBatch) -> None:
    async with client.open_task(request) as channel:
        await channel.send_work_units(batch)
        await channel.wait_metrics()


@pytest.mark.parametrize("form", [reference_batch, packed_batch], ids=["reference", "packed"])
async def test_a_20_mb_work_unit_batch_is_taken_in_off_the_loop(form: object) -> None:
    assert callable(form)
    async with (
        start_workers(1, session_builder=feed_session_builder) as (worker,),
        WorkerClient(worker.location) as client,
    ):
        feed_id, request = feed_task(2)
        batch = await anyio.to_thread.run_sync(form, feed_id)  # the test's own encoding, too
        done = anyio.Event()
        answered = [0]

        async def watch() -> None:
            answered[0] = await answered_meanwhile(worker.location, done)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(60), pytest.raises(Cancelled) as failed:
                await run_task(client, request, batch)
            done.set()
        assert f"{UNITS} units for feed {feed_id.hex()} partition 0 with only 256 credits" in str(
            failed.value
        )
        assert answered[0] > 0
        assert (await client.worker_info()).tasks == 0


def nested_plan(depth: int) -> bytes:
    """PlanNode{kind: "Coalesce", children: [PlanNode{...}]} `depth` deep, encoded by hand
    (betterproto recurses per level): every level's prefix, outermost first, then the leaf."""
    leaf = bytes(PlanNode(kind="Coalesce"))
    kind = len_field_header(1, 8) + b"Coalesce"
    prefixes = []
    size = len(leaf)
    for _ in range(depth):  # innermost first: each level's length is the one below it
        prefix = kind + len_field_header(3, size)
        prefixes.append(prefix)
        size += len(prefix)
    return b"".join(reversed(prefixes)) + leaf


async def test_a_plan_nested_200000_deep_is_refused_off_the_loop() -> None:
    plan_proto = await anyio.to_thread.run_sync(nested_plan, 200_000)
    request = SetPlanRequest(
        task_key=TaskKey(query_id=uuid.uuid4().bytes, stage_id=1),
        task_count=1,
        plan_proto=plan_proto,
    )
    async with (
        start_workers(1) as (worker,),
        WorkerClient(worker.location) as client,
    ):
        with anyio.fail_after(60), pytest.raises((InvalidArgument, RemoteError)) as refused:
            await run_task(client, request, WorkUnitBatch())
        assert "nested deeper than" in str(refused.value)
        assert (await client.worker_info()).tasks == 0
