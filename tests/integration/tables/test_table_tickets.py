"""A table's endpoints as pyarrow's C++ Flight client reads them from a `flightfeed worker
--data-dir` process: a ticket streams the schema its FlightInfo announced, even after a column
is added, the endpoints of one FlightInfo read one snapshot of the table (again after it is
released, until a write), the ticket of a table
dropped since (and created again) is refused rather than read from the new table, and a read of
no columns counts the rows."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from anyio.from_thread import start_blocking_portal
from helpers.tables_cli import tables
from helpers.worker_process import worker_process

from flightfeed._generated.flightfeed.v1 import (
    CommitStaged,
    StagedAttempt,
    StagedWrite,
    TableCommand,
    TableRef,
    TableTicket,
)
from flightfeed.tables.flight import TABLE_TICKET_PREFIX
from flightfeed.tables.snapshots import MAX_SNAPSHOTS
from flightfeed.testing.proxy import tcp_proxy

ROWS = pa.table(
    {
        "ts": pa.array([1_700_000_000_000 + i for i in range(6)], pa.timestamp("ms")),
        "host": [f"h{i % 3}" for i in range(6)],
        "v": [i / 2 for i in range(6)],
    }
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with worker_process("--data-dir", str(tmp_path_factory.mktemp("tables"))) as (_, location):
        yield location


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> None:
    code, _, err = tables(capsys, *argv)
    assert (code, err) == (0, ""), err


def create_with_rows(capsys: pytest.CaptureFixture[str], worker: str, name: str) -> None:
    columns = ["--column", "ts:timestamp", "--column", "host:string:tag", "--column", "v:double"]
    run(capsys, "create", "--worker", worker, name, *columns)
    with flight.connect(worker) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path(name), ROWS.schema)
        writer.write_table(ROWS)
        writer.done_writing()
        reader.read()
        writer.close()


def sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = table.sort_by([("ts", "ascending")]).to_pylist()
    return rows


def test_a_ticket_streams_the_schema_its_flight_info_announced(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a column added between GetFlightInfo and DoGet was streamed: the batches did
    not have the schema the FlightInfo gave."""
    create_with_rows(capsys, worker, "announced")
    with flight.connect(worker) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("announced"))
        assert info.schema.names == ROWS.schema.names
        run(capsys, "alter", "--worker", worker, "announced", "--add-column", "region:string")
        got = pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)
        assert got.schema == info.schema
        assert sorted_rows(got) == ROWS.to_pylist()
        fresh = client.get_flight_info(flight.FlightDescriptor.for_path("announced"))
        assert fresh.schema.names == ["ts", "host", "v", "region"]
        (endpoint,) = fresh.endpoints
        assert client.do_get(endpoint.ticket).read_all().schema == fresh.schema


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_ticket_of_a_dropped_table_is_refused_even_when_its_name_is_taken_again(
    worker: str, capsys: pytest.CaptureFixture[str], partitions: int
) -> None:
    """Before, the old ticket read the new table's rows. In several partitions, the read holds
    a snapshot of the table: its tickets are refused all the same."""
    name = f"again_{partitions}"
    create_with_rows(capsys, worker, name)
    if partitions == 1:
        descriptor = flight.FlightDescriptor.for_path(name)
    else:
        command = TableCommand(version=1, table=TableRef(table=name), partitions=partitions)
        descriptor = flight.FlightDescriptor.for_command(bytes(command))
    with flight.connect(worker) as client:
        info = client.get_flight_info(descriptor)
        assert len(info.endpoints) == partitions
        ticket = info.endpoints[-1].ticket
        run(capsys, "drop", "--worker", worker, name)
        with pytest.raises(pa.ArrowKeyError, match=rf"no table 'flightfeed\.public\.{name}'"):
            client.do_get(ticket).read_all()
        create_with_rows(capsys, worker, name)
        with pytest.raises(pa.ArrowKeyError, match="dropped after this read was planned"):
            client.do_get(ticket).read_all()
        fresh = client.get_flight_info(descriptor)
        rows = pa.concat_tables(client.do_get(e.ticket).read_all() for e in fresh.endpoints)
        assert sorted_rows(rows) == ROWS.to_pylist()


@pytest.mark.parametrize(
    ("name", "fields", "message"),
    [
        ("short_version", {"snapshot_version": b"v" * 15}, "snapshot_version is 16 bytes, got 15"),
        ("lone_version", {"snapshot": b"", "snapshot_version": b"v" * 16}, "with its snapshot"),
        ("long_snapshot", {"snapshot": b"s" * 17}, "snapshot is 16 bytes, with its table id"),
    ],
)
def test_a_ticket_with_a_malformed_snapshot_is_refused(
    worker: str,
    capsys: pytest.CaptureFixture[str],
    name: str,
    fields: dict[str, bytes],
    message: str,
) -> None:
    create_with_rows(capsys, worker, name)
    command = TableCommand(version=1, table=TableRef(table=name), partitions=2)
    with flight.connect(worker) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(bytes(command)))
        ticket = TableTicket.parse(info.endpoints[0].ticket.ticket[len(TABLE_TICKET_PREFIX) :])
        for field, value in fields.items():
            setattr(ticket, field, value)
        forged = flight.Ticket(TABLE_TICKET_PREFIX + bytes(ticket))
        with pytest.raises(pa.ArrowInvalid, match=message):
            client.do_get(forged).read_all()


def test_a_read_of_no_columns_streams_the_rows_without_their_values(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a TableCommand could not ask for no columns: an empty list reads every column
    (proto3 cannot tell it from none), so counting rows streamed all their values."""
    create_with_rows(capsys, worker, "counted")

    def command(**fields: object) -> flight.FlightDescriptor:
        message = TableCommand(version=1, table=TableRef(table="counted"), **fields)
        return flight.FlightDescriptor.for_command(bytes(message))

    with flight.connect(worker) as client:
        info = client.get_flight_info(command(no_columns=True, partitions=2, start_ms=0))
        assert info.schema.names == []
        first = client.do_get(info.endpoints[0].ticket).read_all()
        run(capsys, "alter", "--worker", worker, "counted", "--add-column", "region:string")
        read = [client.do_get(e.ticket).read_all() for e in info.endpoints]
        assert [t.schema.names for t in [first, *read]] == [[], [], []]
        assert sum(t.num_rows for t in read) == ROWS.num_rows
        with pytest.raises(pa.ArrowInvalid, match="no_columns names no columns, got"):
            client.get_flight_info(command(no_columns=True, columns=["v"]))


def stage(client: flight.FlightClient, name: str, rows: pa.Table, job: str) -> None:
    """What a Spark task does: stage its rows as attempt 1 of partition 0 of `job`."""
    staged = StagedWrite(job=job, partition=0, attempt=1)
    command = TableCommand(version=1, table=TableRef(table=name), staged=staged)
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(bytes(command)), rows.schema)
    writer.write_table(rows)
    writer.done_writing()
    reader.read()
    writer.close()


def overwrite(client: flight.FlightClient, name: str, rows: pa.Table, job: str) -> None:
    """What a Spark write with mode overwrite does: stage the rows, then commit them as the
    table's every row."""
    stage(client, name, rows, job)
    commit = CommitStaged(
        table=TableRef(table=name),
        job=job,
        attempts=[StagedAttempt(partition=0, attempt=1)],
        overwrite=True,
    )
    list(client.do_action(flight.Action("commit_staged", bytes(commit))))


def test_the_endpoints_of_one_flight_info_read_one_version_of_the_table(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, each ticket read the table as it was when redeemed: a Spark overwrite between
    two partitions' reads gave 9 rows of 6 keys, of both versions. Once every endpoint was
    read, the snapshot goes: a ticket then is refused, never read from the newer rows, unless
    nothing was written since (a Spark task retried after its read): then it reads again."""
    create_with_rows(capsys, worker, "versions")
    command = TableCommand(version=1, table=TableRef(table="versions"), partitions=2)
    descriptor = flight.FlightDescriptor.for_command(bytes(command))
    newer = ROWS.set_column(2, "v", pa.array([10.0] * 6))
    with flight.connect(worker) as client:
        info = client.get_flight_info(descriptor)
        first = client.do_get(info.endpoints[0].ticket).read_all()
        overwrite(client, "versions", newer, "versions-overwrite")
        retried = client.do_get(info.endpoints[0].ticket).read_all()
        assert retried.equals(first)
        second = client.do_get(info.endpoints[1].ticket).read_all()
        assert sorted_rows(pa.concat_tables([first, second])) == ROWS.to_pylist()
        with pytest.raises(pa.ArrowKeyError, match=r"no longer held.*Plan the read again"):
            client.do_get(info.endpoints[1].ticket).read_all()
        fresh = client.get_flight_info(descriptor)
        now = [client.do_get(e.ticket).read_all() for e in fresh.endpoints]
        assert sorted_rows(pa.concat_tables(now)) == newer.to_pylist()
        again = [client.do_get(e.ticket).read_all() for e in reversed(fresh.endpoints)]
        assert list(reversed(again)) == now


def test_a_host_planning_reads_in_a_loop_releases_its_own_snapshots(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Spark job's read planned from one host, read midway; another host plans twice the
    worker's cap of reads without reading them, and a write commits. Before, each of those
    reads made room by releasing the snapshot due first, the job's among them, and its next
    ticket was NOT_FOUND; now the host planning the most makes room with its own."""
    create_with_rows(capsys, worker, "fair")
    command = TableCommand(version=1, table=TableRef(table="fair"), partitions=2)
    descriptor = flight.FlightDescriptor.for_command(bytes(command))
    newer = ROWS.set_column(2, "v", pa.array([10.0] * 6))
    with (
        flight.connect(worker) as job,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(tcp_proxy(worker, source_host="127.0.0.2")) as proxy,
        flight.connect(proxy.location) as other_host,
    ):
        info = job.get_flight_info(descriptor)
        first = job.do_get(info.endpoints[0].ticket).read_all()
        for _ in range(2 * MAX_SNAPSHOTS):
            assert len(other_host.get_flight_info(descriptor).endpoints) == 2
        overwrite(job, "fair", newer, "fair-overwrite")
        second = job.do_get(info.endpoints[1].ticket).read_all()
        assert sorted_rows(pa.concat_tables([first, second])) == ROWS.to_pylist()


@pytest.mark.parametrize(
    ("series", "sequence", "message"),
    [
        ("", 1, "bad series ''"),
        ("q" * 257, 1, "bad series"),
        ("q", 1 << 63, "bad sequence"),
    ],
)
def test_a_commit_of_a_bad_series_is_refused_and_publishes_nothing(
    worker: str, capsys: pytest.CaptureFixture[str], series: str, sequence: int, message: str
) -> None:
    name = f"series_{len(series)}_{sequence.bit_length()}"
    create_with_rows(capsys, worker, name)
    with flight.connect(worker) as client:
        stage(client, name, ROWS, "spark-stream-q-1")
        commit = CommitStaged(
            table=TableRef(table=name),
            job="spark-stream-q-1",
            attempts=[StagedAttempt(partition=0, attempt=1)],
            series=series,
            sequence=sequence,
        )
        with pytest.raises(pa.ArrowInvalid, match=message):
            list(client.do_action(flight.Action("commit_staged", bytes(commit))))
        (endpoint,) = client.get_flight_info(flight.FlightDescriptor.for_path(name)).endpoints
        assert client.do_get(endpoint.ticket).read_all().num_rows == ROWS.num_rows


def test_a_doput_whose_dictionaries_decode_past_the_limit_is_refused_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], worker: str
) -> None:
    """A 1 MB DoPut of one 1 MiB dictionary value and 3,000 indices took the worker to 3 GB
    before Arrow refused it: staging counted rows, and storing a dictionary decodes it (found
    by a probe). 2,100 indices decode to 2.2 GB, past the 2 GiB one batch may take."""
    create_with_rows(capsys, worker, "bombed")
    count = 2_100
    host = pa.DictionaryArray.from_arrays(
        pa.array([0] * count, pa.int16()), pa.array(["h" * (1 << 20)])
    )
    rows = pa.table(
        {
            "ts": pa.array(range(count), pa.timestamp("ms")),
            "host": host,
            "v": pa.array([0.5] * count),
        }
    )

    def put() -> None:
        with flight.connect(worker) as client:
            writer, reader = client.do_put(flight.FlightDescriptor.for_path("bombed"), rows.schema)
            writer.write_table(rows)
            writer.done_writing()
            reader.read()
            writer.close()

    refused = "RESOURCE_EXHAUSTED.*dictionary columns decode to 2202026400 bytes"
    with pytest.raises(pa.ArrowException, match=refused):
        put()
    code, out, _ = tables(capsys, "count", "--worker", worker, "bombed")
    assert (code, out.strip()) == (0, str(ROWS.num_rows))  # nothing of it was written
