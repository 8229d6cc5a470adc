"""`flightfeed tables`: an operator's commands for the durable tables of one worker (a
`flightfeed worker --data-dir DIR`), over the worker's own port.

flightfeed tables list     --worker URL [--json]
flightfeed tables create   --worker URL NAME --column NAME:TYPE[:tag][:notnull] ...
                           [--timestamp COLUMN] [--primary-key COLUMN,COLUMN,...]
                           [--option KEY=VALUE ...] [--if-not-exists]
flightfeed tables describe --worker URL NAME [--json]
flightfeed tables alter    --worker URL NAME [--add-column NAME:TYPE ...]
                           [--option KEY=VALUE ...] [--schema-version N]
flightfeed tables count    --worker URL NAME
flightfeed tables drop     --worker URL NAME [--if-exists]

Every command also takes `--timeout SECONDS`, the longest wait for each answer (default 10),
and what a secured worker needs: for a `grpc+tls://` worker, `--tls-ca PEM` (the CA that signed
its certificate; the system's roots without it) and, when it requires mutual TLS, `--tls-cert
PEM --tls-key PEM` (the client certificate to present); for one that requires a bearer token,
`--auth-token-file FILE` (the file's first token is sent with every call, as the worker's own
flag of that name sends it to its peers).

NAME is `table` (catalog `flightfeed`, schema `public`) or `catalog.schema.table`.

A column is `NAME:TYPE`, then flags, each after a colon: `tag` (a tag column: part of the
default primary key; not floating point) and `notnull`. TYPE is HoraeDB's name of the type
(timestamp, double, float, varbinary, string, uint64 ... uint8, int64 ... int8, bool, date,
time) or an Arrow name of the same type (float64, float32, binary, utf8, large_string,
boolean, date32, time64[us], timestamp[ms], ...), in any case. Timestamps are milliseconds.
The timestamp column (`--timestamp`, by default the only column of type timestamp) and the
primary key's columns (`--primary-key`, by default the tags, then the timestamp) are not null.

Options are HoraeDB's: `ttl` (7d, 12h, 30m, 10s, 250ms), `enable_ttl` (true, false) and
`update_mode` (OVERWRITE: a row replaces the row of the same primary key; APPEND: every row
is kept; fixed when the table is created).

`alter` adds nullable columns (against the schema version it reads first, or the one
`--schema-version` names: a table changed since is refused) and changes options. With both,
the columns are added first: everything is checked before either change is sent.

Exit status: 0 done; 1 the worker refused (no such table, one exists already, a stale schema
version, a value it does not accept, a missing or refused token) or could not be reached (a
TLS handshake that failed included); 2 a bad command line (TLS flags for a grpc:// worker, a
certificate without its key, a TLS or token file that cannot be read), and nothing was sent.
Errors are one line on stderr naming the command, the table and the worker; a token never
appears in one.

`list` uses Flight's ListFlights; `create`, `count` and `drop` the Flight actions
`create_table`, `count_rows` and `drop_table`; `describe` and `alter` HoraeDB's
RemoteEngineService (GetTableInfo, AlterTableSchema, AlterTableOptions).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import anyio
import pyarrow as pa
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import ProtocolError

from ._generated.flightfeed.v1 import CreateTable, RowCount
from ._generated.remote_engine import (
    AlterTableOptionsRequest,
    AlterTableSchemaRequest,
    GetTableInfoRequest,
    RemoteEngineServiceStub,
    TableIdentifier,
    TableInfo,
)
from ._generated.schema import DataType
from .cli_security import client_tls
from .cli_types import count_at_least, positive_seconds
from .errors import FlightfeedError, InvalidArgument, NotFound, RemoteError, Unauthenticated
from .flight.auth import bearer, read_tokens
from .flight.client import FlightClient, parse_location
from .flight.grpc import GrpcChannel
from .flight.schema import schema_from_ipc
from .flight.tls import ClientTls, is_tls_location
from .flight.tuning import use_uvloop_default
from .messages import parse_strict
from .protocol import TYPED_ERRORS
from .tables.flight import COUNT_ROWS, CREATE_TABLE, DROP_TABLE, table_ref
from .tables.headers import NOT_FOUND
from .tables.options import TableOptions
from .tables.schema import Column, TableSchema
from .tables.store import TableName
from .tables.types import TYPES, ColumnType, of_arrow

T = TypeVar("T")
DEFAULT_TIMEOUT: Final = 10.0
FLAGS: Final = ("tag", "notnull")
HORAEDB_TYPES: Final = {t.data_type.name.lower(): t for t in TYPES}
"""timestamp, double, float, ..., by HoraeDB's name of each type."""
OK: Final = 0
REFUSED: Final = 1
USAGE: Final = 2


class Refused(Exception):
    """The worker refused, or could not be reached: the one line to print."""

    def __init__(self, reason: str, *, not_found: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.not_found = not_found


# --- the command line's pieces, parsed -------------------------------------------------------


def parse_table_name(text: str) -> TableName:
    """`table` or `catalog.schema.table`, a part with a dot in double quotes
    (`TableName.parse`)."""
    return TableName.parse(text)


def column_type(text: str) -> ColumnType:
    """A column type by HoraeDB's name (`string`) or Arrow's (`utf8`), in any case."""
    key = text.strip().lower()
    found = HORAEDB_TYPES.get(key)
    if found is not None:
        return found
    known = ", ".join(HORAEDB_TYPES)
    try:
        arrow = pa.type_for_alias(key)
    except (ValueError, KeyError):
        raise InvalidArgument(
            f"unknown column type {text!r}: one of {known}, or an Arrow name of one (int64,"
            " float64, utf8, timestamp[ms], ...)"
        ) from None
    if pa.types.is_timestamp(arrow) and (arrow.unit != "ms" or arrow.tz is not None):
        raise InvalidArgument(
            f"column type {text!r}: tables keep timestamps in milliseconds, without a zone"
            " (timestamp or timestamp[ms])"
        )
    try:
        return of_arrow(arrow)
    except InvalidArgument:
        raise InvalidArgument(
            f"a table column cannot be of Arrow type {arrow}: one of {known}, or an Arrow name"
            " of one"
        ) from None


@dataclass(frozen=True)
class ColumnSpec:
    """One `--column` / `--add-column`: NAME:TYPE[:tag][:notnull]."""

    name: str
    type: ColumnType
    tag: bool = False
    not_null: bool = False

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type.arrow, nullable=not self.not_null)


def parse_column(text: str) -> ColumnSpec:
    """NAME:TYPE[:tag][:notnull] (the flags in any order and case)."""
    name, colon, rest = text.partition(":")
    if not colon or not name or not rest:
        raise InvalidArgument(f"a column is NAME:TYPE[:tag][:notnull], got {text!r}")
    type_text, *flags = rest.split(":")
    try:
        kind = column_type(type_text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"column {text!r}: {exc.message}") from None
    unknown = [f for f in flags if f.strip().lower() not in FLAGS]
    if unknown:
        raise InvalidArgument(
            f"column {text!r}: unknown flag(s) {unknown}; a column's flags are {list(FLAGS)}"
        )
    seen = {f.strip().lower() for f in flags}
    return ColumnSpec(name, kind, tag="tag" in seen, not_null="notnull" in seen)


def parse_options(texts: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE each; a key given twice with different values is refused."""
    options: dict[str, str] = {}
    for text in texts:
        key, equals, value = text.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key:
            raise InvalidArgument(f"an option is KEY=VALUE, got {text!r}")
        if options.get(key, value) != value:
            raise InvalidArgument(f"option {key} is given twice: {options[key]!r} and {value!r}")
        options[key] = value
    return options


def parse_key(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise InvalidArgument(f"a primary key is COLUMN,COLUMN,..., got {text!r}")
    return names


def new_table_schema(
    columns: Sequence[ColumnSpec], timestamp: str | None, primary_key: Sequence[str] | None
) -> TableSchema:
    """The schema `create` sends, checked as the worker checks it."""
    if not columns:
        raise InvalidArgument("a table needs columns: --column NAME:TYPE (repeatable)")
    if timestamp is None:
        stamps = [c.name for c in columns if c.type.data_type == DataType.TIMESTAMP]
        if len(stamps) != 1:
            found = f"columns {stamps} are" if stamps else "no column is"
            raise InvalidArgument(
                f"{found} of type timestamp: a table has one timestamp column"
                + (", name it with --timestamp" if stamps else " (e.g. --column ts:timestamp)")
            )
        timestamp = stamps[0]
    return TableSchema.from_arrow(
        pa.schema([c.field for c in columns]),
        timestamp=timestamp,
        tags=[c.name for c in columns if c.tag],
        primary_key=primary_key,
    )


def added_columns(schema: TableSchema, specs: Sequence[ColumnSpec]) -> list[Column]:
    """`alter --add-column`: new, nullable, not tags."""
    added = []
    for spec in specs:
        if spec.tag or spec.not_null:
            raise InvalidArgument(
                f"an added column is nullable and not a tag: drop the flags of {spec.name!r}"
            )
        added.append(Column(spec.name, spec.type))
    names = [c.name.casefold() for c in added]  # SQL names (DuckDB's) ignore case
    existing = {name.casefold() for name in schema.names}
    repeated = sorted(
        {
            c.name
            for c in added
            if names.count(c.name.casefold()) > 1 or c.name.casefold() in existing
        }
    )
    if repeated:
        raise InvalidArgument(
            f"column(s) {repeated} exist already or are added twice (names ignore case)"
        )
    return added


# --- the worker ------------------------------------------------------------------------------


_NO_SUCH_TABLE = TableName.of("__flightfeed_probe__")
"""A name `list` asks about to learn whether a worker serves tables at all."""


def _identifier(name: TableName) -> TableIdentifier:
    return TableIdentifier(catalog=name.catalog, schema=name.schema, table=name.table)


def _header_error(header: Any, rpc: str) -> None:
    """Refused with the worker's message unless the response header says OK."""
    if header is None or header.code == 0:
        return
    message = str(header.error).removeprefix(f"{rpc} failed: ")
    raise Refused(
        message or f"{rpc} failed (code {header.code})", not_found=header.code == NOT_FOUND
    )


class WorkerTables:
    """One worker's tables, over its Flight service and its RemoteEngineService: over TLS for a
    `grpc+tls://` worker (`tls`: its root CA, and the client certificate for mutual TLS), and
    with `authorization: Bearer <token>` on every call when there is a `token`."""

    def __init__(
        self, url: str, timeout: float, *, tls: ClientTls | None = None, token: str | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.has_token = token is not None
        self.has_certificate = tls is not None and tls.cert_chain is not None
        host, port = parse_location(url)
        metadata = bearer(token) if token is not None else None
        # _call has the timeout
        self.flight = FlightClient(url, errors=TYPED_ERRORS, tls=tls, metadata=metadata)
        context = (tls or ClientTls()).context() if is_tls_location(url) else None
        self._channel = GrpcChannel(host, port, ssl=context)
        self.engine = RemoteEngineServiceStub(self._channel, metadata=metadata)

    def _refused_token(self) -> Refused:
        if self.has_token:
            return Refused("the worker refused the token (of --auth-token-file)")
        return Refused("the worker requires a bearer token: give --auth-token-file FILE")

    def _unreachable(self, reason: object) -> Refused:
        hint = ""
        if is_tls_location(self.url):
            if "CERTIFICATE_VERIFY_FAILED" in str(reason):
                hint = "; --tls-ca must be the CA that signed the worker's certificate"
            elif not self.has_certificate:
                hint = "; a worker requiring mutual TLS needs --tls-cert and --tls-key"
        return Refused(f"cannot reach the worker ({reason}){hint}")

    async def close(self) -> None:
        await self.flight.close()
        self._channel.close()

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """One call, within the timeout; its failure as the line to print."""
        try:
            with anyio.fail_after(self.timeout):
                return await call()
        except TimeoutError:
            raise Refused(f"no answer within {self.timeout:g} s") from None
        except RemoteError as exc:  # no flightfeed error: the connection, or not a worker
            reason = exc.message.partition(f"cannot reach {self.url}: ")[2] or exc.message
            if exc.grpc_status == Status.UNAVAILABLE:
                raise self._unreachable(reason) from None
            if exc.grpc_status == Status.UNAUTHENTICATED:
                raise self._refused_token() from None
            raise Refused(f"{what}: {reason} (is it a flightfeed worker?)") from None
        except Unauthenticated:
            raise self._refused_token() from None
        except FlightfeedError as exc:
            raise Refused(exc.message, not_found=isinstance(exc, NotFound)) from None
        except GRPCError as exc:
            if exc.status == Status.UNAUTHENTICATED:
                raise self._refused_token() from None
            if exc.status == Status.UNIMPLEMENTED:
                raise Refused(
                    f"the worker does not serve {what} (a flightfeed worker serves tables when"
                    " started with --data-dir DIR)"
                ) from None
            raise Refused(f"{what}: {exc.message} (is it a flightfeed worker?)") from None
        except OSError as exc:
            raise self._unreachable(exc) from None
        except (StreamTerminatedError, ProtocolError) as exc:
            if is_tls_location(self.url):
                raise self._unreachable(f"{what}: the connection failed: {exc}") from None
            raise Refused(f"{what}: the connection failed ({exc})") from None

    async def list_tables(self) -> list[tuple[TableName, pa.Schema]]:
        infos = await self._call("ListFlights", self.flight.list_flights)
        found = []
        for info in infos:
            path = list(info.flight_descriptor.path) if info.flight_descriptor else []
            if len(path) != 3:
                continue  # not a table (a worker lists only tables)
            found.append((TableName.of(path[2], path[0], path[1]), schema_from_ipc(info.schema)))
        if not found:
            # A worker without --data-dir and a coordinator list no tables either: only the
            # table service tells them from a worker whose tables are all dropped.
            await self.exists(_NO_SUCH_TABLE)
        return sorted(found, key=lambda item: str(item[0]))

    async def info(self, name: TableName) -> TableInfo:
        request = GetTableInfoRequest(table=_identifier(name))
        response = await self._call(
            "RemoteEngineService", lambda: self.engine.get_table_info(request)
        )
        _header_error(response.header, "GetTableInfo")
        if response.table_info is None or response.table_info.table_schema is None:
            raise Refused("GetTableInfo answered without the table's schema")
        return response.table_info

    async def create(
        self, name: TableName, schema: TableSchema, options: Mapping[str, str], if_not_exists: bool
    ) -> None:
        request = CreateTable(
            table=table_ref(name),
            table_schema=schema.to_proto(),
            options=dict(options),
            if_not_exists=if_not_exists,
        )
        await self._call(
            "create_table", lambda: self.flight.do_action(CREATE_TABLE, bytes(request))
        )

    async def exists(self, name: TableName) -> bool:
        try:
            await self.info(name)
        except Refused as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def drop(self, name: TableName) -> None:
        body = bytes(table_ref(name))
        await self._call("drop_table", lambda: self.flight.do_action(DROP_TABLE, body))

    async def count(self, name: TableName) -> int:
        body = bytes(table_ref(name))
        results = await self._call("count_rows", lambda: self.flight.do_action(COUNT_ROWS, body))
        if len(results) != 1:
            raise Refused(f"count_rows answered {len(results)} results, not one")
        try:
            return int(parse_strict(RowCount, results[0]).rows)
        except InvalidArgument as exc:
            raise Refused(f"count_rows answered something else: {exc.message}") from None

    async def alter_schema(self, name: TableName, schema: TableSchema, pre_version: int) -> None:
        request = AlterTableSchemaRequest(
            table=_identifier(name), table_schema=schema.to_proto(), pre_schema_version=pre_version
        )
        response = await self._call(
            "RemoteEngineService", lambda: self.engine.alter_table_schema(request)
        )
        _header_error(response.header, "AlterTableSchema")

    async def alter_options(self, name: TableName, options: Mapping[str, str]) -> None:
        request = AlterTableOptionsRequest(table=_identifier(name), options=dict(options))
        response = await self._call(
            "RemoteEngineService", lambda: self.engine.alter_table_options(request)
        )
        _header_error(response.header, "AlterTableOptions")


# --- the commands ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What every command has: the worker, how long to wait for it, and how to reach it (TLS,
    a token)."""

    worker: str
    timeout: float
    use_uvloop: bool
    tls: ClientTls | None = None
    token: str | None = field(default=None, repr=False)

    def print(self, text: str = "") -> None:
        print(text, flush=True)

    def on_worker(self, body: Callable[[WorkerTables], Awaitable[T]]) -> T:
        """Runs `body` against the worker, on an event loop of its own (a client: no process
        tuning); its failures come out as Refused."""

        async def main() -> T:
            tables = WorkerTables(self.worker, self.timeout, tls=self.tls, token=self.token)
            try:
                return await body(tables)
            finally:
                await tables.close()

        options = {"use_uvloop": self.use_uvloop}
        return anyio.run(main, backend="asyncio", backend_options=options)


def describe_json(url: str, info: TableInfo) -> dict[str, Any]:
    schema = TableSchema.from_proto(info.table_schema)
    name = TableName.of(info.table_name, info.catalog_name, info.schema_name)
    described: dict[str, Any] = {
        "worker": url,
        "table": str(name),
        "catalog": name.catalog,
        "schema": name.schema,
        "name": name.table,
        "table_id": int(info.table_id),
        "engine": str(info.engine),
        "schema_version": schema.version,
        "timestamp": schema.timestamp,
        "primary_key": list(schema.primary_key),
        "columns": [
            {
                "id": c.id,
                "name": c.name,
                "type": c.type.data_type.name.lower(),
                "arrow_type": str(c.type.arrow),
                "nullable": c.nullable,
                "tag": c.is_tag,
                "key": c.name in schema.primary_key,
                "comment": c.comment,
            }
            for c in schema.columns
        ],
        "options": dict(sorted(info.options.items())),
    }
    if info.partition_info is not None:
        described["partition_info"] = info.partition_info.to_dict()
    return described


def describe_text(described: Mapping[str, Any]) -> list[str]:
    options = ", ".join(f"{k}={v}" for k, v in described["options"].items()) or "(none)"
    fields = [
        ("table", described["table"]),
        ("worker", described["worker"]),
        ("table id", str(described["table_id"])),
        ("engine", described["engine"]),
        ("schema version", str(described["schema_version"])),
        ("timestamp", described["timestamp"]),
        ("primary key", ", ".join(described["primary_key"])),
        ("options", options),
    ]
    if "partition_info" in described:
        fields.append(("partition", json.dumps(described["partition_info"], sort_keys=True)))
    width = max(len(label) for label, _ in fields) + 2
    lines = [f"{label:<{width}}{value}" for label, value in fields]
    yes = {True: "yes", False: "no"}
    header = ["id", "name", "type", "nullable", "tag", "key"]
    rows = [
        [str(c["id"]), c["name"], c["type"], yes[c["nullable"]], yes[c["tag"]], yes[c["key"]]]
        for c in described["columns"]
    ]
    if any(c["comment"] for c in described["columns"]):
        header.append("comment")
        for row, c in zip(rows, described["columns"], strict=True):
            row.append(c["comment"])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append("")
    lines.extend(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
    return lines


def _list(args: argparse.Namespace, ctx: Context) -> int:
    found = ctx.on_worker(lambda tables: tables.list_tables())
    if args.json:
        entries = [
            {
                "table": str(name),
                "catalog": name.catalog,
                "schema": name.schema,
                "name": name.table,
                "columns": [{"name": f.name, "arrow_type": str(f.type)} for f in schema],
            }
            for name, schema in found
        ]
        ctx.print(json.dumps(entries, indent=2))
    else:
        for name, _ in found:
            ctx.print(str(name))
        if not found:  # said on stderr: stdout stays a list of names, empty
            print(f"no tables on {ctx.worker}", file=sys.stderr, flush=True)
    return OK


def _create(args: argparse.Namespace, ctx: Context) -> int:
    name = parse_table_name(args.name)
    schema = new_table_schema(
        [parse_column(c) for c in args.column], args.timestamp, parse_key(args.primary_key)
    )
    options = parse_options(args.option)
    TableOptions.parse(options)  # refused here, as the worker would: nothing is sent

    async def create(tables: WorkerTables) -> bool:
        existed = args.if_not_exists and await tables.exists(name)
        await tables.create(name, schema, options, args.if_not_exists)
        return existed

    if ctx.on_worker(create):
        ctx.print(f"table {name} exists already on {ctx.worker}; nothing created")
    else:
        ctx.print(
            f"created table {name} on {ctx.worker}: {len(schema.columns)} columns, timestamp"
            f" {schema.timestamp}, primary key ({', '.join(schema.primary_key)})"
        )
    return OK


def _describe(args: argparse.Namespace, ctx: Context) -> int:
    name = parse_table_name(args.name)
    info = ctx.on_worker(lambda tables: tables.info(name))
    described = describe_json(ctx.worker, info)
    if args.json:
        ctx.print(json.dumps(described, indent=2))
    else:
        for line in describe_text(described):
            ctx.print(line)
    return OK


def _alter(args: argparse.Namespace, ctx: Context) -> int:
    name = parse_table_name(args.name)
    specs = [parse_column(c) for c in args.add_column]
    options = parse_options(args.option)
    if not specs and not options:
        raise InvalidArgument(
            "nothing to alter: give --add-column NAME:TYPE or --option KEY=VALUE (repeatable)"
        )

    async def alter(tables: WorkerTables) -> tuple[int, int, dict[str, str]]:
        info = await tables.info(name)
        schema = TableSchema.from_proto(info.table_schema)
        expected = args.schema_version if args.schema_version is not None else schema.version
        if schema.version != expected:
            raise Refused(
                f"the table is at schema version {schema.version}, not {expected}"
                " (--schema-version): describe it again"
            )
        try:  # everything checked before the first change is sent
            added = added_columns(schema, specs)
            if options:
                TableOptions.parse(options, TableOptions.parse(dict(info.options)))
        except InvalidArgument as exc:
            raise Refused(exc.message) from None
        if added:
            await tables.alter_schema(name, schema.with_added(added), expected)
        if options:
            await tables.alter_options(name, options)
        after = await tables.info(name)
        return schema.version, TableSchema.from_proto(after.table_schema).version, after.options

    before, after, now = ctx.on_worker(alter)
    changes = []
    if specs:
        added = ", ".join(s.name for s in specs)
        changes.append(f"added column(s) {added} (schema version {before} → {after})")
    if options:
        changes.append("options now " + ", ".join(f"{k}={v}" for k, v in sorted(now.items())))
    ctx.print(f"altered table {name} on {ctx.worker}: {'; '.join(changes)}")
    return OK


def _count(args: argparse.Namespace, ctx: Context) -> int:
    name = parse_table_name(args.name)
    ctx.print(str(ctx.on_worker(lambda tables: tables.count(name))))
    return OK


def _drop(args: argparse.Namespace, ctx: Context) -> int:
    name = parse_table_name(args.name)

    async def drop(tables: WorkerTables) -> bool:
        try:
            await tables.drop(name)
        except Refused as exc:
            if args.if_exists and exc.not_found:
                return False
            raise
        return True

    if ctx.on_worker(drop):
        ctx.print(f"dropped table {name} on {ctx.worker}")
    else:
        ctx.print(f"no table {name} on {ctx.worker}; nothing dropped")
    return OK


COMMANDS: Final[dict[str, Callable[[argparse.Namespace, Context], int]]] = {
    "list": _list,
    "create": _create,
    "describe": _describe,
    "alter": _alter,
    "count": _count,
    "drop": _drop,
}


def _subject(args: argparse.Namespace) -> str:
    """What the command is about, as its error line names it."""
    if args.tables_command == "list":
        return "tables"
    try:
        return str(parse_table_name(args.name))
    except InvalidArgument:
        return repr(args.name)


def security(args: argparse.Namespace) -> tuple[ClientTls | None, str | None]:
    """How to reach the worker: its TLS settings and the token to send, from the flags, every
    file read now (a mistake is the command line's: nothing is sent)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgument(
            "--tls-cert and --tls-key go together (the client certificate and its private key)"
        )
    tls = client_tls(args)
    if tls is not None:
        if not is_tls_location(args.worker):
            raise InvalidArgument(
                "--tls-ca, --tls-cert and --tls-key are for a grpc+tls:// worker, not"
                f" {args.worker}"
            )
        tls.context()  # the files, read and checked
    token = None
    if args.auth_token_file is not None:
        token = read_tokens(args.auth_token_file)[0]  # (refused there when it holds none)
    return tls, token


def run_tables(args: argparse.Namespace) -> int:
    """`flightfeed tables ...`: the exit status; one line on stderr when it is not 0."""
    where = f"{args.tables_command} {_subject(args)} on {args.worker}"
    try:
        parse_location(args.worker)
        tls, token = security(args)
        ctx = Context(
            args.worker,
            args.timeout,
            use_uvloop=use_uvloop_default() and not args.no_uvloop,
            tls=tls,
            token=token,
        )
        return COMMANDS[args.tables_command](args, ctx)
    except Refused as exc:
        print(f"flightfeed: error: {where}: {exc.reason}", file=sys.stderr)
        return REFUSED
    except FlightfeedError as exc:  # the command line's own mistakes: nothing was sent
        print(f"flightfeed: error: {where}: {exc.message}", file=sys.stderr)
        return USAGE


# --- the parser ------------------------------------------------------------------------------


COLUMN_HELP: Final = (
    "NAME:TYPE[:tag][:notnull]; TYPE by HoraeDB's name (timestamp, double, float, varbinary,"
    " string, uint64, uint32, uint16, uint8, int64, int32, int16, int8, bool, date, time) or"
    " an Arrow name of the same type (float64, utf8, timestamp[ms], ...)"
)


def add_tables_parser(commands: Any) -> None:
    """`flightfeed tables` and its commands, on the `flightfeed` parser's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--worker",
        required=True,
        metavar="URL",
        help="the worker's grpc://host:port (grpc+tls://host:port over TLS)",
    )
    common.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that signed a grpc+tls:// worker's certificate (default: the system's roots)",
    )
    common.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="the client certificate to present to a worker that requires mutual TLS",
    )
    common.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    common.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="send the file's first token (authorization: Bearer) with every call, to a worker"
        " started with --auth-token-file",
    )
    common.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"the longest wait for each of the worker's answers (default {DEFAULT_TIMEOUT:g})",
    )
    named = argparse.ArgumentParser(add_help=False, parents=[common])
    named.add_argument(
        "name", metavar="NAME", help='TABLE or CATALOG.SCHEMA.TABLE (a part with a dot: "a.b")'
    )

    tables = commands.add_parser(
        "tables",
        help="list, create, describe, alter, count and drop a worker's durable tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tables.set_defaults(func=run_tables)
    verbs = tables.add_subparsers(dest="tables_command", required=True, metavar="COMMAND")

    listing = verbs.add_parser("list", parents=[common], help="the worker's tables, one a line")
    listing.add_argument("--json", action="store_true", help="JSON, with each table's columns")

    create = verbs.add_parser(
        "create",
        parents=[named],
        help="create a table",
        description="Create a table. Example: flightfeed tables create --worker"
        " grpc://127.0.0.1:8000 cpu --column ts:timestamp --column host:string:tag"
        " --column usage:double --option ttl=7d",
    )
    create.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="SPEC",
        help=f"a column, in order (repeatable): {COLUMN_HELP}",
    )
    create.add_argument(
        "--timestamp",
        default=None,
        metavar="COLUMN",
        help="the timestamp column (default: the only column of type timestamp)",
    )
    create.add_argument(
        "--primary-key",
        default=None,
        metavar="COLUMN,...",
        help="the primary key's columns, holding the timestamp (default: the tags, then the"
        " timestamp)",
    )
    create.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a table option (repeatable): ttl=7d, enable_ttl=true|false,"
        " update_mode=OVERWRITE|APPEND (default OVERWRITE, rows kept for ever)",
    )
    create.add_argument(
        "--if-not-exists",
        action="store_true",
        help="a table of that name with the same column names is not an error",
    )

    describe = verbs.add_parser(
        "describe",
        parents=[named],
        help="a table's columns, timestamp, primary key, schema version, engine and options",
    )
    describe.add_argument("--json", action="store_true", help="JSON, for programs")

    alter = verbs.add_parser(
        "alter",
        parents=[named],
        help="add columns to a table, or change its options",
        description="Add nullable columns to a table and/or change its options (ttl,"
        " enable_ttl). Everything is checked before anything changes; columns are added first.",
    )
    alter.add_argument(
        "--add-column",
        action="append",
        default=[],
        metavar="NAME:TYPE",
        help="a column to append, nullable (repeatable); TYPE as for create",
    )
    alter.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option to set (repeatable): ttl=30d, enable_ttl=false",
    )
    alter.add_argument(
        "--schema-version",
        type=count_at_least(1, "a schema version, 1 or more"),
        default=None,
        metavar="N",
        help="refuse unless the table is still at this schema version (as describe showed it)",
    )

    verbs.add_parser("count", parents=[named], help="a table's live rows (TTL applied)")

    drop = verbs.add_parser("drop", parents=[named], help="drop a table and its rows")
    drop.add_argument(
        "--if-exists", action="store_true", help="no table of that name is not an error"
    )


__all__ = [
    "ColumnSpec",
    "WorkerTables",
    "add_tables_parser",
    "column_type",
    "new_table_schema",
    "parse_column",
    "parse_table_name",
    "run_tables",
]
