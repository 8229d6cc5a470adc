"""`flightfeed tables` as an operator runs it, against a real `flightfeed worker --data-dir`
process: create, describe (text and JSON), list, alter, count and drop, and the errors an
operator meets (unknown table, bad column spec, stale schema version, unreachable worker), each
one line on stderr naming the command, the table and the worker, with its exit status.

The commands run in this process through `flightfeed.cli.main` (fast); one test runs them as
processes, as a shell does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers.tables_cli import tables
from helpers.worker_process import TESTS_DIR
from helpers.worker_process import worker_process as live_worker


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One worker with a data directory for the module; every test uses tables of its own."""
    data_dir = tmp_path_factory.mktemp("tables")
    with live_worker("--data-dir", str(data_dir)) as (_, location):
        yield location


def create(capsys: pytest.CaptureFixture[str], worker: str, name: str, *extra: str) -> None:
    argv = ["--column", "ts:timestamp", "--column", "host:string:tag", "--column", "v:double"]
    code, out, err = tables(capsys, "create", "--worker", worker, name, *argv, *extra)
    assert (code, err) == (0, ""), err
    assert out.startswith("created table "), out


def described(capsys: pytest.CaptureFixture[str], worker: str, name: str) -> dict[str, object]:
    code, out, err = tables(capsys, "describe", "--worker", worker, name, "--json")
    assert (code, err) == (0, ""), err
    found: dict[str, object] = json.loads(out)
    return found


def one_error_line(err: str, command: str, table: str, worker: str) -> str:
    """The error's one line, which names the command, the table and the worker; its reason."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = f"flightfeed: error: {command} {table} on {worker}: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix) :]


def put_rows(worker: str, path: list[str], rows: pa.Table) -> None:
    """Rows written as any Flight client writes them: pyarrow's DoPut, a PATH descriptor."""
    with flight.connect(worker) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path(*path), rows.schema)
        writer.write_table(rows)
        writer.done_writing()
        reader.read()
        writer.close()


def cpu_rows(count: int) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([1_700_000_000_000 + i for i in range(count)], pa.timestamp("ms")),
            "host": [f"h{i % 3}" for i in range(count)],
            "v": [i / 2 for i in range(count)],
        }
    )


def test_create_then_describe_as_text_and_json(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tables(
        capsys, "create", "--worker", worker, "cpu",
        "--column", "ts:timestamp", "--column", "host:string:tag", "--column", "v:double",
        "--option", "update_mode=APPEND",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out == (
        f"created table flightfeed.public.cpu on {worker}: 3 columns, timestamp ts,"
        " primary key (host, ts)\n"
    )

    code, out, err = tables(capsys, "describe", "--worker", worker, "cpu")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "table           flightfeed.public.cpu",
        f"worker          {worker}",
        "table id        1",
        "engine          DuckDB",
        "schema version  1",
        "timestamp       ts",
        "primary key     host, ts",
        "options         enable_ttl=false, update_mode=APPEND",
        "",
        "id  name  type       nullable  tag  key",
        "1   ts    timestamp  no        no   yes",
        "2   host  string     no        yes  yes",
        "3   v     double     yes       no   no",
    ]

    assert described(capsys, worker, "flightfeed.public.cpu") == {
        "worker": worker,
        "table": "flightfeed.public.cpu",
        "catalog": "flightfeed",
        "schema": "public",
        "name": "cpu",
        "table_id": 1,
        "engine": "DuckDB",
        "schema_version": 1,
        "timestamp": "ts",
        "primary_key": ["host", "ts"],
        "columns": [
            {"id": 1, "name": "ts", "type": "timestamp", "arrow_type": "timestamp[ms]",
             "nullable": False, "tag": False, "key": True, "comment": ""},
            {"id": 2, "name": "host", "type": "string", "arrow_type": "string",
             "nullable": False, "tag": True, "key": True, "comment": ""},
            {"id": 3, "name": "v", "type": "double", "arrow_type": "double",
             "nullable": True, "tag": False, "key": False, "comment": ""},
        ],
        "options": {"enable_ttl": "false", "update_mode": "APPEND"},
    }  # fmt: skip


def test_arrow_type_names_flags_timestamp_key_and_ttl(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arrow's names of the types, `notnull`, two timestamp columns (so --timestamp names one),
    a primary key of our choosing and a TTL, in a catalog and schema of their own."""
    code, out, err = tables(
        capsys, "create", "--worker", worker, "ops.web.requests",
        "--column", "at:TIMESTAMP[ms]", "--column", "seen:timestamp", "--column", "path:utf8",
        "--column", "status:int32:notnull", "--column", "bytes:UINT64", "--column", "ok:boolean",
        "--timestamp", "at", "--primary-key", "path, at", "--option", "ttl=7d",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert "primary key (path, at)" in out
    info = described(capsys, worker, "ops.web.requests")
    assert (info["catalog"], info["schema"], info["name"]) == ("ops", "web", "requests")
    assert (info["timestamp"], info["primary_key"]) == ("at", ["path", "at"])
    columns = info["columns"]
    assert isinstance(columns, list)
    assert [(c["name"], c["type"], c["nullable"], c["key"]) for c in columns] == [
        ("at", "timestamp", False, True),
        ("seen", "timestamp", True, False),
        ("path", "string", False, True),
        ("status", "int32", False, False),
        ("bytes", "uint64", True, False),
        ("ok", "bool", True, False),
    ]
    assert info["options"] == {"enable_ttl": "true", "ttl": "7d", "update_mode": "OVERWRITE"}


def test_list_of_a_worker_without_tables_says_so_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed nothing at all, as if the command had not reached the worker."""
    with live_worker("--data-dir", str(tmp_path)) as (_, location):
        code, out, err = tables(capsys, "list", "--worker", location)
        assert (code, out, err) == (0, "", f"no tables on {location}\n")
        code, out, err = tables(capsys, "list", "--worker", location, "--json")
        assert (code, json.loads(out), err) == (0, [], "")


def test_list_of_a_worker_that_holds_no_tables_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker started without --data-dir (or a coordinator) listed as "no tables", exit 0, as
    if it were a worker whose tables were all dropped."""
    with live_worker() as (_, location):
        for json_flag in ([], ["--json"]):
            code, out, err = tables(capsys, "list", "--worker", location, *json_flag)
            assert (code, out) == (1, "")
            assert err == (
                f"flightfeed: error: list tables on {location}: the worker does not serve"
                " RemoteEngineService (a flightfeed worker serves tables when started with"
                " --data-dir DIR)\n"
            )


def test_list_names_every_table(worker: str, capsys: pytest.CaptureFixture[str]) -> None:
    create(capsys, worker, "listed_a")
    create(capsys, worker, "a.b.listed_b")
    code, out, err = tables(capsys, "list", "--worker", worker)
    assert (code, err) == (0, "")
    names = out.splitlines()
    assert {"flightfeed.public.listed_a", "a.b.listed_b"} <= set(names)
    assert names == sorted(names)

    code, out, err = tables(capsys, "list", "--worker", worker, "--json")
    assert (code, err) == (0, "")
    by_name = {entry["table"]: entry for entry in json.loads(out)}
    assert by_name["a.b.listed_b"] == {
        "table": "a.b.listed_b",
        "catalog": "a",
        "schema": "b",
        "name": "listed_b",
        "columns": [
            {"name": "ts", "arrow_type": "timestamp[ms]"},
            {"name": "host", "arrow_type": "string"},
            {"name": "v", "arrow_type": "double"},
        ],
    }


def test_a_table_name_with_dots_is_quoted(worker: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the table named "d.o.t" (of the default catalog and schema) and table t of
    catalog d, schema o were both listed as d.o.t, the first could not be named, and
    `drop d.o.t` dropped the second."""
    create(capsys, worker, '"d.o.t"', "--option", "update_mode=APPEND")
    create(capsys, worker, "d.o.t")
    put_rows(worker, ["d.o.t"], cpu_rows(2))  # (a Flight path of one part: the dotted name)
    names = tables(capsys, "list", "--worker", worker)[1].splitlines()
    assert {'flightfeed.public."d.o.t"', "d.o.t"} <= set(names)
    for name in ('"d.o.t"', 'flightfeed.public."d.o.t"', 'flightfeed."public"."d.o.t"'):
        assert tables(capsys, "count", "--worker", worker, name) == (0, "2\n", "")
    assert tables(capsys, "count", "--worker", worker, "d.o.t") == (0, "0\n", "")
    code, out, err = tables(capsys, "drop", "--worker", worker, '"d.o.t"')
    assert (code, out, err) == (
        0,
        f'dropped table flightfeed.public."d.o.t" on {worker}\n',
        "",
    )
    names = tables(capsys, "list", "--worker", worker)[1].splitlines()
    assert "d.o.t" in names
    assert 'flightfeed.public."d.o.t"' not in names
    code, out, err = tables(capsys, "count", "--worker", worker, '"d.o.t')
    assert (code, out) == (2, "")
    assert "a table name's quote is not closed" in err


def test_count_the_rows_written_through_flight(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(capsys, worker, "counted", "--option", "update_mode=APPEND")
    assert tables(capsys, "count", "--worker", worker, "counted") == (0, "0\n", "")
    put_rows(worker, ["counted"], cpu_rows(5))
    put_rows(worker, ["flightfeed", "public", "counted"], cpu_rows(3))
    counted = tables(capsys, "count", "--worker", worker, "flightfeed.public.counted")
    assert counted == (0, "8\n", "")


def test_alter_adds_columns_then_sets_a_ttl(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(capsys, worker, "altered")
    code, out, err = tables(
        capsys, "alter", "--worker", worker, "altered",
        "--add-column", "region:utf8", "--add-column", "cores:int64", "--schema-version", "1",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert out == (
        f"altered table flightfeed.public.altered on {worker}: added column(s) region, cores"
        " (schema version 1 → 2)\n"
    )
    code, out, err = tables(capsys, "alter", "--worker", worker, "altered", "--option", "ttl=30d")
    assert (code, err) == (0, ""), err
    assert out.endswith("options now enable_ttl=true, ttl=30d, update_mode=OVERWRITE\n")

    info = described(capsys, worker, "altered")
    assert info["schema_version"] == 2
    assert info["options"] == {"enable_ttl": "true", "ttl": "30d", "update_mode": "OVERWRITE"}
    columns = info["columns"]
    assert isinstance(columns, list)
    assert [(c["id"], c["name"], c["type"], c["nullable"]) for c in columns[3:]] == [
        (4, "region", "string", True),
        (5, "cores", "int64", True),
    ]
    # the new columns take rows at once (rows of now: within the TTL)
    now_ms = int(time.time() * 1000)
    rows = pa.table(
        {
            "ts": pa.array([now_ms, now_ms + 1], pa.timestamp("ms")),
            "host": ["a", "b"],
            "cores": pa.array([4, 8], pa.int64()),
        }
    )
    put_rows(worker, ["altered"], rows)
    assert tables(capsys, "count", "--worker", worker, "altered") == (0, "2\n", "")


def test_alter_against_a_stale_schema_version_changes_nothing(
    worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(capsys, worker, "stale")
    assert tables(capsys, "alter", "--worker", worker, "stale", "--add-column", "a:int8")[0] == 0
    code, out, err = tables(
        capsys, "alter", "--worker", worker, "stale",
        "--add-column", "b:int8", "--option", "ttl=1d", "--schema-version", "1",
    )  # fmt: skip
    assert (code, out) == (1, "")
    reason = one_error_line(err, "alter", "flightfeed.public.stale", worker)
    assert reason == "the table is at schema version 2, not 1 (--schema-version): describe it again"
    info = described(capsys, worker, "stale")
    assert info["schema_version"] == 2
    assert info["options"] == {"enable_ttl": "false", "update_mode": "OVERWRITE"}


@pytest.mark.parametrize(
    ("name", "argv", "reason"),
    [
        ("r1", ["--add-column", "v:int64"], "column(s) ['v'] exist already or are added twice"),
        ("r6", ["--add-column", "V:int64"], "column(s) ['V'] exist already or are added twice"),
        ("r2", ["--add-column", "w:int64:notnull"], "an added column is nullable and not a tag:"),
        ("r3", ["--option", "update_mode=APPEND"], "a table's update_mode cannot change"),
        ("r4", ["--option", "ttl=soon"], "bad duration 'soon'"),
        # checked before either change: the column is not added either
        ("r5", ["--add-column", "w:int64", "--option", "colour=red"], "unknown table option(s)"),
    ],
)
def test_alter_that_the_table_refuses(
    worker: str, capsys: pytest.CaptureFixture[str], name: str, argv: list[str], reason: str
) -> None:
    create(capsys, worker, name)
    code, out, err = tables(capsys, "alter", "--worker", worker, name, *argv)
    assert (code, out) == (1, "")
    assert one_error_line(err, "alter", f"flightfeed.public.{name}", worker).startswith(reason)
    assert described(capsys, worker, name)["schema_version"] == 1


def test_drop(worker: str, capsys: pytest.CaptureFixture[str]) -> None:
    create(capsys, worker, "dropped")
    code, out, err = tables(capsys, "drop", "--worker", worker, "dropped")
    assert (code, out, err) == (0, f"dropped table flightfeed.public.dropped on {worker}\n", "")
    assert "flightfeed.public.dropped" not in tables(capsys, "list", "--worker", worker)[1]
    code, out, err = tables(capsys, "drop", "--worker", worker, "dropped")
    assert (code, out) == (1, "")
    reason = one_error_line(err, "drop", "flightfeed.public.dropped", worker)
    assert reason == "no table 'flightfeed.public.dropped'"
    code, out, err = tables(capsys, "drop", "--worker", worker, "dropped", "--if-exists")
    assert (code, out, err) == (
        0,
        f"no table flightfeed.public.dropped on {worker}; nothing dropped\n",
        "",
    )


def test_create_if_not_exists(worker: str, capsys: pytest.CaptureFixture[str]) -> None:
    create(capsys, worker, "twice")
    again = ["--column", "ts:timestamp", "--column", "host:string:tag", "--column", "v:double"]
    code, out, err = tables(capsys, "create", "--worker", worker, "twice", *again)
    assert (code, out) == (1, "")
    reason = one_error_line(err, "create", "flightfeed.public.twice", worker)
    assert reason == "table flightfeed.public.twice exists already"
    code, out, err = tables(
        capsys, "create", "--worker", worker, "twice", *again, "--if-not-exists"
    )
    assert (code, err) == (0, "")
    assert out == f"table flightfeed.public.twice exists already on {worker}; nothing created\n"
    # other columns under the same name: still an error
    other = ["--column", "ts:timestamp", "--column", "x:int64", "--if-not-exists"]
    assert tables(capsys, "create", "--worker", worker, "twice", *other)[0] == 1


@pytest.mark.parametrize("command", ["describe", "count", "drop", "alter"])
def test_unknown_table(worker: str, capsys: pytest.CaptureFixture[str], command: str) -> None:
    extra = ["--option", "ttl=1d"] if command == "alter" else []
    code, out, err = tables(capsys, command, "--worker", worker, "x.y.nothing", *extra)
    assert (code, out) == (1, "")
    assert one_error_line(err, command, "x.y.nothing", worker) == "no table 'x.y.nothing'"


@pytest.mark.parametrize(
    ("columns", "reason"),
    [
        (["ts"], "a column is NAME:TYPE[:tag][:notnull], got 'ts'"),
        (["ts:timestamp", "v:decimal"], "column 'v:decimal': unknown column type 'decimal':"),
        (["ts:timestamp", "v:halffloat"], "column 'v:halffloat': a table column cannot be of"),
        (["ts:timestamp[us]"], "column 'ts:timestamp[us]': column type 'timestamp[us]': tables"),
        (["ts:timestamp", "v:int64:key"], "column 'v:int64:key': unknown flag(s) ['key']"),
        (["ts:timestamp", "v:double:tag"], "tag 'v' cannot be floating point"),
        (["v:double"], "no column is of type timestamp"),
        (["a:timestamp", "b:timestamp"], "columns ['a', 'b'] are of type timestamp"),
        (["ts:timestamp", "ts:int64"], "column names must be distinct"),
        (["TS:timestamp", "ts:int64"], "column names must be distinct, ignoring case, got ['TS',"),
        ([], "a table needs columns: --column NAME:TYPE"),
    ],
)
def test_bad_column_specs_send_nothing(
    worker: str, capsys: pytest.CaptureFixture[str], columns: list[str], reason: str
) -> None:
    argv = [arg for column in columns for arg in ("--column", column)]
    code, out, err = tables(capsys, "create", "--worker", worker, "never", *argv)
    assert (code, out) == (2, "")
    assert one_error_line(err, "create", "flightfeed.public.never", worker).startswith(reason)
    assert tables(capsys, "count", "--worker", worker, "never")[0] == 1


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--option", "ttl=7x"], "bad duration '7x'"),
        (["--option", "colour=red"], "unknown table option(s) ['colour']"),
        (["--option", "ttl"], "an option is KEY=VALUE, got 'ttl'"),
        (["--option", "ttl=1d", "--option", "ttl=2d"], "option ttl is given twice"),
        (["--primary-key", "ts,,v"], "a primary key is COLUMN,COLUMN,..."),
        (["--primary-key", "v"], "the primary key ['v'] must hold 'ts'"),
        (["--timestamp", "v"], "the timestamp column 'v' must be a non-null TIMESTAMP"),
    ],
)
def test_bad_options_send_nothing(
    worker: str, capsys: pytest.CaptureFixture[str], argv: list[str], reason: str
) -> None:
    columns = ["--column", "ts:timestamp", "--column", "v:double"]
    code, out, err = tables(capsys, "create", "--worker", worker, "never", *columns, *argv)
    assert (code, out) == (2, "")
    assert one_error_line(err, "create", "flightfeed.public.never", worker).startswith(reason)


def test_bad_table_name_and_worker_url(worker: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = tables(capsys, "count", "--worker", worker, "a.b")
    assert (code, out) == (2, "")
    assert one_error_line(err, "count", "'a.b'", worker) == (
        "a table is TABLE or CATALOG.SCHEMA.TABLE, got 'a.b' (a name with a dot in it is"
        """ quoted: '"a.b"')"""
    )
    code, out, err = tables(capsys, "count", "--worker", "http://x:1", "t")
    assert (code, out) == (2, "")
    assert "unsupported Flight location 'http://x:1'" in err


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("command", ["list", "describe", "count"])
def test_unreachable_worker(capsys: pytest.CaptureFixture[str], command: str) -> None:
    nowhere = f"grpc://127.0.0.1:{free_port()}"
    name = [] if command == "list" else ["t"]
    code, out, err = tables(capsys, command, "--worker", nowhere, *name)
    assert (code, out) == (1, "")
    subject = "tables" if command == "list" else "flightfeed.public.t"
    assert one_error_line(err, command, subject, nowhere).startswith("cannot reach the worker (")


@pytest.mark.parametrize("command", ["describe", "count"])
def test_a_silent_port_times_out(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """A port that accepts connections and never answers: the command gives up in time."""
    with closing(socket.socket()) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        code, out, err = tables(capsys, command, "--worker", url, "--timeout", "0.3", "t")
    assert (code, out) == (1, "")
    assert one_error_line(err, command, "flightfeed.public.t", url) == "no answer within 0.3 s"


def test_as_processes(worker: str, tmp_path: Path) -> None:
    """As a shell runs it: output on stdout, a refusal as one line on stderr, no traceback."""
    run_cli = [sys.executable, "-m", "flightfeed.cli", "tables"]
    env = {**os.environ, "PYTHONPATH": TESTS_DIR}
    ok = subprocess.run(
        [*run_cli, "create", "--worker", worker, "proc", "--column", "ts:timestamp"],
        capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert (ok.returncode, ok.stderr) == (0, ""), ok.stderr
    assert ok.stdout.startswith("created table flightfeed.public.proc")
    refused = subprocess.run(
        [*run_cli, "describe", "--worker", worker, "no_such_table"],
        capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr == (
        f"flightfeed: error: describe flightfeed.public.no_such_table on {worker}:"
        " no table 'flightfeed.public.no_such_table'\n"
    )


def test_a_reader_that_leaves_early_ends_the_command_quietly(worker: str) -> None:
    """`flightfeed tables describe ... --json | head`: a BrokenPipeError traceback, exit 1.
    As a Unix tool, it stops with the status a SIGPIPE gives (141) and says nothing."""
    env = {**os.environ, "PYTHONPATH": TESTS_DIR}
    command = [sys.executable, "-m", "flightfeed.cli", "tables", "list", "--worker", worker]
    command += ["--json"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()  # before it prints: its first write finds no reader
        err = proc.stderr.read()
        code = proc.wait(timeout=60)
    assert (code, err) == (141, "")
