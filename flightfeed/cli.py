"""`flightfeed` command line: arguments → config → run.

flightfeed worker --host 0.0.0.0 --port 8000 [--session-builder pkg.module:func]
                  [--keepalive SECONDS] [--keepalive-timeout SECONDS]
                  [--handshake-timeout SECONDS] [--max-connections N]
                  [--plan-wait-timeout SECONDS] [--memory-limit SIZE] [--parquet-root DIR]
                  [--peer URL] [--data-dir DIR] [--table-compression auto|always|never]
                  [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--peer-tls-ca PEM]
                  [--auth-token-file FILE] [--shutdown-grace|--drain-timeout SECONDS]
                  [--fanout-claim-timeout SECONDS]
                  [--max-header-list-size BYTES] [--min-receive-rate BYTES_PER_SECOND]
                  [--receive-grace SECONDS] [--idle-timeout SECONDS]
                  [--shared-memory-dir DIR | --no-shared-memory]
flightfeed coordinator --port 8815 --tables pkg.module:catalog
                  (--worker grpc://host:port ... | --local-workers N [--advertise-host HOST])
                  [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--peer-tls-ca PEM]
flightfeed demo      the main job on an embedded default (see README)
flightfeed tables list     --worker URL [--json]
flightfeed tables create   --worker URL NAME --column NAME:TYPE[:tag][:notnull] ...
                  [--timestamp COLUMN] [--primary-key COLUMN,...] [--option KEY=VALUE ...]
                  [--if-not-exists]
flightfeed tables describe --worker URL NAME [--json]
flightfeed tables alter    --worker URL NAME [--add-column NAME:TYPE ...] [--option KEY=VALUE ...]
                  [--schema-version N]
flightfeed tables count    --worker URL NAME
flightfeed tables drop     --worker URL NAME [--if-exists]
                  (NAME: TABLE or CATALOG.SCHEMA.TABLE; every tables command takes
                  --timeout SECONDS, and for a grpc+tls:// worker --tls-ca PEM
                  [--tls-cert PEM --tls-key PEM], for one requiring a token
                  --auth-token-file FILE; the syntax in full: flightfeed tables --help)
flightfeed --version
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Final

import anyio

from ._version import __version__
from .cli_security import auth, own_token, peer_tls, server_tls
from .cli_types import (
    count_at_least,
    directory_path,
    existing_directory,
    host_name,
    interface,
    location,
    memory_size,
    non_negative_count,
    non_negative_rate,
    non_negative_seconds,
    port,
    positive_count,
    positive_seconds,
)
from .coordinator.admission import DEFAULT_MAX_CONCURRENT_QUERIES
from .errors import FlightfeedError, InvalidArgument
from .flight.connection_limits import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_HEADER_LIST_SIZE,
    DEFAULT_MIN_RECEIVE_RATE,
    DEFAULT_RECEIVE_GRACE,
    ConnectionLimits,
    default_max_connections,
)
from .flight.keepalive import KeepalivePolicy
from .flight.tuning import run
from .plan.memory import DEFAULT_MEMORY_FRACTION, default_memory_limit
from .tables_cli import add_tables_parser
from .worker.config import WorkerConfig

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .worker import Worker

log = logging.getLogger("flightfeed")

DESCRIPTION: Final = (
    "Distributed query execution on Arrow Flight workers, over work discovered while a query"
    " runs. Start with `flightfeed demo`."
)
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
INTERRUPTED: Final = 128 + signal.SIGINT
"""The exit status after Ctrl-C, as shells report a process that SIGINT ended."""
PIPE_CLOSED: Final = 128 + signal.SIGPIPE
"""The exit status once stdout's reader left, as shells report a process that SIGPIPE ended."""


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The WorkerConfig the `worker` command's arguments ask for."""
    keepalive = (
        KeepalivePolicy(interval=args.keepalive, timeout=args.keepalive_timeout)
        if args.keepalive
        else None
    )
    connections = ConnectionLimits(
        handshake_timeout=args.handshake_timeout or None,
        max_connections=args.max_connections or default_max_connections(),
        max_header_list_size=args.max_header_list_size,
        min_receive_rate=args.min_receive_rate or None,
        receive_grace=args.receive_grace,
        idle_timeout=args.idle_timeout or None,
    )
    return WorkerConfig(
        keepalive=keepalive,
        connections=connections,
        plan_wait_timeout=args.plan_wait_timeout,
        memory_limit=args.memory_limit,
        fanout_claim_timeout=args.fanout_claim_timeout,
        parquet_roots=tuple(os.path.abspath(root) for root in args.parquet_root),
        peers=frozenset(args.peer) if args.peer else None,
        data_dir=(
            args.data_dir if args.data_dir in (None, ":memory:") else os.path.abspath(args.data_dir)
        ),
        table_compression=args.table_compression,
        tls=server_tls(args),
        peer_tls=peer_tls(args),
        auth=auth(args),
        peer_token=own_token(args),
        shared_memory_dir=(
            None
            if args.no_shared_memory
            else os.path.abspath(args.shared_memory_dir)
            if args.shared_memory_dir is not None
            else WorkerConfig().shared_memory_dir
        ),
    )


def _worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    async def main() -> None:
        worker = Worker(
            host=args.host,
            port=args.port,
            session_builder=args.session_builder,
            advertised_url=args.advertise,
            config=worker_config(args),
        )
        # Handlers go in before the port is announced: a signal right after start must count.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with worker:
                print(
                    f"flightfeed worker listening on {worker.location} ({_worker_setup(args)})",
                    flush=True,
                )
                async for signum in signals:
                    log.info(
                        "received %s: finishing %d running tasks (of %d held) and %d table"
                        " calls and shared-memory reads, taking no new ones (at most %gs; signal"
                        " again to stop now)",
                        signal.Signals(signum).name,
                        worker.registry.unsettled,
                        len(worker.registry),
                        worker.state.calls_under_way,
                        args.shutdown_grace,
                    )
                    break
                await _drain(worker, signals, args.shutdown_grace)
        _ignore_further_signals()
        print("flightfeed worker stopped", flush=True)

    run(main, use_uvloop=not args.no_uvloop)
    return 0


def _worker_setup(args: argparse.Namespace) -> str:
    """What an operator checks first on the start line: where it is bound (its location is the
    address to dial), how much memory its tasks may hold, where its tables are kept, and how
    callers are let in."""
    limit = args.memory_limit
    parts = [f"memory limit {limit / (1 << 30):.1f} GiB" if limit else "no memory limit"]
    if args.data_dir == ":memory:":
        parts.append("tables in memory")
    elif args.data_dir is not None:
        parts.append(f"tables in {os.path.abspath(args.data_dir)}")
    return "; ".join([_bound(args), *parts, *_admission(args)])


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _bound(args: argparse.Namespace) -> str:
    """The interface a server is bound to (its location is only the address to dial)."""
    return "bound to every interface" if args.host in ("0.0.0.0", "::") else f"bound to {args.host}"


def _admission(args: argparse.Namespace) -> list[str]:
    """How a server lets callers in, when it asks anything of them."""
    found = []
    if args.tls_cert:
        found.append("mutual TLS" if args.tls_ca else "TLS")
    if args.auth_token_file:
        found.append("bearer tokens required")
    return found


async def _drain(worker: Worker, signals: AsyncIterator[int], grace: float) -> None:
    """The worker's running tasks, table calls and reads finish (up to `grace` seconds), unless a
    second signal comes: then it stops at once."""
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            async for signum in signals:
                log.info("received %s again: stopping now", signal.Signals(signum).name)
                tg.cancel_scope.cancel()
                return

        tg.start_soon(stop_on_signal)
        left = await worker.drain(grace)
        if left:
            log.warning(
                "%d tasks, table calls or reads still running after %gs: stopping them",
                left,
                grace,
            )
        tg.cancel_scope.cancel()


def _coordinator(args: argparse.Namespace) -> int:
    from .cluster import serve
    from .coordinator import load_catalog

    catalog = load_catalog(args.tables)  # a bad path fails here, before anything starts
    if not args.worker and not args.local_workers:
        raise InvalidArgument("give the workers: --worker URL (repeatable) or --local-workers N")

    async def main() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with serve(
                catalog,
                workers=args.worker,
                local_workers=args.local_workers,
                host=args.host,
                port=args.port,
                advertised_host=args.advertise_host,
                ttl=args.query_ttl,
                max_concurrent_queries=args.max_concurrent_queries or None,
                max_queued_queries=args.max_queued_queries,
                tls=server_tls(args),
                worker_tls=peer_tls(args),
                auth=auth(args),
                worker_token=own_token(args),
            ) as cluster:
                tables = ", ".join(sorted(catalog.tables)) or "no tables"
                setup = "; ".join(
                    [
                        tables,
                        _count(len(args.worker) + args.local_workers, "worker"),
                        _bound(args),
                        *_admission(args),
                    ]
                )
                print(
                    f"flightfeed coordinator listening on {cluster.location} ({setup})", flush=True
                )
                async with anyio.create_task_group() as tg:
                    local = [worker.location for worker in cluster.workers]
                    tg.start_soon(_warn_unreachable, cluster.coordinator, [*args.worker, *local])
                    async for signum in signals:
                        log.info("received %s, shutting down", signal.Signals(signum).name)
                        break
                    tg.cancel_scope.cancel()
        _ignore_further_signals()
        print("flightfeed coordinator stopped", flush=True)

    run(main, use_uvloop=not args.no_uvloop)
    return 0


async def _warn_unreachable(coordinator: Coordinator, urls: Sequence[str]) -> None:
    """Name, at start, each worker that cannot be reached now (a mistyped URL, a worker not up
    yet, a local worker's certificate the coordinator does not trust): queries leave it out
    until it answers, and fail only if none does."""
    if not urls:
        return
    try:
        await coordinator.health.usable(urls)
    except FlightfeedError as exc:
        if not coordinator.health.down:  # reached, and something else is wrong
            log.warning("%s", exc)
    for url in urls:
        down = coordinator.health.down.get(url)
        if down is not None:  # (a reason may not name it: "no answer within the timeout")
            reason = down[1] if url in down[1] else f"worker {url}: {down[1]}"
            log.warning("%s (queries run without it until it answers)", reason)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    pipeline_ok = True
    if not args.no_spark:
        from .pipeline_demo import run_pipeline

        pipeline_ok = run_pipeline(workers=args.workers).ok
    first = 1 if args.no_spark else 2
    core = run(
        lambda: run_demo(workers=args.workers, first_section=first), use_uvloop=not args.no_uvloop
    )
    return 0 if pipeline_ok and core == 0 else 1


_header_list_size = count_at_least(
    1024, "1024 to 4294967295 bytes (an HTTP/2 setting is 32 bits)", maximum=2**32 - 1
)


def _add_tls_arguments(parser: argparse.ArgumentParser, who: str, peers: str) -> None:
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help=f"serve over TLS (grpc+tls://) with this certificate chain; the {who} also"
        " presents it to the workers it reaches",
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require a bearer token (one of the file's lines) on every call; the first is"
        f" also the one the {who} sends the workers it calls",
    )
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="with --tls-cert: clients must present a certificate this CA signed (mutual TLS);"
        f" also the CA of the {peers} it reaches over grpc+tls://, unless --peer-tls-ca is given",
    )
    parser.add_argument(
        "--peer-tls-ca",
        metavar="PEM",
        help=f"the CA that signed the certificates of the {peers} it reaches over grpc+tls://"
        " (default: --tls-ca, else the system's roots); asks nothing of its own clients",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flightfeed", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"flightfeed {__version__}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS).lower()} (default info)",
    )
    parser.add_argument(
        "--no-uvloop", action="store_true", help="run on the stock asyncio loop instead of uvloop"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    worker = commands.add_parser("worker", help="run a worker: an Arrow Flight server for tasks")
    worker.add_argument(
        "--host", type=interface, default="127.0.0.1", help="interface to bind (default 127.0.0.1)"
    )
    worker.add_argument("--port", type=port, default=8000, help="port (default 8000; 0 = any free)")
    worker.add_argument(
        "--session-builder",
        default=None,
        metavar="MODULE:FUNC",
        help="import path of an async SessionBuilder, e.g. mypkg.sessions:build",
    )
    worker.add_argument(
        "--advertise",
        type=location,
        default=None,
        metavar="URL",
        help="URL other processes reach this worker at",
    )
    default_keepalive = WorkerConfig().keepalive
    assert default_keepalive is not None
    worker.add_argument(
        "--keepalive",
        type=non_negative_seconds,
        default=default_keepalive.interval,
        metavar="SECONDS",
        help="ping a caller whose calls went quiet this long, to cancel the tasks of callers "
        f"that vanished (default {default_keepalive.interval:g}; 0 = off)",
    )
    worker.add_argument(
        "--keepalive-timeout",
        type=positive_seconds,
        default=default_keepalive.timeout,
        metavar="SECONDS",
        help=f"drop a caller that sends nothing this long after a ping "
        f"(default {default_keepalive.timeout:g})",
    )
    worker.add_argument(
        "--plan-wait-timeout",
        type=positive_seconds,
        default=WorkerConfig().plan_wait_timeout,
        metavar="SECONDS",
        help="how long an ExecuteTask waits for its task's plan to come "
        f"(default {WorkerConfig().plan_wait_timeout:g})",
    )
    worker.add_argument(
        "--fanout-claim-timeout",
        type=positive_seconds,
        default=WorkerConfig().fanout_claim_timeout,
        metavar="SECONDS",
        help="drop an output of a repartition or broadcast head that no consumer opened this "
        f"long after the first (default {WorkerConfig().fanout_claim_timeout:g})",
    )
    worker.add_argument(
        "--memory-limit",
        type=memory_size,
        default=default_memory_limit(),
        metavar="SIZE",
        help="memory the worker's tasks may hold at once, as bytes, 512MiB, 4GiB or a share of"
        f" the machine's memory such as 50%% (default {100 * DEFAULT_MEMORY_FRACTION:.0f}%%)",
    )
    worker.add_argument(
        "--parquet-root",
        action="append",
        type=existing_directory,
        default=[],
        metavar="DIR",
        help="a directory whose Parquet files plans may read (repeatable; default: none, plans"
        " with a ParquetScan are refused)",
    )
    shared = worker.add_mutually_exclusive_group()
    shared.add_argument(
        "--shared-memory-dir",
        type=existing_directory,
        default=None,
        metavar="DIR",
        help="where readers on this host (Spark's Python workers) are handed batches in shared"
        f" memory instead of through the socket (default {WorkerConfig().shared_memory_dir})",
    )
    shared.add_argument(
        "--no-shared-memory",
        action="store_true",
        help="stream every read through the socket, even to readers on this host",
    )
    worker.add_argument(
        "--peer",
        action="append",
        type=location,
        default=[],
        metavar="URL",
        help="a worker this one's tasks may read from, as the coordinator names it (repeatable;"
        " default: any worker a plan names)",
    )
    worker.add_argument(
        "--shutdown-grace",
        "--drain-timeout",
        type=non_negative_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or SIGINT, how long running tasks may take to finish while new ones"
        " are refused (default 30; a second signal stops at once)",
    )
    worker.add_argument(
        "--data-dir",
        default=None,
        type=directory_path,
        metavar="DIR",
        help="keep durable tables in DIR (a DuckDB database; created if missing), served over"
        " HoraeDB's RemoteEngineService and Flight (default: none; :memory: for tables that"
        " last as long as the process)",
    )
    worker.add_argument(
        "--table-compression",
        choices=("auto", "always", "never"),
        default="auto",
        help="zstd on table reads: auto (while it halves the bytes), always or never",
    )
    _add_tls_arguments(worker, "worker", "peers")
    worker.add_argument(
        "--handshake-timeout",
        type=non_negative_seconds,
        default=DEFAULT_HANDSHAKE_TIMEOUT,
        metavar="SECONDS",
        help="close a connection that has not sent the HTTP/2 preface this long after "
        f"connecting (default {DEFAULT_HANDSHAKE_TIMEOUT:g}; 0 = never)",
    )
    worker.add_argument(
        "--max-connections",
        type=non_negative_count,
        default=0,
        metavar="N",
        help="connections served at once; more are closed on arrival (default or 0: half the "
        "open-files limit)",
    )
    worker.add_argument(
        "--max-header-list-size",
        type=_header_list_size,
        default=DEFAULT_MAX_HEADER_LIST_SIZE,
        metavar="BYTES",
        help="largest request header block; a connection sending a larger one is closed "
        f"(default {DEFAULT_MAX_HEADER_LIST_SIZE})",
    )
    worker.add_argument(
        "--min-receive-rate",
        type=non_negative_rate,
        default=DEFAULT_MIN_RECEIVE_RATE,
        metavar="BYTES_PER_SECOND",
        help="a request message, frame or header block that started arriving must keep coming "
        "at this rate once --receive-grace is over: a slower call is ended, a slower frame "
        f"closes its connection (default {DEFAULT_MIN_RECEIVE_RATE:g}; 0 = no minimum)",
    )
    worker.add_argument(
        "--receive-grace",
        type=positive_seconds,
        default=DEFAULT_RECEIVE_GRACE,
        metavar="SECONDS",
        help="time anything that started arriving gets before --min-receive-rate counts "
        f"(default {DEFAULT_RECEIVE_GRACE:g})",
    )
    worker.add_argument(
        "--idle-timeout",
        type=non_negative_seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help="close a connection without calls for this long; clients reconnect "
        f"(default {DEFAULT_IDLE_TIMEOUT:g}; 0 = never)",
    )
    worker.set_defaults(func=_worker)

    coordinator = commands.add_parser(
        "coordinator",
        help="run a coordinator: a Flight service that queries a catalog of tables on workers",
    )
    coordinator.add_argument(
        "--host", type=interface, default="127.0.0.1", help="interface (default 127.0.0.1)"
    )
    coordinator.add_argument("--port", type=port, default=8815, help="port (default 8815; 0 = any)")
    coordinator.add_argument(
        "--advertise-host",
        type=host_name,
        default=None,
        metavar="HOST",
        help="the name or address other machines reach the --local-workers at (readers are sent"
        " there; with --host 0.0.0.0 they are otherwise sent to 127.0.0.1)",
    )
    coordinator.add_argument(
        "--tables",
        required=True,
        metavar="MODULE:CATALOG",
        help="import path of a flightfeed Catalog, e.g. flightfeed.examples.chunk_scan:catalog",
    )
    coordinator.add_argument(
        "--worker",
        action="append",
        type=location,
        default=[],
        metavar="URL",
        help="a worker's grpc://host:port (repeat for each worker)",
    )
    coordinator.add_argument(
        "--local-workers",
        type=non_negative_count,
        default=0,
        metavar="N",
        help="start N workers in this process, on free ports",
    )
    coordinator.add_argument(
        "--query-ttl",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="release a query nobody read for this long (default 300)",
    )
    coordinator.add_argument(
        "--max-concurrent-queries",
        type=non_negative_count,
        default=DEFAULT_MAX_CONCURRENT_QUERIES,
        metavar="N",
        help="queries run at once; the others wait in a queue (default "
        f"{DEFAULT_MAX_CONCURRENT_QUERIES}; 0 = no limit)",
    )
    coordinator.add_argument(
        "--max-queued-queries",
        type=non_negative_count,
        default=None,
        metavar="N",
        help="queries that may wait for admission; more are refused with RESOURCE_EXHAUSTED "
        "(default: no limit)",
    )
    _add_tls_arguments(coordinator, "coordinator", "workers")
    coordinator.set_defaults(func=_coordinator)

    demo = commands.add_parser("demo", help="run the main job on an embedded default")
    demo.add_argument(
        "--workers", type=positive_count, default=2, help="local workers to start (default 2)"
    )
    demo.add_argument(
        "--no-spark", action="store_true", help="skip the Spark pipeline (no Java needed)"
    )
    demo.set_defaults(func=_demo)

    add_tables_parser(commands)  # flightfeed tables list|create|describe|alter|count|drop
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: what was running was cancelled, nothing went wrong
        print("flightfeed: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # stdout's reader left (`| head`): stop as a Unix tool would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush)
        return PIPE_CLOSED
    except BaseException as exc:
        errors = user_errors(exc)
        if errors is None:
            raise  # a bug: the traceback is worth seeing
        for error in errors:
            print(f"flightfeed: error: {error}", file=sys.stderr)
        return 2
    finally:  # (as they were: a caller in this process keeps its Ctrl-C)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code


def _ignore_further_signals() -> None:
    """Served and stopped: what is left is the event loop's teardown, a few milliseconds, where
    a second Ctrl-C landed as a KeyboardInterrupt inside it ('Cannot close a running event
    loop', a traceback). `main` puts the handlers back once the command returns."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def user_errors(exc: BaseException) -> list[FlightfeedError] | None:
    """The FlightfeedErrors `exc` is made of (a user's mistake: a bad import path, a port
    taken, a bad config), through any exception groups the task groups wrapped them in; None
    when any part of it is something else."""
    if isinstance(exc, FlightfeedError):
        return [exc]
    if not isinstance(exc, BaseExceptionGroup):
        return None
    found: list[FlightfeedError] = []
    for part in exc.exceptions:
        errors = user_errors(part)
        if errors is None:
            return None
        found += errors
    return found


if __name__ == "__main__":
    sys.exit(main())
