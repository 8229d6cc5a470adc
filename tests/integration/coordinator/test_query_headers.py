"""Headers are per query: concurrent queries with different headers each run in sessions
built from their own headers, never from another query's."""

from __future__ import annotations

import anyio
import pyarrow as pa
import pytest
from helpers.worker_plans import tag_udf

from flightfeed.errors import InvalidArgument
from flightfeed.flight.request_headers import call_headers
from flightfeed.plan import Coalesce, Projection, call, col
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing import start_cluster
from flightfeed.testing.feeds import (
    UnitProvider,
    UnitScanCodec,
    unit_coordinator_options,
    unit_scan,
)

pytestmark = pytest.mark.anyio


async def tagging_session(ctx: WorkerQueryContext) -> Session:
    """The `tag` UDF marks every row with this request's `x-tag` header."""
    builder = ctx.builder.with_codec(UnitScanCodec())
    return builder.with_scalar_udf(tag_udf(ctx.headers.get("x-tag", "none"))).build()


def tagged_plan() -> Coalesce:
    typing_session = SessionStateBuilder().with_scalar_udf(tag_udf("planning")).build()
    scan = unit_scan(UnitProvider([50, 50, 50, 50]))
    tagged = Projection(scan, [call("tag", col("partition"))], ["tagged"], functions=typing_session)
    return Coalesce(tagged)


@pytest.mark.parametrize("in_process", [False, True], ids=["grpc", "in-process"])
async def test_concurrent_queries_each_run_with_their_own_headers(in_process: bool) -> None:
    results: dict[str, pa.Table] = {}
    async with start_cluster(
        2, session_builder=tagging_session, in_process=in_process, **unit_coordinator_options(2)
    ) as (coordinator, _):

        async def query(tag: str) -> None:
            results[tag] = await coordinator.collect(tagged_plan(), headers={"x-tag": tag})

        async with anyio.create_task_group() as tg:
            for tag in ("a", "b", "c"):
                tg.start_soon(query, tag)
        default = await coordinator.collect(tagged_plan())
    for tag, table in results.items():
        assert table.num_rows == 200
        assert {value.split(":")[0] for value in table.column("tagged").to_pylist()} == {tag}
    assert {value.split(":")[0] for value in default.column("tagged").to_pylist()} == {"none"}


async def test_header_names_in_any_case_reach_the_session_builder() -> None:
    async with start_cluster(2, session_builder=tagging_session, **unit_coordinator_options(2)) as (
        coordinator,
        _,
    ):
        table = await coordinator.collect(tagged_plan(), headers={"X-Tag": "upper"})
    assert {value.split(":")[0] for value in table.column("tagged").to_pylist()} == {"upper"}


@pytest.mark.parametrize(
    "headers", [{"bad header": "v"}, {"x-tag": "line\nbreak"}, {"grpc-timeout": "1S"}]
)
async def test_a_header_grpc_cannot_carry_fails_its_query_only(headers: dict[str, str]) -> None:
    """It was taken for a connection failure: retried, then every worker was left out of the
    next queries as unreachable ("no worker can be reached")."""
    async with start_cluster(2, session_builder=tagging_session, **unit_coordinator_options(2)) as (
        coordinator,
        _,
    ):
        with pytest.raises(InvalidArgument, match="header"):
            await coordinator.collect(tagged_plan(), headers=headers)
        after = await coordinator.collect(tagged_plan(), headers={"x-tag": "after"})
    assert after.num_rows == 200


async def test_a_repeated_header_is_refused_not_cut_to_one_value() -> None:
    """A served coordinator kept the last of a repeated header's values, without a word: the
    session builders saw `x-tag: two` where the caller also sent `x-tag: one`."""
    import pyarrow.flight as fl

    from flightfeed.cluster import serve
    from flightfeed.coordinator import table_command
    from flightfeed.examples.chunk_scan import catalog

    def query(location: str, headers: list[tuple[bytes, bytes]]) -> int:
        descriptor = fl.FlightDescriptor.for_command(table_command("scan", (1, "2")))
        with fl.connect(location) as client:
            info = client.get_flight_info(descriptor, fl.FlightCallOptions(headers=headers))
            return len(info.endpoints)

    async with serve(catalog(), local_workers=1) as cluster:
        repeated = [(b"x-tag", b"one"), (b"x-tag", b"two")]
        with pytest.raises(pa.ArrowInvalid, match="header 'x-tag' is repeated"):
            await anyio.to_thread.run_sync(query, cluster.location, repeated)
        assert await anyio.to_thread.run_sync(query, cluster.location, repeated[:1]) == 1


def test_a_header_named_twice_in_other_cases_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="'x-tag' is given twice"):
        call_headers({"X-Tag": "one", "x-tag": "two"})
