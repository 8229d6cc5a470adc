"""The coordinator as a Flight service: pyarrow's C++ client lists the catalog, asks for a
query's schema and FlightInfo, and reads every endpoint straight from the workers."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flightfeed.cluster import CoordinatorCluster, serve
from flightfeed.coordinator import Catalog
from flightfeed.coordinator.reruns import Reruns
from flightfeed.coordinator.table_query import table_command
from flightfeed.errors import InvalidArgument
from flightfeed.plan import ExecutionPlan, call, col, lit
from flightfeed.protocol import task_id
from flightfeed.protocol.tickets import parse_ticket
from flightfeed.testing import start_workers, wait_for_no_tasks
from flightfeed.testing.feeds import (
    UnitProvider,
    unit_scan,
    with_unit_scans,
)
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio
T = TypeVar("T")


def catalog() -> Catalog:
    found = with_unit_scans(Catalog(), tasks=2)

    @found.table("units", description="per partition, units b'<p>:<i>'")
    def units(partitions: int, per_partition: int) -> ExecutionPlan:
        if partitions < 1 or partitions % 2:
            raise InvalidArgument(f"partitions must be a positive even number, got {partitions}")
        return unit_scan(UnitProvider([per_partition] * partitions))

    return found


@asynccontextmanager
async def service() -> AsyncIterator[CoordinatorCluster]:
    async with serve(catalog(), local_workers=2, grace=0.01) as cluster:
        yield cluster


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(fn, *args)


def read_query(location: str, command: bytes) -> tuple[fl.FlightInfo, pa.Table]:
    """What any Flight client does: GetFlightInfo, then DoGet each endpoint where it is."""
    with fl.connect(location) as client:
        info = client.get_flight_info(fl.FlightDescriptor.for_command(command))
    parts = []
    for endpoint in info.endpoints:
        with fl.connect(endpoint.locations[0]) as worker:
            parts.append(worker.do_get(endpoint.ticket).read_all())
    return info, pa.concat_tables(parts)


def act(location: str, kind: str, body: bytes) -> list[fl.Result]:
    """DoAction `kind` of the coordinator at `location` (from a thread: it blocks)."""
    with fl.connect(location) as client:
        return list(client.do_action(fl.Action(kind, body)))


def relocate_body(endpoint: fl.FlightEndpoint) -> bytes:
    """What a reader that could not reach `endpoint` asks the coordinator."""
    ticket, failed = endpoint.ticket.ticket.hex(), endpoint.locations[0].uri.decode()
    return json.dumps({"ticket": ticket, "failed": failed}).encode()


async def test_a_query_is_read_in_parallel_from_the_workers_then_released() -> None:
    async with service() as cluster:
        info, table = await in_thread(read_query, cluster.location, table_command("units", [4, 25]))
        assert len(info.endpoints) == 4  # one per output partition
        assert {e.locations[0].uri.decode() for e in info.endpoints} == {
            w.location for w in cluster.workers
        }
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)  # every endpoint read: released
    assert table.num_rows == 100
    assert sorted(set(table.column("partition").to_pylist())) == [0, 1, 2, 3]


async def test_filters_and_columns_run_on_the_workers() -> None:
    keep = call("less", col("partition"), lit(2))
    command = table_command("units", [4, 25], columns=["body", "partition"], filters=[keep])
    async with service() as cluster:
        info, table = await in_thread(read_query, cluster.location, command)
    assert info.schema.names == ["body", "partition"]
    assert table.num_rows == 50
    assert set(table.column("partition").to_pylist()) == {0, 1}


async def test_the_catalog_and_schemas_answer_without_starting_anything() -> None:
    def ask(location: str) -> tuple[list[fl.FlightInfo], pa.Schema]:
        with fl.connect(location) as client:
            listed = list(client.list_flights())
            command = fl.FlightDescriptor.for_command(table_command("units", [2, 1]))
            return listed, client.get_schema(command).schema

    async with service() as cluster:
        listed, schema = await in_thread(ask, cluster.location)
        assert not any(len(w.registry) for w in cluster.workers)
    assert [info.descriptor.path for info in listed] == [[b"units"]]
    assert b'"units(partitions: int, per_partition: int)"' in listed[0].app_metadata
    assert schema.names == ["partition", "body", "units"]


async def test_a_table_whose_plan_fails_is_listed_with_its_error_and_the_rest_as_ever() -> None:
    """Before, one table whose factory raised failed the whole listing (INTERNAL), and with it
    `flightfeed.spark.sql`, which finds every table through it."""
    broken = catalog()

    @broken.table("upstream", description="an API that is down")
    def upstream() -> ExecutionPlan:
        raise RuntimeError("upstream API down")

    def listing(location: str) -> list[fl.FlightInfo]:
        with fl.connect(location) as client:
            return list(client.list_flights())

    async with serve(broken, local_workers=1, grace=0.01) as cluster:
        listed = await in_thread(listing, cluster.location)
    about = {info.descriptor.path[0]: json.loads(info.app_metadata) for info in listed}
    assert set(about) == {b"units", b"upstream"}
    assert about[b"upstream"]["error"] == "RuntimeError: upstream API down"
    assert "error" not in about[b"units"]


@pytest.mark.parametrize(
    ("command", "error", "message"),
    [
        (table_command("nope"), pa.ArrowKeyError, "no table 'nope' in this coordinator's"),
        (table_command("units", [3, 1]), pa.ArrowInvalid, "partitions must be a positive even"),
        (table_command("units", [2]), pa.ArrowInvalid, "missing a required argument"),
        (table_command("units", ["x", 1]), pa.ArrowInvalid, "partitions must be int, got 'x'"),
        (b"\xff\xff", pa.ArrowInvalid, "not a TableQuery"),
    ],
)
async def test_bad_queries_get_clear_errors(
    command: bytes, error: type[Exception], message: str
) -> None:
    def ask(location: str) -> None:
        with fl.connect(location) as client:
            client.get_flight_info(fl.FlightDescriptor.for_command(command))

    async with service() as cluster:
        with pytest.raises(error, match=message):
            await in_thread(ask, cluster.location)


async def test_release_ends_a_query_that_is_not_read() -> None:
    def start_and_release(location: str) -> bytes:
        with fl.connect(location) as client:
            info = client.get_flight_info(
                fl.FlightDescriptor.for_command(table_command("units", [2, 10]))
            )
            list(client.do_action(fl.Action("release", info.app_metadata)))
            return bytes(info.app_metadata)

    async with service() as cluster:
        query_id = await in_thread(start_and_release, cluster.location)
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)
        assert query_id not in cluster.service.held


async def test_workers_that_cannot_decode_the_catalogs_plans_tell_each_reader_why() -> None:
    """Workers started apart, without the session builder that decodes the catalog's nodes: a
    reader's DoGet gets the worker's refusal of the plan (its status and message), not a "no
    plan arrived" after the whole plan wait."""
    config = WorkerConfig(plan_wait_timeout=20)  # (a reader that waits it out gets NotFound)

    def read_first_endpoint(location: str) -> None:
        with fl.connect(location) as client:
            info = client.get_flight_info(
                fl.FlightDescriptor.for_command(table_command("units", [2, 10]))
            )
        endpoint = info.endpoints[0]
        with fl.connect(endpoint.locations[0]) as worker:
            worker.do_get(endpoint.ticket).read_all()

    async with start_workers(2, config=config) as workers:
        urls = [w.location for w in workers]
        async with serve(catalog(), workers=urls, grace=0.01) as cluster:
            with anyio.fail_after(60), pytest.raises(pa.ArrowInvalid) as info:
                await in_thread(read_first_endpoint, cluster.location)
    message = str(info.value)
    assert "plan decode failed: unknown plan node kind 'UnitScan'" in message
    assert "register a codec in the session builder" in message
    assert "no plan for task" not in message


async def test_local_workers_on_every_interface_are_advertised_at_the_host_given() -> None:
    """On 0.0.0.0 a local worker would send readers to 127.0.0.1, which another machine's
    Spark executor cannot reach; `advertised_host` names it as the others know it."""
    async with serve(
        catalog(), local_workers=2, host="0.0.0.0", advertised_host="localhost", grace=0.01
    ) as cluster:
        assert all(w.location.startswith("grpc://localhost:") for w in cluster.workers)
        info, table = await in_thread(read_query, cluster.location, table_command("units", [4, 5]))
    assert {e.locations[0].uri.decode() for e in info.endpoints} == {
        w.location for w in cluster.workers
    }
    assert table.num_rows == 20


def moved_to(answers: list[fl.Result]) -> tuple[str, bytes]:
    """relocate's answer: the location and ticket to read the endpoint with now."""
    answer = json.loads(b"".join(r.body.to_pybytes() for r in answers))
    return answer["location"], bytes.fromhex(answer["ticket"])


def query_of(ticket: bytes) -> bytes:
    return task_id(parse_ticket(ticket).task_key).query_id


def read_ticket(location: str, ticket: bytes) -> pa.Table:
    with fl.connect(location) as worker:
        return worker.do_get(fl.Ticket(ticket)).read_all()


async def test_a_released_querys_endpoints_are_read_from_one_new_run_of_it() -> None:
    """Spark reads a DataFrame's endpoints again in every later query of it. Once the query
    was released, every such read failed ("run it again", which only a new DataFrame can do);
    now the reader's relocate starts the query again, one run for all its endpoints."""
    async with service() as cluster:
        info, first = await in_thread(read_query, cluster.location, table_command("units", [4, 5]))
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)  # read to its end: released
            await cluster.coordinator.metrics[bytes(info.app_metadata)].wait_finished()
        cluster.service.held  # (it forgets released queries)  # noqa: B018
        gc.collect()
        # Remembered without the run itself: a run holds its tasks' encoded plans.
        assert bytes(info.app_metadata) in cluster.service.reruns
        assert cluster.service.reruns.latest(bytes(info.app_metadata)) is None
        old = info.endpoints[0]
        with pytest.raises(pa.ArrowKeyError, match="released by its coordinator"):
            await in_thread(read_ticket, old.locations[0].uri.decode(), old.ticket.ticket)
        for run in range(2):  # (the new run is released in turn: the next reader starts another)
            moved: list[tuple[str, bytes]] = []

            async def ask(endpoint: fl.FlightEndpoint, moved: list[tuple[str, bytes]]) -> None:
                answer = await in_thread(act, cluster.location, "relocate", relocate_body(endpoint))
                moved.append(moved_to(answer))

            async with anyio.create_task_group() as readers:  # all at once, as Spark's tasks
                for endpoint in info.endpoints:
                    readers.start_soon(ask, endpoint, moved)
            queries = {query_of(ticket) for _, ticket in moved}
            assert len(queries) == 1, f"run {run}: one run for every endpoint"
            assert queries.isdisjoint({bytes(info.app_metadata)})
            again = [await in_thread(read_ticket, where, ticket) for where, ticket in moved]
            assert pa.concat_tables(again).sort_by("body").equals(first.sort_by("body"))
            with anyio.fail_after(10):
                await wait_for_no_tasks(cluster.workers)
        runs = list(cluster.coordinator.metrics)
        with anyio.fail_after(10):
            for metrics in runs:
                await metrics.wait_finished()
        assert [m.status for m in runs] == ["finished"] * 3


async def test_a_rerun_planned_to_another_shape_tells_its_reader_to_plan_anew() -> None:
    """A rerun must serve the endpoints its readers planned for: here the table has more
    partitions each time it is planned."""
    changing = catalog()
    calls = 0

    @changing.table("growing", description="two more partitions each time it is planned")
    def growing() -> ExecutionPlan:
        nonlocal calls
        calls += 1
        return unit_scan(UnitProvider([3] * 2 * calls))

    async with serve(changing, local_workers=2, grace=0.01) as cluster:
        info, _ = await in_thread(read_query, cluster.location, table_command("growing"))
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)
        body = relocate_body(info.endpoints[0])
        refused = (
            r"run again it has another shape \(2 task\(s\) of 2 partition\(s\); its readers"
            r" planned for 2 of 1\): run it anew"
        )
        with pytest.raises(pa.ArrowKeyError, match=refused):
            await in_thread(act, cluster.location, "relocate", body)
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)  # (the rerun refused is released)
        planned = calls
        # Every endpoint asks (a Spark query's every task): each started a run of its own, and
        # released it (found by a probe). They are told what the one run said.
        async with anyio.create_task_group() as readers:
            for endpoint in info.endpoints:
                readers.start_soon(refused_relocate, cluster.location, endpoint, refused)
        assert calls == planned


async def refused_relocate(location: str, endpoint: fl.FlightEndpoint, refused: str) -> None:
    with pytest.raises(pa.ArrowKeyError, match=refused):
        await in_thread(act, location, "relocate", relocate_body(endpoint))


@pytest.mark.parametrize("remembered", [0, 1])
async def test_relocate_of_a_released_query_no_longer_remembered_says_it_was_released(
    remembered: int,
) -> None:
    """A reader that could not reach a worker asks where its endpoint went. Once the query was
    released and forgotten (the service remembers a bounded number of queries), the answer was
    the endpoint itself, whose task was gone: the reader went back and got "no longer on this
    worker"."""
    async with service() as cluster:
        cluster.service.reruns = Reruns(max_queries=remembered)
        info, _ = await in_thread(read_query, cluster.location, table_command("units", [2, 5]))
        await in_thread(read_query, cluster.location, table_command("units", [2, 1]))  # (newer)
        with anyio.fail_after(10):
            await wait_for_no_tasks(cluster.workers)  # read to its end: released
        body = relocate_body(info.endpoints[0])
        forgotten = r"is held here \(released already, and no|it was released .*run it"
        with pytest.raises(pa.ArrowKeyError, match=forgotten):
            await in_thread(act, cluster.location, "relocate", body)
        assert len(cluster.service.reruns) == remembered


async def test_a_query_with_headers_past_their_budget_is_refused_and_others_run_on() -> None:
    """The coordinator sent a caller's 65,000-byte header to the workers with its own: past the
    worker's header limit, which closed the connection every query to it shared. Another
    reader's query failed with it (found by a probe)."""
    command = fl.FlightDescriptor.for_command(table_command("units", [2, 3]))

    def ask(location: str, size: int) -> fl.FlightInfo:
        call = fl.FlightCallOptions(headers=[(b"x-big", b"x" * size)])
        with fl.connect(location) as client:
            return client.get_flight_info(command, call)

    async with service() as cluster:
        started = await in_thread(ask, cluster.location, 8_000)  # (within the budget)
        with pytest.raises(pa.ArrowInvalid, match=r"headers take 20\d+ bytes .* at most 16384"):
            await in_thread(ask, cluster.location, 20_000)
        for endpoint in started.endpoints:  # the connection the workers share still serves
            table = await in_thread(
                read_ticket, endpoint.locations[0].uri.decode(), endpoint.ticket.ticket
            )
            assert table.num_rows == 3


async def test_a_huge_action_is_answered_at_once_with_a_bounded_message() -> None:
    """An action's type and a release's body were echoed whole in the error: a 1 MB one froze
    the coordinator's event loop for 20 s (the loop guard fails this test on such a stall), and
    pyarrow's client refused the reply's headers (over 16 KiB)."""
    async with service() as cluster:
        where = cluster.location
        with pytest.raises(pa.ArrowInvalid, match=r"unknown action 'xxxx.*bytes more, cut\)$"):
            await in_thread(act, where, "x" * 1_000_000, b"")
        with pytest.raises(pa.ArrowInvalid, match=r"release needs a query id.*got 4000000 bytes"):
            await in_thread(act, where, "release", b"\x01" * 4_000_000)
        with pytest.raises(pa.ArrowKeyError, match=r"no query 0{32} is held here"):
            await in_thread(act, where, "release", bytes(16))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "it nests too deep"),
        (b"[]", "an object with 'ticket'"),
        (b"null", "an object with 'ticket'"),
        (b'{"ticket": "00", "failed": 5}', "an object with 'ticket'"),
        (b'{"failed": "grpc://w:1"}', "an object with 'ticket'"),
        (b'{"ticket": "zz", "failed": "grpc://w:1"}', "'ticket' is not hex"),
        (b'{"ticket": "0a00", "failed": "grpc://w:1"}', "task_key.query_id is empty"),
    ],
)
async def test_a_malformed_relocate_says_what_it_needs(body: bytes, says: str) -> None:
    """Not Python's exception text ("'NoneType' object is not subscriptable"), nor INTERNAL
    with a traceback in the log for JSON nested deeper than the decoder recurses."""
    async with service() as cluster:
        with pytest.raises(pa.ArrowInvalid, match=f"relocate needs a JSON body, .*{says}|{says}"):
            await in_thread(act, cluster.location, "relocate", body)


async def test_relocate_away_from_a_worker_that_serves_says_so_at_once() -> None:
    """A reader that cannot reach a worker the coordinator reaches (an address readers cannot
    reach, advertised) waited 30 s for a move that never came, then failed as it would have at
    once: for every Spark task attempt."""
    async with service() as cluster:

        def flight_info() -> fl.FlightInfo:
            with fl.connect(cluster.location) as client:
                command = table_command("units", [2, 5])
                return client.get_flight_info(fl.FlightDescriptor.for_command(command))

        body = relocate_body((await in_thread(flight_info)).endpoints[0])
        with (
            anyio.fail_after(10),
            pytest.raises(
                fl.FlightUnavailableError,
                match="answers this coordinator, but the reader could not",
            ),
        ):
            await in_thread(act, cluster.location, "relocate", body)
