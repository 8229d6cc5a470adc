"""Tables read as streams: offsets are the units discovered so far; a micro-batch reads exactly
the units of its range from the workers; commits drop them; an uncommitted backlog pauses the
provider; offsets of an earlier opening of the stream are taken only from deterministic
providers; a failed stream is started anew by the next open."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import ClassVar

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flightfeed.cluster import CoordinatorCluster, serve
from flightfeed.coordinator import Catalog, table_command
from flightfeed.coordinator.streams import stream_id, stream_key
from flightfeed.coordinator.table_query import UnitRange
from flightfeed.errors import FeedError
from flightfeed.plan import ExecutionPlan
from flightfeed.testing.feeds import (
    LiveProvider,
    UnitProvider,
    live_provider,
    unit_scan,
    with_unit_scans,
)

pytestmark = pytest.mark.anyio


def catalog() -> Catalog:
    found = with_unit_scans(Catalog(), tasks=2)

    @found.table("live")
    def live(name: str, partitions: int) -> ExecutionPlan:
        return unit_scan(live_provider(name, partitions))

    @found.table("counted")
    def counted(per_partition: int) -> ExecutionPlan:
        return unit_scan(UnitProvider([per_partition] * 2))

    @found.table("queue")
    def queue(name: str, partitions: int) -> ExecutionPlan:
        return unit_scan(live_provider(name, partitions, queue=True))

    @found.table("flaky")
    def flaky(name: str) -> ExecutionPlan:
        return unit_scan(FailsFirstRun.named(name))

    return found


class FailsFirstRun:
    """Two units in one partition; the first run fails after the first unit (a source that was
    briefly unreachable). Deterministic: every run that does not fail gives the same units."""

    unit_type = bytes
    partitions = 1
    deterministic = True
    made: ClassVar[dict[str, FailsFirstRun]] = {}

    def __init__(self) -> None:
        self.runs = 0

    @classmethod
    def named(cls, name: str) -> FailsFirstRun:
        return cls.made.setdefault(name, cls())

    async def feed(self, partition: int, ctx: object) -> AsyncIterator[bytes]:
        self.runs += 1
        yield b"first"
        if self.runs == 1:
            raise ConnectionError("the source did not answer")
        yield b"second"


@asynccontextmanager
async def service() -> AsyncIterator[CoordinatorCluster]:
    async with serve(catalog(), local_workers=2, grace=0.01) as cluster:
        yield cluster


def action(location: str, kind: str, body: bytes) -> dict[str, object]:
    with fl.connect(location) as client:
        (result,) = list(client.do_action(fl.Action(kind, body)))
    answer: dict[str, object] = json.loads(result.body.to_pybytes())
    return answer


def read_range(
    location: str, table: str, args: list[int | float | str | bool], units: UnitRange
) -> pa.Table:
    with fl.connect(location) as client:
        descriptor = fl.FlightDescriptor.for_command(table_command(table, args, units=units))
        info = client.get_flight_info(descriptor)
    parts = []
    for endpoint in info.endpoints:
        with fl.connect(endpoint.locations[0]) as worker:
            parts.append(worker.do_get(endpoint.ticket).read_all())
    return pa.concat_tables(parts)


async def test_micro_batches_read_exactly_the_units_of_their_range() -> None:
    name = uuid.uuid4().hex
    args: list[int | float | str | bool] = [name, 2]
    provider = live_provider(name, 2)
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("live", args)
        )
        assert opened["stream"] == stream_id("live", args)
        assert opened["offsets"] == opened["start"] == {"0:0": 0, "0:1": 0}
        stream = cluster.coordinator.streams.get(stream_id("live", args))
        provider.push(0, b"a", b"b", b"c")
        provider.push(1, b"x")
        await stream.wait_discovered("0:0", 3)
        await stream.wait_discovered("0:1", 1)
        latest = await anyio.to_thread.run_sync(
            action,
            cluster.location,
            "stream_latest",
            json.dumps({"stream": opened["stream"]}).encode(),
        )
        assert latest["offsets"] == {"0:0": 3, "0:1": 1}
        first = UnitRange(str(opened["stream"]), {"0:0": 0, "0:1": 0}, {"0:0": 2, "0:1": 1})
        table = await anyio.to_thread.run_sync(read_range, cluster.location, "live", args, first)
        assert sorted(table.column("body").to_pylist()) == [b"a", b"b", b"x"]
        again = await anyio.to_thread.run_sync(read_range, cluster.location, "live", args, first)
        assert again.sort_by("body").equals(table.sort_by("body"))  # a retried micro-batch
        commit = json.dumps({"stream": opened["stream"], "offsets": {"0:0": 2, "0:1": 1}})
        await anyio.to_thread.run_sync(action, cluster.location, "stream_commit", commit.encode())
        assert stream.start() == {"0:0": 2, "0:1": 1}
        provider.push(1, b"y")
        await stream.wait_discovered("0:1", 2)
        second = UnitRange(str(opened["stream"]), {"0:0": 2, "0:1": 1}, {"0:0": 3, "0:1": 2})
        table = await anyio.to_thread.run_sync(read_range, cluster.location, "live", args, second)
        assert sorted(table.column("body").to_pylist()) == [b"c", b"y"]
        assert not len(cluster.service.reruns)  # (Spark plans each micro-batch anew)
        with pytest.raises(FeedError, match="committed and dropped"):
            stream.providers({"0:0": 0}, {"0:0": 1})


async def test_an_uncommitted_backlog_pauses_the_provider() -> None:
    async with service() as cluster:
        plan = catalog().plan("counted", (1000,))
        stream = cluster.coordinator.open_stream(
            stream_key("counted", (1000,)), plan, max_backlog=10
        )
        await stream.wait_discovered("0:0", 10)
        await anyio.wait_all_tasks_blocked()
        assert stream.latest()["0:0"] == 10  # paused at the backlog bound
        stream.commit({"0:0": 5})
        await stream.wait_discovered("0:0", 15)
        await anyio.wait_all_tasks_blocked()
        assert stream.latest()["0:0"] == 15


async def test_stream_wait_answers_once_a_finite_feed_was_discovered_whole() -> None:
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("counted", [3])
        )
        body = json.dumps({"stream": opened["stream"], "timeout": 30}).encode()
        waited = await anyio.to_thread.run_sync(action, cluster.location, "stream_wait", body)
        assert waited["ended"] is True
        assert waited["offsets"] == {"0:0": 3, "0:1": 3}


async def test_stream_wait_on_a_live_feed_gives_up_at_its_timeout() -> None:
    name = uuid.uuid4().hex
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("live", [name, 1])
        )
        body = json.dumps({"stream": opened["stream"], "timeout": 0.05}).encode()
        waited = await anyio.to_thread.run_sync(action, cluster.location, "stream_wait", body)
        assert waited["ended"] is False
        with pytest.raises(pa.ArrowInvalid, match="stream_wait needs a JSON body"):
            await anyio.to_thread.run_sync(action, cluster.location, "stream_wait", b"{}")


async def test_a_wait_on_a_stream_closed_meanwhile_returns_at_once_saying_so() -> None:
    """A closed stream's pull loops left its `grown` event set for good, and a stream_wait
    spun on it at 100% CPU until its timeout (found by a probe)."""
    name = uuid.uuid4().hex
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("live", [name, 2])
        )
        stream = cluster.coordinator.streams.get(str(opened["stream"]))
        with anyio.fail_after(10):  # (before: the whole timeout, spinning)
            async with anyio.create_task_group() as tg:

                async def close_once_waited() -> None:
                    await anyio.wait_all_tasks_blocked()  # (the wait below waits)
                    cluster.coordinator.streams.close_idle(0)  # as its idle time does

                tg.start_soon(close_once_waited)
                await stream.wait_ended()  # what stream_wait awaits
        with pytest.raises(FeedError, match=f"stream {stream.stream_id} was closed"):
            stream.latest()  # what stream_wait answers then


async def test_a_micro_batch_of_a_stream_opened_for_other_arguments_is_refused() -> None:
    """Its feed count was all that was compared: a query of other arguments read the stream's
    units of its own partitions and dropped the others, without an error (found by a probe)."""
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("counted", [3])
        )
        other = UnitRange(str(opened["stream"]), {}, {"0:0": 1, "0:1": 1})
        two: list[int | float | str | bool] = [2]
        with pytest.raises(pa.ArrowInvalid, match="opened for another table or other arguments"):
            await anyio.to_thread.run_sync(read_range, cluster.location, "counted", two, other)


async def test_a_coordinator_keeps_a_bounded_number_of_streams_open() -> None:
    """Every stream_open of other arguments started one more, without a limit: 60 grew a
    coordinator by 300 MB (found by a probe)."""
    async with service() as cluster:
        cluster.coordinator.streams.max_streams = 3
        for per_partition in range(3):
            await anyio.to_thread.run_sync(
                action, cluster.location, "stream_open", table_command("counted", [per_partition])
            )
        fourth = table_command("counted", [3])
        with pytest.raises(pa.ArrowException, match=r"3 streams are open, the most .* \(3\)"):
            await anyio.to_thread.run_sync(action, cluster.location, "stream_open", fourth)
        again = await anyio.to_thread.run_sync(  # (an open one is opened again as ever)
            action, cluster.location, "stream_open", table_command("counted", [0])
        )
        assert again["opened"] is False
        cluster.coordinator.streams.close_idle(0)
        reopened = await anyio.to_thread.run_sync(action, cluster.location, "stream_open", fourth)
        assert reopened["opened"] is True


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        ("stream_commit", {"offsets": {"0:0": "abc"}}, "'offsets' must map partition keys"),
        ("stream_commit", {"offsets": [1, 2]}, "'offsets' must map partition keys"),
        ("stream_commit", {"offsets": {"0:0": -4}}, "'offsets' must map partition keys"),
        ("stream_commit", {"offsets": {"0:0": True}}, "'offsets' must map partition keys"),
        ("stream_wait", {"timeout": float("nan")}, "'timeout' must be 0 or more and finite"),
        ("stream_wait", {"timeout": float("inf")}, "'timeout' must be 0 or more and finite"),
        ("stream_wait", {"timeout": -1}, "'timeout' must be 0 or more and finite"),
        (  # (before: INTERNAL, OverflowError: int too large to convert to float)
            "stream_wait",
            {"timeout": 10**400},
            r"'timeout' must be 0 or more and finite, got 1000000000000000\.\.\. \(401 digits\)",
        ),
        ("stream_wait", {"timeout": True}, "'timeout' must be a number of seconds"),
        ("stream_wait", {"timeout": "soon"}, "'timeout' must be a number of seconds"),
        ("stream_latest", {"stream": 7}, "needs a JSON body, an object with a string 'stream'"),
        ("stream_latest", {"reader": ""}, "'reader' must be a printable string of 1 to 128"),
        ("stream_latest", {"reader": "x" * 129}, "'reader' must be a printable string"),
        ("stream_latest", {"reader": "a\nb"}, "'reader' must be a printable string"),
        ("stream_commit", {"reader": 3, "offsets": {}}, "'reader' must be a printable string"),
        ("stream_latest", {"reader": "q", "position": {"0:0": -1}}, "'position' must map"),
        ("stream_latest", {"incarnation": 5, "reader": "q", "position": {}}, "'incarnation' must"),
        ("stream_latest", [1], "needs a JSON body, an object with a string 'stream'"),
    ],
)
async def test_bad_stream_action_bodies_are_invalid_arguments(
    kind: str, body: object, message: str
) -> None:
    """A wrong offset was INTERNAL with Python's exception text; an infinite or NaN timeout
    was taken (a wait with no end)."""
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("counted", [3])
        )
        if isinstance(body, dict):
            body = {"stream": opened["stream"], **body}
        raw = json.dumps(body).encode()  # (NaN and Infinity as Python's json writes them)
        with pytest.raises(pa.ArrowInvalid, match=message):
            await anyio.to_thread.run_sync(action, cluster.location, kind, raw)
        # ... and the stream still serves.
        latest = json.dumps({"stream": opened["stream"]}).encode()
        assert "offsets" in await anyio.to_thread.run_sync(
            action, cluster.location, "stream_latest", latest
        )


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@dataclass
class LiveStream:
    """A served `live` table of one partition, opened as a stream, and its actions."""

    cluster: CoordinatorCluster
    args: list[int | float | str | bool]
    provider: LiveProvider
    opened: dict[str, object]

    @property
    def name(self) -> str:
        return str(self.opened["stream"])

    @property
    def incarnation(self) -> str:
        """The first opening's."""
        return str(self.opened["incarnation"])

    async def open(self) -> dict[str, object]:
        command = table_command("live", self.args)
        return await anyio.to_thread.run_sync(action, self.cluster.location, "stream_open", command)

    async def call(self, kind: str, **fields: object) -> dict[str, object]:
        body = _body(stream=self.name, **fields)
        return await anyio.to_thread.run_sync(action, self.cluster.location, kind, body)

    async def read(self, units: UnitRange) -> pa.Table:
        return await anyio.to_thread.run_sync(
            read_range, self.cluster.location, "live", self.args, units
        )


@asynccontextmanager
async def live_stream() -> AsyncIterator[LiveStream]:
    name = uuid.uuid4().hex
    args: list[int | float | str | bool] = [name, 1]
    provider = live_provider(name, 1)
    async with service() as cluster:
        command = table_command("live", args)
        opened = await anyio.to_thread.run_sync(action, cluster.location, "stream_open", command)
        yield LiveStream(cluster, args, provider, opened)


async def test_offsets_of_a_reopened_queue_are_refused_not_served() -> None:
    """A provider that hands each unit out once numbers the reopened stream's units from 0: a
    query resuming at its checkpoint of 2 skipped the first 2 new units without a word."""
    name = uuid.uuid4().hex
    args: list[int | float | str | bool] = [name, 1]
    provider = live_provider(name, 1, queue=True)
    async with service() as cluster:
        location = cluster.location
        opened = await anyio.to_thread.run_sync(
            action, location, "stream_open", table_command("queue", args)
        )
        stream = cluster.coordinator.streams.get(str(opened["stream"]))
        provider.push(0, b"a", b"b")
        await stream.wait_discovered("0:0", 2)
        old = str(opened["incarnation"])
        cluster.coordinator.streams.close_idle(-1.0)  # every stream, as after 10 idle minutes
        provider.push(0, b"c", b"d", b"e")
        reopened = await anyio.to_thread.run_sync(
            action, location, "stream_open", table_command("queue", args)
        )
        assert reopened["incarnation"] != old
        stream = cluster.coordinator.streams.get(str(opened["stream"]))
        await stream.wait_discovered("0:0", 3)  # c, d, e: units 0..2 of the new opening
        checkpoint = {"0:0": 2}
        refusals = [
            ("stream_wait", _body(stream=opened["stream"], at_least=checkpoint, incarnation=old)),
            ("stream_commit", _body(stream=opened["stream"], offsets=checkpoint, incarnation=old)),
        ]
        for kind, body in refusals:
            with pytest.raises(pa.ArrowException, match="deterministic = True"):
                await anyio.to_thread.run_sync(action, location, kind, body)
        late = UnitRange(str(opened["stream"]), checkpoint, {"0:0": 3}, old)
        with pytest.raises(pa.ArrowException, match="new checkpoint"):
            await anyio.to_thread.run_sync(read_range, location, "queue", args, late)
        assert stream.start() == {"0:0": 0}  # the refused commit dropped nothing
        current = UnitRange(
            str(opened["stream"]), {"0:0": 0}, {"0:0": 3}, str(reopened["incarnation"])
        )
        table = await anyio.to_thread.run_sync(read_range, location, "queue", args, current)
        assert sorted(table.column("body").to_pylist()) == [b"c", b"d", b"e"]


async def test_offsets_of_a_reopened_deterministic_stream_resume_where_they_were() -> None:
    async with live_stream() as live:
        live.provider.push(0, b"a", b"b", b"c")
        live.cluster.coordinator.streams.close_idle(-1.0)
        await live.open()
        waited = await live.call("stream_wait", at_least={"0:0": 2}, incarnation=live.incarnation)
        assert waited["offsets"]["0:0"] >= 2  # type: ignore[index]
        rest = UnitRange(live.name, {"0:0": 2}, {"0:0": 3}, live.incarnation)
        table = await live.read(rest)
        assert table.column("body").to_pylist() == [b"c"]


async def test_a_failed_stream_reports_its_failure_until_opened_again() -> None:
    """A provider's failure was kept for the stream's life: every later query failed with it
    until the coordinator restarted."""
    name = uuid.uuid4().hex
    async with service() as cluster:
        location = cluster.location
        opened = await anyio.to_thread.run_sync(
            action, location, "stream_open", table_command("flaky", [name])
        )
        wait = _body(stream=opened["stream"], timeout=30)
        with pytest.raises(pa.ArrowException, match="the source did not answer"):
            await anyio.to_thread.run_sync(action, location, "stream_wait", wait)
        latest = _body(stream=opened["stream"])
        with pytest.raises(pa.ArrowException, match="the next stream_open starts the stream anew"):
            await anyio.to_thread.run_sync(action, location, "stream_latest", latest)
        again = await anyio.to_thread.run_sync(
            action, location, "stream_open", table_command("flaky", [name])
        )
        assert again["incarnation"] != opened["incarnation"]
        waited = await anyio.to_thread.run_sync(action, location, "stream_wait", wait)
        assert waited["ended"] is True
        assert waited["offsets"] == {"0:0": 2}


async def test_named_readers_each_keep_the_units_they_have_not_committed() -> None:
    """One commit position per stream: a query that committed dropped the units another query
    with a checkpoint of its own had not read yet ('committed and dropped')."""
    async with live_stream() as live:
        call, provider = live.call, live.provider
        stream = live.cluster.coordinator.streams.get(live.name)
        first = await call("stream_latest", reader="first")
        second = await call("stream_latest", reader="second")
        assert first["position"] == second["position"] == {"0:0": 0}
        provider.push(0, b"a", b"b", b"c")
        await stream.wait_discovered("0:0", 3)
        await call("stream_commit", reader="first", offsets={"0:0": 3})
        assert stream.start() == {"0:0": 0}  # "second" has read none of them
        table = await live.read(UnitRange(live.name, {"0:0": 0}, {"0:0": 3}))
        assert sorted(table.column("body").to_pylist()) == [b"a", b"b", b"c"]
        await call("stream_commit", reader="second", offsets={"0:0": 2})
        assert stream.start() == {"0:0": 2}
        answer = await call("stream_latest", reader="second")
        assert answer["position"] == {"0:0": 2}
        third = await call("stream_latest", reader="third")  # new: from the oldest units held
        assert third["position"] == {"0:0": 2}
        stream.reader_ttl = 0.0  # the others fall silent: they hold nothing back any more
        await anyio.sleep(0.01)
        await call("stream_commit", reader="first", offsets={"0:0": 3})
        assert stream.start() == {"0:0": 3}
        await call("stream_commit", offsets={"0:0": 3})  # no name: for everyone, as before
        assert stream.start() == {"0:0": 3}


async def test_a_stream_keeps_a_bounded_number_of_named_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("flightfeed.coordinator.streams.MAX_READERS", 3)
    async with service() as cluster:
        opened = await anyio.to_thread.run_sync(
            action, cluster.location, "stream_open", table_command("counted", [3])
        )
        for reader in ("a", "b", "c"):
            body = _body(stream=opened["stream"], reader=reader)
            await anyio.to_thread.run_sync(action, cluster.location, "stream_latest", body)
        body = _body(stream=opened["stream"], reader="d")
        with pytest.raises(pa.ArrowException, match="has 3 readers heard from within 600s"):
            await anyio.to_thread.run_sync(action, cluster.location, "stream_latest", body)
        known = _body(stream=opened["stream"], reader="a")
        await anyio.to_thread.run_sync(action, cluster.location, "stream_latest", known)


async def test_a_reopened_stream_keeps_units_for_the_earlier_readers_yet_to_come_back() -> None:
    """After a coordinator restart, the first query back committed and the stream dropped the
    units a second query with a checkpoint of its own still needed: it failed for good with
    'committed and dropped'."""
    async with live_stream() as live:
        call, old, streams = live.call, live.incarnation, live.cluster.coordinator.streams
        live.provider.push(0, b"a", b"b", b"c", b"d")
        await streams.get(live.name).wait_discovered("0:0", 4)
        for reader in ("first", "second"):  # both read up to 1 before the "restart"
            await call("stream_commit", reader=reader, offsets={"0:0": 1}, incarnation=old)
        streams.close_idle(-1.0)  # a new incarnation knows no reader
        await live.open()
        stream = streams.get(live.name)
        await call("stream_wait", at_least={"0:0": 1}, incarnation=old)  # "first" comes back
        await stream.wait_discovered("0:0", 4)
        await call("stream_commit", reader="first", offsets={"0:0": 4}, incarnation=old)
        assert stream.start() == {"0:0": 0}  # kept for readers of the earlier incarnation
        table = await live.read(UnitRange(live.name, {"0:0": 1}, {"0:0": 4}, old))
        assert sorted(table.column("body").to_pylist()) == [b"b", b"c", b"d"]
        await call("stream_commit", reader="second", offsets={"0:0": 4}, incarnation=old)
        assert stream.start() == {"0:0": 0}  # held for reader_ttl, whoever else may come
        stream.reader_ttl = 0.0  # ... and no longer once it has passed
        await anyio.sleep(0.01)
        await call("stream_commit", reader="second", offsets={"0:0": 4})
        assert stream.start() == {"0:0": 4}
