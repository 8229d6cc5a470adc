"""The `flightfeed` Spark data source: a table of a flightfeed coordinator, or a durable table of
a flightfeed worker, as a DataFrame; `df.write` into a worker's table (see `writer.py`).

    spark.read.format("flightfeed")
        .option("uri", "grpc://coordinator:8815")
        .option("table", "scan")
        .option("args", '[2, "3,1", "2", "4", "1,1"]')
        .load()

    spark.read.format("flightfeed")
        .option("source", "table")               # a worker's durable table
        .option("uri", "grpc://worker:8816")     # the worker that holds it
        .option("table", "metrics")              # TABLE or CATALOG.SCHEMA.TABLE
        .option("partitions", "8")
        .load()

Options: `uri` (the coordinator; with source=table, the worker), `table`, `source` ("query",
the default: a query of the coordinator's catalog; "table": a durable table the worker at
`uri` holds), `args` (source=query: a JSON list of the table's arguments), `partitions`
(source=table: how many slices of the table's rows to read in parallel, one Spark partition
each; default 1, as the data source cannot see Spark's parallelism: set it to e.g.
`spark.sparkContext.defaultParallelism` to read in parallel), `columns` (comma-separated, to
read fewer), `timeout` (seconds: the longest wait for an answer, and for each batch of a
read, not the read's length), `header.NAME` (a header sent with every call; the workers'
session builders see the query's), and `sharedMemory` (true, the default: a worker
at a loopback address hands its batches to the reader in shared memory instead of through the
socket; false: always through the socket). A server that requires a bearer token gets
`token`, or the first token of the file `tokenFile`, as `authorization: Bearer <token>` on
every call; a `grpc+tls://` one is checked against the PEM CA bundle `tlsRootCerts` (the
system's roots without it), and a server requiring mutual TLS gets the client certificate
`tlsCertChain` with its key `tlsPrivateKey`. Those files are read where each call is made, on
the driver and on every executor: the paths must exist on each. A TableOptions' repr hides the
token.

A durable table's TIMESTAMP columns (milliseconds since the epoch) read as Spark's TimestampType
(an instant; shown in the session's time zone). Columns of a query or a table that Spark cannot
hold as they are widen to a type that holds every value (`arrow_types.py`: an unsigned integer
to the next signed type, uint64 to DECIMAL(20, 0); half floats, view layouts, 32-bit times and
64-bit dates too); the others are refused by name. Nanoseconds are truncated to Spark's
microseconds. Pushed filters and `columns` go into the
worker's TableCommand; filters are pushed when their literal has the column's exact type in
the table (a timestamp with sub-millisecond digits stays with Spark, which is still exact).

Spark calls `schema()`, `pushFilters()` and `partitions()` in separate Python processes and
pickles the reader in between, so the reader holds only plain data; clients are opened in the
call that uses them. `partitions()` starts the query on the coordinator and gets one endpoint
per output partition (or, for a durable table, one endpoint per slice of its rows); each Spark
task reads its endpoint straight from its worker. A retried task reads the same rows again
(the worker replays its work units; a table slice is a fixed range of row ids).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from .._generated.flightfeed.v1 import TableCommand, TableRef
from ..coordinator.table_query import table_command
from ..errors import InvalidArgument, NotFound
from ..flight.auth import AUTHORIZATION
from ..flight.client import parse_location
from ..flight.request_headers import call_headers
from ..flight.tls import is_tls_location
from ..plan import decode_expr, encode_expr
from ..plan.expr_proto import expr_to_proto
from ..table_names import QUOTE_HINT, THREE_PARTS, split_name
from . import arrow_types, client
from .filters import split_filters
from .python_worker import settle_python_worker

SOURCE_NAME = "flightfeed"
HEADER_PREFIX = "header."
SOURCE_QUERY = "query"
"""option source=query (the default): a query of a coordinator's catalog."""
SOURCE_TABLE = "table"
"""option source=table: a durable table of the worker at `uri`."""
TABLE_COMMAND_VERSION = 1
MAX_TABLE_PARTITIONS = 1024
"""What a worker splits a table read into at most."""
OPTION_NAMES: tuple[str, ...] = (
    "source",
    "uri",
    "location",
    "table",
    "args",
    "columns",
    "timeout",
    "partitions",
    "sharedMemory",
    client.TOKEN,
    client.TOKEN_FILE,
    client.TLS_ROOT_CERTS,
    client.TLS_CERT_CHAIN,
    client.TLS_PRIVATE_KEY,
    "maxUnitsPerTrigger",
    "awaitFeedEnd",
)
"""Every option of the data source's reads, stream reads and writes, besides `header.NAME`."""
_OPTION_SPELLING = {name.lower(): name for name in OPTION_NAMES}


def check_option_names(names: Sequence[str]) -> None:
    """Refuse an option name that is a near miss of one of ours (`tabel`, `maxUnitPerTrigger`):
    Spark passes every option through unread, so a misspelt one would be silently ignored.
    Names far from all of ours are left alone, as Spark's own sources leave them (Spark adds
    some, such as `path`)."""
    for name in names:
        if name in _OPTION_SPELLING or name.startswith(HEADER_PREFIX):
            continue
        near = difflib.get_close_matches(name, _OPTION_SPELLING, n=1, cutoff=0.8)
        if near:
            raise InvalidArgument(
                f"the flightfeed data source has no option {name!r}: did you mean"
                f" {_OPTION_SPELLING[near[0]]!r}?"
            )


def flight_uri(value: str) -> str:
    """Option `uri`, checked now (not as pyarrow's error at the first call), with `grpc://`
    added to a bare host:port."""
    try:
        parse_location(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"option 'uri': {exc.message}") from None
    return value if "://" in value else f"grpc://{value}"


def table_ref(text: str) -> TableRef:
    """A worker's table named `TABLE` (catalog flightfeed, schema public) or
    `CATALOG.SCHEMA.TABLE`, as `flightfeed tables` names them (a part with a dot in double
    quotes: table_names.py)."""
    try:
        parts = split_name(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"option 'table': {exc.message}") from None
    if len(parts) == 1:
        return TableRef(table=parts[0])
    if len(parts) == 3:
        return TableRef(catalog=parts[0], schema=parts[1], table=parts[2])
    raise InvalidArgument(f"option 'table': {THREE_PARTS}, got {text!r} {QUOTE_HINT}")


def worker_command(ref: TableRef, **fields: Any) -> bytes:
    """A worker's TableCommand (a table read's, or with `staged`, a task attempt's write)."""
    return bytes(TableCommand(version=TABLE_COMMAND_VERSION, table=ref, **fields))


@dataclass(frozen=True)
class TableOptions:
    """A table query, or a read of a worker's table, as the data source's options describe it."""

    uri: str
    table: str
    arguments: tuple[Any, ...] = ()
    columns: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = client.DEFAULT_TIMEOUT
    source: str = SOURCE_QUERY
    partitions: int = 1
    connection: client.Connection = client.PLAIN
    """The token and TLS files every call uses."""
    shared_memory: bool = True
    """Whether a worker on the reader's host may hand batches over in shared memory."""

    def __repr__(self) -> str:
        """Without the token (Spark may log a reader): an `authorization` header is hidden
        too, and the Connection's repr hides its token."""
        return redacted_repr(self)

    @classmethod
    def of(cls, options: Any) -> TableOptions:
        """From Spark's (case-insensitive) options; InvalidArgument naming what is wrong."""
        found = {str(k).lower(): str(v) for k, v in dict(options).items()}
        check_option_names(list(found))
        source = found.get("source", SOURCE_QUERY).strip().lower()
        if source not in (SOURCE_QUERY, SOURCE_TABLE):
            raise InvalidArgument(
                f"option 'source' is {SOURCE_QUERY!r} (a coordinator's catalog) or"
                f" {SOURCE_TABLE!r} (a worker's durable table), got {found['source']!r}"
            )
        uri = found.get("uri") or found.get("location")
        if not uri:
            what = (
                "the worker that holds the table" if source == SOURCE_TABLE else "the coordinator"
            )
            raise InvalidArgument(
                f"the flightfeed data source needs option 'uri' ({what}, grpc://host:port)"
            )
        uri = flight_uri(uri.strip())
        table = found.get("table")
        if not table:
            raise InvalidArgument("the flightfeed data source needs option 'table'")
        try:
            arguments = json.loads(found.get("args", "[]"))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"option 'args' must be a JSON list: {exc}") from None
        if not isinstance(arguments, list):
            raise InvalidArgument(f"option 'args' must be a JSON list, got {arguments!r}")
        columns = tuple(c.strip() for c in found.get("columns", "").split(",") if c.strip())
        headers = {
            k[len(HEADER_PREFIX) :]: v for k, v in found.items() if k.startswith(HEADER_PREFIX)
        }
        for name, value in headers.items():  # (checked now: one gRPC cannot carry failed the
            try:  # first call, "Invalid metadata", naming neither the option nor the header)
                call_headers({name: value})
            except InvalidArgument as exc:
                raise InvalidArgument(f"option '{HEADER_PREFIX}{name}': {exc.message}") from None
        connection = client.Connection.of(found)
        tls_files = connection.tls_files()
        if tls_files and not is_tls_location(uri):  # (ignored, the calls failed: Socket closed)
            raise InvalidArgument(
                f"option {tls_files[0].option!r} is for a grpc+tls:// server, and option 'uri' is"
                f" {uri!r}: give the server's grpc+tls:// address"
            )
        if connection.has_token and AUTHORIZATION in headers:
            raise InvalidArgument(
                f"options {client.TOKEN!r} (or {client.TOKEN_FILE!r}) and"
                f" '{HEADER_PREFIX}{AUTHORIZATION}' both set the authorization header: give one"
            )
        try:
            timeout = float(found.get("timeout", client.DEFAULT_TIMEOUT))
        except ValueError:
            timeout = math.nan
        if not 0 < timeout < math.inf:  # (NaN too: a call cannot wait that long)
            raise InvalidArgument(
                f"option 'timeout' must be seconds, more than 0, got {found['timeout']!r}"
            )
        partitions = 1
        if source == SOURCE_TABLE:
            if arguments:
                raise InvalidArgument(
                    "option 'args' is for source=query: a worker's table takes no arguments"
                )
            table_ref(table)  # a clear error now for a malformed name
            partitions = _partitions(found.get("partitions", "1"))
        elif "partitions" in found:
            raise InvalidArgument(
                "option 'partitions' is for source=table (a coordinator's query has the"
                " partitions its plan gives it)"
            )
        shared = found.get("sharedmemory", "true").strip().lower()
        if shared not in ("true", "false"):
            raise InvalidArgument(
                f"option 'sharedMemory' is true or false, got {found['sharedmemory']!r}"
            )
        return cls(
            uri,
            table,
            tuple(arguments),
            columns,
            headers,
            timeout,
            source,
            partitions,
            connection,
            shared == "true",
        )

    @property
    def is_table(self) -> bool:
        return self.source == SOURCE_TABLE

    @property
    def peer(self) -> str:
        """What `uri` is, for error messages."""
        return client.WORKER if self.is_table else client.COORDINATOR

    def command(self, filters: Sequence[bytes] = ()) -> bytes:
        pushed = [decode_expr(f) for f in filters]
        if self.is_table:
            return worker_command(
                table_ref(self.table),
                columns=list(self.columns),
                filters=[expr_to_proto(f) for f in pushed],
                partitions=self.partitions,
            )
        return table_command(self.table, self.arguments, columns=self.columns, filters=pushed)

    def arrow_schema(self) -> pa.Schema:
        """What the coordinator's query, or the worker's table read, returns."""
        return client.get_schema(
            self.uri,
            self.command(),
            self.headers,
            self.timeout,
            peer=self.peer,
            connection=self.connection,
        )


def redacted_repr(options: Any) -> str:
    """A dataclass's repr with its `headers`' authorization value hidden."""
    shown = []
    for found in fields(options):
        if found.repr:
            value = getattr(options, found.name)
            if found.name == "headers":
                value = client.redacted(value)
            shown.append(f"{found.name}={value!r}")
    return f"{type(options).__name__}({', '.join(shown)})"


def _partitions(text: str) -> int:
    try:
        partitions = int(text)
    except ValueError:
        partitions = 0
    if not 1 <= partitions <= MAX_TABLE_PARTITIONS:
        raise InvalidArgument(
            f"option 'partitions' must be an integer from 1 to {MAX_TABLE_PARTITIONS}, got {text!r}"
        )
    return partitions


def spark_schema(arrow: pa.Schema, table: TableOptions) -> StructType:
    """The schema Spark is told (`arrow_types.py`): a durable table's timestamps as instants
    (TimestampType, module docstring)."""
    return arrow_types.spark_schema(arrow, timestamps_as_instants=table.is_table)


class FlightfeedDataSource(DataSource):
    """`spark.read.format("flightfeed")` and `df.write.format("flightfeed")`: see the module
    docstrings (this one's, and `writer.py`'s). Spark runs every filter itself over what this
    source reads; `FlightfeedPushdownSource` pushes them to the workers."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    # Each method below runs in a Python worker of Spark's own (creating the source, planning
    # a read or a write), reused from command to command: settled as the readers' are.

    def schema(self) -> StructType:
        from .stream import stream_options

        settle_python_worker()
        table = TableOptions.of(self.options)
        stream_options(self.options)  # (a batch read ignores them; a stream's, checked now)
        return spark_schema(table.arrow_schema(), table)

    def reader(self, schema: StructType) -> DataSourceReader:
        settle_python_worker()
        return FlightfeedReader(TableOptions.of(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream import FlightfeedStreamReader

        settle_python_worker()
        table = TableOptions.of(self.options)
        if table.is_table:
            raise InvalidArgument(
                f"a durable table ({table.table} on {table.uri}) is read as a batch, not a"
                " stream: use spark.read, or readStream with source=query"
            )
        return FlightfeedStreamReader(table, schema, self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writer import FlightfeedTableWriter

        settle_python_worker()
        return FlightfeedTableWriter.create(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import FlightfeedStreamTableWriter

        settle_python_worker()
        return FlightfeedStreamTableWriter.create(self.options, schema, overwrite)


class FlightfeedPushdownSource(FlightfeedDataSource):
    """The `flightfeed` source that pushes Spark's filters to the workers (it needs
    `spark.sql.python.filterPushdown.enabled`). `register` picks it where Spark keeps a pushed
    read to its own query (`pushdown.py`)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        settle_python_worker()
        return FlightfeedPushdownReader(TableOptions.of(self.options), schema)


class FlightfeedReader(DataSourceReader):
    """Starts the query (or the table read) and reads one endpoint per Spark partition."""

    def __init__(self, table: TableOptions, schema: StructType) -> None:
        self.table = table
        self.schema = schema
        self.filters: list[bytes] = []  # pushed, as Expr protos: plain data for pickling

    def partitions(self) -> Sequence[InputPartition]:
        table = self.table
        _, endpoints = client.get_endpoints(
            table.uri,
            table.command(self.filters),
            table.headers,
            table.timeout,
            peer=table.peer,
            connection=table.connection,
        )
        return [InputPartition(endpoint) for endpoint in endpoints]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.table, self.schema)


class FlightfeedPushdownReader(FlightfeedReader):
    """A reader that also pushes filters into the query (pyspark refuses a reader with
    `pushFilters` while pushdown is off, so the plain reader has none)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        filters = list(filters)
        if not filters:
            self.filters = []
            return
        # A table's literals take its own column types (its timestamps are milliseconds, not
        # Spark's microseconds); a query's, the columns' types as Spark was told them.
        if self.table.is_table:
            pushed, kept = split_filters(filters, self.table.arrow_schema())
        else:
            seen = arrow_schema(self.schema)
            # (the columns' own types tell nanosecond timestamps apart: one call, when it can
            # matter)
            own = self.table.arrow_schema() if _has_timestamps(seen) else None
            pushed, kept = split_filters(filters, seen, exact_types=False, own_types=own)
        self.filters = [encode_expr(expr) for expr in pushed]
        yield from kept


def _has_timestamps(schema: pa.Schema) -> bool:
    return any(pa.types.is_timestamp(field.type) for field in schema)


def read_partition(
    partition: InputPartition, table: TableOptions, schema: StructType
) -> Iterator[pa.RecordBatch]:
    """The batches of a partition's endpoint, exactly as Spark declared the columns."""
    settle_python_worker()  # (this runs in Spark's Python worker)
    endpoint: client.Endpoint = partition.value
    target = arrow_schema(schema)
    batches = client.read_endpoint(
        endpoint,
        table.headers,
        table.timeout,
        connection=table.connection,
        coordinator=None if table.is_table else table.uri,  # it moves a lost worker's tasks
        shared_memory=table.shared_memory,
    )
    try:
        for batch in batches:
            yield conform(batch, target)
    except NotFound as exc:  # what the DataFrame's planned read held is gone
        raise NotFound(f"{exc.message}. {PLANNED_ONCE}") from None


PLANNED_ONCE: Final = (
    "Spark plans a DataFrame's read once and reads that plan again in every later query of the"
    " DataFrame (or view); a coordinator runs a released query again for it when it can, but a"
    " table read's snapshot is gone once its endpoints were read: define the DataFrame (or the"
    " view) again to read anew"
)
"""Why a later query of a DataFrame can find its planned read gone (README: From PySpark)."""


def arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's schema in Arrow, as Spark wants a data source's batches (TimestampType in UTC)."""
    arrow: pa.Schema = to_arrow_schema(schema, timezone="UTC")
    return arrow


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` exactly as Spark declared the columns (types and nullability); a clear error
    when the table no longer matches what Spark was told."""
    if batch.schema.names != target.names:
        raise InvalidArgument(
            f"schema mismatch: the table's columns are now {batch.schema.names}, Spark expects"
            f" {target.names} (did the table change since the DataFrame was created?)"
        )
    for column, declared in zip(batch.columns, target, strict=True):
        if not declared.nullable and column.null_count:  # pyarrow would not check: Spark would
            raise InvalidArgument(
                f"schema mismatch: column {declared.name!r} holds {column.null_count} null(s), but"
                " Spark was told it has none (did the table change since the DataFrame was"
                " created?)"
            )
    if batch.schema.equals(target):
        return batch
    try:
        return pa.RecordBatch.from_arrays(
            [_cast(column, f.type) for column, f in zip(batch.columns, target, strict=True)],
            schema=target,
        )
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidArgument(
            f"schema mismatch: the table's schema is now {batch.schema}, Spark expects {target}:"
            f" {exc}"
        ) from None


def _cast(column: pa.Array, to: pa.DataType) -> pa.Array:
    """A column as Spark declared it: nanoseconds cut to Spark's microseconds (an instant
    floored, as Spark takes one: 1 ns before the epoch is still before it), any other loss
    refused."""
    if column.type == to:
        return column
    if pa.types.is_run_end_encoded(column.type):
        column = pc.run_end_decode(column)
    if pa.types.is_timestamp(column.type) and column.type.unit == "ns":
        wall = column.view(pa.timestamp("ns"))  # without its zone: no local time to resolve
        column = pc.floor_temporal(wall, unit="microsecond").view(column.type)
    return pc.cast(column, options=pc.CastOptions(to, allow_time_truncate=True))
