"""`flightfeed` as a user runs it: a real worker process on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers.coordinator_command import coordinator_command
from helpers.worker_process import start_line, start_worker
from helpers.worker_process import worker_process as live_worker

from flightfeed import cli
from flightfeed._version import __version__
from flightfeed.cli import build_parser, user_errors, worker_config
from flightfeed.cli import main as cli_main
from flightfeed.errors import InvalidArgument, Unavailable
from flightfeed.flight import KeepalivePolicy
from flightfeed.flight.connection_limits import ConnectionLimits
from flightfeed.flight.grpc import GrpcChannel
from flightfeed.flight.tuning import run
from flightfeed.worker import WorkerConfig


@pytest.fixture
def worker_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    with live_worker() as running:
        yield running


@pytest.mark.parametrize("module", ["flightfeed", "flightfeed.cli"])
def test_version_flag(module: str) -> None:
    """`python -m flightfeed` is the command too (it said "No module named
    flightfeed.__main__")."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"flightfeed {__version__}"


def test_python_m_flightfeed_exits_with_the_commands_status() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed", "worker", "--port", "99999"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "flightfeed worker: error: argument --port: must be a port" in out.stderr


def test_worker_serves_flight_and_worker_info(
    worker_process: tuple[subprocess.Popen[str], str],
) -> None:
    _, location = worker_process
    client = flight.connect(location)
    actions = {a.type for a in client.list_actions()}  # the Flight service answers on the port
    assert {"create_table", "count_rows", "commit_staged"} <= actions  # its tables' actions
    client.close()

    from flightfeed._generated.flightfeed.v1 import GetWorkerInfoRequest, WorkerServiceStub

    async def info() -> str:
        host, port = location.removeprefix("grpc://").split(":")
        channel = GrpcChannel(host, int(port))
        try:
            reply = await WorkerServiceStub(channel).get_worker_info(GetWorkerInfoRequest())
            return str(reply.version)
        finally:
            channel.close()

    assert run(info) == __version__


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_worker_shuts_down_gracefully_on_signal(
    worker_process: tuple[subprocess.Popen[str], str], signum: signal.Signals
) -> None:
    proc, location = worker_process
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "flightfeed worker stopped" in out
    with pytest.raises(flight.FlightUnavailableError):
        flight.connect(location).list_actions()


def test_unimplemented_rpc_and_bad_ticket(
    worker_process: tuple[subprocess.Popen[str], str],
) -> None:
    _, location = worker_process
    client = flight.connect(location)
    with pytest.raises(pa.ArrowNotImplementedError, match="holds no tables: start it with --data"):
        client.get_flight_info(flight.FlightDescriptor.for_path("x"))  # no --data-dir
    with pytest.raises(pa.ArrowInvalid, match="not a serialized ExecuteTaskRequest"):
        client.do_get(flight.Ticket(b"no such thing")).read_all()
    client.close()


def test_session_builder_loaded_by_import_path() -> None:
    """--session-builder pkg.module:func: the worker's sessions get that builder's UDFs."""
    from helpers.worker_plans import new_key, none_request, scan, set_plan, tag_udf

    from flightfeed.plan import Projection, call, col
    from flightfeed.protocol import WorkerClient
    from flightfeed.session import SessionStateBuilder

    proc, location = start_worker(
        "--session-builder", "helpers.worker_plans:header_session_builder"
    )
    planning = SessionStateBuilder().with_scalar_udf(tag_udf("planning")).build()
    plan = Projection(scan(1), [call("tag", col("k"))], ["tagged"], functions=planning)

    async def run_task() -> list[str]:
        key = new_key()
        async with (
            WorkerClient(location) as client,
            client.open_task(set_plan(plan, key), headers={"x-tag": "cli"}) as channel,
        ):
            async with client.execute_task(none_request(key, 0, 1)) as reader:
                table = await reader.read_all()
            await channel.wait_metrics()
        return [str(v) for v in table.column("tagged").to_pylist()]

    try:
        values = run(run_task)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert values
    assert all(v.startswith("cli:") for v in values)


def test_bad_session_builder_path_is_a_clear_error() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flightfeed.cli",
            "worker",
            "--port",
            "0",
            "--session-builder",
            "no_such_module_xyz:build",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2
    assert "flightfeed: error:" in out.stderr
    assert "no_such_module_xyz" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], KeepalivePolicy(interval=2.0, timeout=4.0)),  # silence noticed within 8 s
        (["--keepalive", "5", "--keepalive-timeout", "2.5"], KeepalivePolicy(5.0, 2.5)),
        (["--keepalive", "0"], None),
    ],
)
def test_worker_keepalive_options_shape_its_config(
    argv: list[str], expected: KeepalivePolicy | None
) -> None:
    args = build_parser().parse_args(["worker", *argv])
    assert worker_config(args).keepalive == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--keepalive", "-1"], "must be 0 or more seconds"),
        (["--keepalive-timeout", "0"], "must be more than 0 seconds"),
        (["--keepalive", "soon"], "must be a number of seconds, got 'soon'"),
        (["--data-dir", ""], "argument --data-dir: must name a directory, got an empty path"),
        (["--memory-limit", "1"], "must be at least 16MiB (a worker's queries need room), got"),
        (["--memory-limit", "15MiB"], "must be at least 16MiB"),
    ],
)
def test_bad_worker_options_are_refused_clearly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["worker", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_parquet_roots_are_made_absolute_and_default_to_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    assert worker_config(build_parser().parse_args(["worker"])).parquet_roots == ()
    monkeypatch.chdir(tmp_path)
    os.mkdir("lake")
    elsewhere = os.path.join(os.fspath(tmp_path), "elsewhere")
    os.mkdir(elsewhere)
    argv = ["worker", "--parquet-root", "lake", "--parquet-root", elsewhere]
    roots = worker_config(build_parser().parse_args(argv)).parquet_roots
    assert roots == (os.path.join(os.fspath(tmp_path), "lake"), elsewhere)


@pytest.mark.parametrize(
    ("root", "why"), [("missing", "no such directory"), ("a-file", "not a directory")]
)
def test_a_parquet_root_must_be_a_directory(
    root: str,
    why: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: os.PathLike[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A typo in --parquet-root was accepted: every ParquetScan under it then failed as a file
    that is not found."""
    monkeypatch.chdir(tmp_path)
    with open("a-file", "w"):
        pass
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["worker", "--parquet-root", root])
    assert exit_info.value.code == 2
    message = f"argument --parquet-root: must be an existing directory, got {root!r} ({why})"
    assert message in capsys.readouterr().err


def test_shared_memory_is_on_by_default_in_a_directory_or_off(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: os.PathLike[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    def shared_dir(*argv: str) -> str | None:
        return worker_config(build_parser().parse_args(["worker", *argv])).shared_memory_dir

    assert shared_dir() == WorkerConfig().shared_memory_dir == "/dev/shm"
    monkeypatch.chdir(tmp_path)
    os.mkdir("shm")
    assert shared_dir("--shared-memory-dir", "shm") == os.path.join(os.fspath(tmp_path), "shm")
    assert shared_dir("--no-shared-memory") is None
    with pytest.raises(SystemExit):
        shared_dir("--shared-memory-dir", "missing")
    assert "must be an existing directory, got 'missing'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        shared_dir("--shared-memory-dir", "shm", "--no-shared-memory")
    assert "not allowed with argument" in capsys.readouterr().err


def test_worker_connection_options_shape_its_limits() -> None:
    defaults = worker_config(build_parser().parse_args(["worker"])).connections
    assert defaults == ConnectionLimits()
    argv = ["--max-header-list-size", "16384", "--min-receive-rate", "0"]
    argv += ["--receive-grace", "2.5", "--idle-timeout", "0"]
    limits = worker_config(build_parser().parse_args(["worker", *argv])).connections
    assert limits.max_header_list_size == 16384
    assert limits.min_receive_rate is None  # 0: no minimum
    assert limits.receive_grace == 2.5
    assert limits.idle_timeout is None  # 0: never


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-header-list-size", "100"], "must be 1024 to 4294967295 bytes"),
        (["--max-header-list-size", str(2**32)], "must be 1024 to 4294967295 bytes"),
        (["--host", ""], "must name an interface"),
        (["--peer-tls-ca", "/no/such/ca.pem"], "(ca '/no/such/ca.pem' missing)"),
        (["--min-receive-rate", "fast"], "must be bytes per second, got 'fast'"),
        (["--receive-grace", "0"], "must be more than 0 seconds"),
        (["--idle-timeout", "-1"], "must be 0 or more seconds"),
    ],
)
def test_bad_connection_options_are_refused_clearly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything starts: 2^32 bytes of headers was taken, then every connection failed
    with a traceback; a missing peer CA file only surfaced at the first call to a peer."""
    try:
        code = cli_main(["worker", "--port", "0", *argv])
    except SystemExit as exit_info:  # argparse's refusal
        code = int(str(exit_info.code))
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("host", ["bad host!", "under_score.example", "trailing-.example", "a..b"])
def test_an_advertised_host_that_is_no_host_name_is_refused(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """'bad host!' started, and every query failed dialling the local workers there."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["coordinator", "--tables", "m:c", "--advertise-host", host])
    assert exit_info.value.code == 2
    assert f"must be a host name or an IP address, got {host!r}" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["my-host.example.com", "10.0.0.7", "::1", "localhost"])
def test_advertised_host_names_and_addresses_are_taken(host: str) -> None:
    args = build_parser().parse_args(["coordinator", "--tables", "m:c", "--advertise-host", host])
    assert args.advertise_host == host


def test_coordinator_serves_the_seed_scan_to_any_flight_client() -> None:
    """`flightfeed coordinator`: a process with a catalog and local workers; pyarrow's client
    runs the seed's scan through it, reading each endpoint from its worker."""
    from flightfeed.coordinator import table_command
    from flightfeed.examples.chunk_scan import scan_rows

    with coordinator_command("--local-workers", "2") as (proc, location, line):
        assert "(scan; 2 workers; bound to 127.0.0.1)" in line
        seed = (2, "3,1", "2", "4", "1,1")
        with flight.connect(location) as client:
            descriptor = flight.FlightDescriptor.for_command(table_command("scan", seed))
            info = client.get_flight_info(descriptor)
        parts = []
        for endpoint in info.endpoints:
            with flight.connect(endpoint.locations[0]) as worker:
                parts.append(worker.do_get(endpoint.ticket).read_all())
        got = pa.concat_tables(parts).sort_by([("task", "ascending"), ("partition", "ascending")])
        want = scan_rows(*seed).sort_by([("task", "ascending"), ("partition", "ascending")])
        assert got.equals(want)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_coordinator_names_the_workers_it_cannot_reach_at_start() -> None:
    """It starts (a worker may come up later), and its log says which workers it cannot reach
    now instead of leaving that to the first query."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        refused = f"grpc://127.0.0.1:{closed.getsockname()[1]}"
        with coordinator_command("--worker", refused) as (proc, _, _):
            assert proc.stderr is not None
            warning = proc.stderr.readline()
            assert f"WARNING flightfeed: {refused} did not answer GetWorkerInfo" in warning
            assert "Connection refused" in warning
            assert "queries run without it until it answers" in warning
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0


def test_coordinator_names_a_worker_that_never_answers_at_start() -> None:
    """A worker that takes the connection and never answers (a stopped one, a wrong service)
    was warned of as "no answer within the timeout", not naming it (found by a probe)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; nothing ever answers
        url = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        with coordinator_command("--worker", url) as (proc, _, _):
            assert proc.stderr is not None
            warning = proc.stderr.readline()
            assert f"WARNING flightfeed: worker {url}: no answer within the timeout" in warning
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0


def test_coordinator_without_workers_or_catalog_is_a_clear_error() -> None:
    run_cli = [sys.executable, "-m", "flightfeed.cli", "coordinator"]
    no_workers = subprocess.run(
        [*run_cli, "--tables", "flightfeed.examples.chunk_scan:catalog"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert no_workers.returncode == 2
    assert "give the workers: --worker URL (repeatable) or --local-workers N" in no_workers.stderr
    bad_catalog = subprocess.run(
        [*run_cli, "--tables", "no_such_module:catalog", "--local-workers", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad_catalog.returncode == 2
    assert "cannot import 'no_such_module'" in bad_catalog.stderr
    assert "Traceback" not in bad_catalog.stderr


def test_peers_default_to_any_and_are_listed_by_peer() -> None:
    assert worker_config(build_parser().parse_args(["worker"])).peers is None
    argv = ["worker", "--peer", "grpc://a:1", "--peer", "grpc://b:2"]
    assert worker_config(build_parser().parse_args(argv)).peers == frozenset(
        {"grpc://a:1", "grpc://b:2"}
    )


@pytest.mark.parametrize(
    "command",
    [
        ["worker"],
        [
            "coordinator",
            "--tables",
            "flightfeed.examples.chunk_scan:catalog",
            "--local-workers",
            "1",
        ],
    ],
    ids=["worker", "coordinator"],
)
def test_a_port_taken_is_a_one_line_error(command: list[str], taken_port: int) -> None:
    """It was an ExceptionGroup traceback ending in `OSError: [Errno 98]`."""
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", *command, "--port", str(taken_port)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"flightfeed: error: cannot listen on 127.0.0.1:{taken_port}: Address already in use"
    )


@pytest.mark.parametrize("command", [["worker"], ["coordinator", "--tables", "m:c"]])
@pytest.mark.parametrize("port", ["65536", "-1", "http"])
def test_a_port_out_of_range_is_refused_by_the_parser(
    command: list[str], port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--port", port])
    assert exit_info.value.code == 2
    assert "argument --port: must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--workers", "0"], "argument --workers: must be 1 or more, got 0"),
        (["coordinator", "--tables", "m:c", "--local-workers", "-1"], "must be 0 or more, got -1"),
    ],
)
def test_worker_counts_are_checked_by_the_parser(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --workers 0` was a ZeroDivisionError traceback."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--peer", "nonsense"],
        ["worker", "--advertise", "http://host:8000"],
        ["worker", "--advertise", "grpc://host:99999"],
        ["coordinator", "--tables", "m:c", "--worker", "grpc://host"],
    ],
)
def test_locations_are_checked_by_the_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed --peer or --advertise was accepted and could never match or be reached."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "unsupported Flight location" in capsys.readouterr().err


def test_log_levels_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown level was a ValueError traceback from logging, after the parse."""
    assert build_parser().parse_args(["--log-level", "warning", "demo"]).log_level == "WARNING"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--log-level", "verbose", "demo"])
    assert exit_info.value.code == 2
    assert "argument --log-level: invalid choice: 'VERBOSE'" in capsys.readouterr().err


def test_help_says_what_flightfeed_is_and_where_to_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Distributed query execution on Arrow Flight workers" in text
    assert "Start with `flightfeed demo`." in text


def test_well_formed_locations_are_kept_as_written() -> None:
    argv = ["worker", "--peer", "grpc://a:1", "--peer", "b:2", "--advertise", "grpc://[::1]:8000"]
    args = build_parser().parse_args(argv)
    assert (args.peer, args.advertise) == (["grpc://a:1", "b:2"], "grpc://[::1]:8000")


def test_a_data_dir_it_cannot_create_is_a_one_line_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    out = subprocess.run(
        [
            *[sys.executable, "-m", "flightfeed.cli", "worker", "--port", "0"],
            *["--data-dir", str(not_a_dir / "tables")],
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith(f"flightfeed: error: cannot keep tables in '{not_a_dir}/tables':")
    assert "Traceback" not in out.stderr


def test_a_data_dir_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    """It said "[Errno 17] File exists", as if the trouble were that something existed."""
    a_file = tmp_path / "tables.duckdb"
    a_file.write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.cli", "worker", "--port", "0", "--data-dir", a_file],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"flightfeed: error: cannot keep tables in '{a_file}': it is a file"
    )


def test_the_start_line_gives_the_location_then_what_an_operator_checks(tmp_path: Path) -> None:
    """It said only "listening on grpc://127.0.0.1:P", even when bound to every interface."""
    setup = ("--host", "0.0.0.0", "--memory-limit", "3GiB", "--data-dir", str(tmp_path / "t"))
    with live_worker(*setup) as (proc, location):
        line = start_line(proc)
    assert line.startswith(f"flightfeed worker listening on {location} (")
    assert location.startswith("grpc://127.0.0.1:")  # (the address to dial from here)
    expected = f"bound to every interface; memory limit 3.0 GiB; tables in {tmp_path / 't'})"
    assert line.rstrip().endswith(expected)


def test_user_errors_are_found_through_exception_groups() -> None:
    taken, bad = Unavailable("port taken"), InvalidArgument("bad option")
    group = BaseExceptionGroup("startup", [taken, ExceptionGroup("inner", [bad])])
    assert user_errors(group) == [taken, bad]
    assert user_errors(BaseExceptionGroup("mixed", [taken, KeyError("a bug")])) is None
    assert user_errors(KeyboardInterrupt()) is None


def test_an_interrupt_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_demo", interrupted)
    try:
        code = cli.main(["demo", "--no-spark"])
    except KeyboardInterrupt:  # (uncaught, it would stop the whole test run)
        pytest.fail("main let the interrupt through")
    assert code == 130
    assert capsys.readouterr().err == "flightfeed: interrupted\n"


def test_ctrl_c_while_waiting_on_a_worker_ends_without_a_traceback() -> None:
    """A real SIGINT, sent once the command has connected to a "worker" that never answers
    (a listening socket nobody serves), so it lands while the command waits."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        proc = subprocess.Popen(
            [
                *[sys.executable, "-m", "flightfeed.cli", "tables", "list"],
                *["--worker", f"grpc://127.0.0.1:{port}", "--timeout", "60"],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            silent.settimeout(60)
            connection, _ = silent.accept()  # the command is in its call now
            with connection:
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "flightfeed: interrupted"
    assert "Traceback" not in err


@pytest.mark.parametrize("after", [0.05, 0.3])
def test_ctrl_c_while_the_command_starts_ends_without_a_traceback(after: float) -> None:
    """Importing flightfeed takes a second or more, all of it before the command's own
    handling: a Ctrl-C then printed a KeyboardInterrupt traceback (found by a probe). The
    installed `flightfeed` command, a SIGINT early in its import."""
    command = Path(sys.executable).parent / "flightfeed"
    proc = subprocess.Popen(
        [str(command), "tables", "list", "--worker", "grpc://127.0.0.1:9"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.wait(timeout=after)  # (the moment it is given: it is still importing)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "flightfeed: interrupted"
    assert "Traceback" not in err
