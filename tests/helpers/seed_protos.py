# ruff: noqa: E501  (the protos are the seed's lines, verbatim)
"""An independent HoraeDB remote-engine client: standard protobuf/grpc modules generated at test
time from the protocol text of the seeds (/work/shared/seeds/horaedb-protos.md, HoraeDB's
apache/incubator-horaedb-proto at fac8564), not from protos/horaedb nor flightfeed._generated.

The files keep HoraeDB's own layout and import paths (`engine/remote_engine.proto` imports
`engine/schema.proto`, `engine/time_range.proto`, `cluster.proto`, `common.proto` and
`storage.proto`); `storage.proto` holds only ArrowPayload and `cluster.proto` only the
partition messages, which is all the remote engine uses of them. Message texts are the seed's,
verbatim; the imported files get the `syntax` and `package` lines the seed names.

The generated modules import each other by top-level names (`common_pb2`, `engine`, ...), so
they are imported with their directory first on sys.path and then taken out of sys.modules
again (whatever held those names before is put back): nothing else can pick them up by
accident, and they pick up nothing else.
"""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SERVICE: Final = "/remote_engine.RemoteEngineService/"

_REMOTE_ENGINE: Final = """\
syntax = "proto3";
package remote_engine;
import "engine/schema.proto"; import "engine/time_range.proto"; import "cluster.proto"; import "common.proto"; import "storage.proto";
service RemoteEngineService {
  rpc Read(ReadRequest) returns (stream ReadResponse) {}
  rpc Write(WriteRequest) returns (WriteResponse) {}
  rpc GetTableInfo(GetTableInfoRequest) returns (GetTableInfoResponse) {}
  rpc WriteBatch(WriteBatchRequest) returns (WriteResponse) {}
  rpc ExecutePhysicalPlan(ExecutePlanRequest) returns (stream ReadResponse) {}
  rpc AlterTableSchema(AlterTableSchemaRequest) returns (AlterTableSchemaResponse) {}
  rpc AlterTableOptions(AlterTableOptionsRequest) returns (AlterTableOptionsResponse) {}
}
message TableIdentifier { string catalog = 1; string schema = 2; string table = 3; }
message ReadOptions { uint64 batch_size = 1; uint64 read_parallelism = 2; int64 timeout_ms = 3; /* -1 = no timeout */ }
message Predicate { repeated bytes exprs = 1; time_range.TimeRange time_range = 2; }
enum ReadOrder { None = 0; Asc = 1; Desc = 2; }
message TableReadRequest { string request_id = 1; ReadOptions opts = 2; schema.ProjectedSchema projected_schema = 3; Predicate predicate = 4; ReadOrder order = 5; }
message ReadRequest { TableIdentifier table = 1; TableReadRequest read_request = 2; }
message ReadResponse { common.ResponseHeader header = 1; oneof output { storage.ArrowPayload arrow = 2; MetricPayload metric = 3; } }
message MetricPayload { string metric = 1; }
message ColumnDesc { uint32 id = 1; schema.DataType typ = 2; }
message ContiguousRows { uint32 schema_version = 1; repeated bytes encoded_rows = 2; repeated ColumnDesc column_descs = 3; }
message RowGroup { int64 min_timestamp = 1; int64 max_timestamp = 2; oneof rows { storage.ArrowPayload arrow = 3; ContiguousRows contiguous = 4; } }
message WriteRequest { TableIdentifier table = 1; RowGroup row_group = 2; }
message WriteResponse { common.ResponseHeader header = 1; uint64 affected_rows = 2; }
message GetTableInfoRequest { TableIdentifier table = 1; }
message TableInfo { string catalog_name = 1; string schema_name = 2; uint32 schema_id = 3; string table_name = 4; uint64 table_id = 5;
  schema.TableSchema table_schema = 6; string engine = 7; map<string, string> options = 8; cluster.PartitionInfo partition_info = 9; }
message GetTableInfoResponse { common.ResponseHeader header = 1; TableInfo table_info = 2; }
message WriteBatchRequest { repeated WriteRequest batch = 1; }
message ExtensionNode { oneof typed_extension { DistSqlQueryExtensionNode dist_sql_query = 1; } }
message DistSqlQueryExtensionNode { UnresolvedSubScan unresolved_sub_scan = 1; }
message UnresolvedSubScan { TableIdentifier table = 1; TableScanContext table_scan_ctx = 2; }
enum QueryPriority { High = 0; Low = 1; }
enum Explain { Analyze = 0; }
message ExecContext { string request_id = 1; string default_catalog = 2; string default_schema = 3; int64 timeout_ms = 4; /* -1 = none */
  QueryPriority priority = 5; string displayable_query = 6; optional Explain explain = 7; }
message ExecutePlanRequest { ExecContext context = 1; oneof physical_plan { bytes datafusion = 2; } TableIdentifier table = 3; }
message AlterTableSchemaRequest { TableIdentifier table = 1; schema.TableSchema table_schema = 2; uint32 pre_schema_version = 3; }
message AlterTableSchemaResponse { common.ResponseHeader header = 1; }
message AlterTableOptionsRequest { TableIdentifier table = 1; map<string, string> options = 2; }
message AlterTableOptionsResponse { common.ResponseHeader header = 1; }
message TableScanContext { uint64 batch_size = 1; uint64 read_parallelism = 2; schema.ProjectedSchema projected_schema = 3; Predicate predicate = 4; }
"""

_SCHEMA: Final = """\
syntax = "proto3";
package schema;
message TableSchema { repeated ColumnSchema columns = 1; uint32 version = 2; uint32 timestamp_id = 3; repeated uint32 primary_key_ids = 4; }
message ColumnSchema { string name = 1; DataType data_type = 2; bool is_nullable = 3; uint32 id = 4; bool is_tag = 5; string comment = 6;
  oneof default_value { bytes serde_json = 7; } bool is_dictionary = 8; }
enum DataType { NULL = 0; TIMESTAMP = 1; DOUBLE = 2; VARBINARY = 3; STRING = 4; UINT64 = 5; FLOAT = 6; INT64 = 7; INT32 = 8; INT16 = 9;
  INT8 = 10; UINT32 = 11; UINT16 = 12; UINT8 = 13; BOOL = 14; DATE = 15; TIME = 16; }
message ProjectedSchema { TableSchema table_schema = 1; Projection projection = 2; }
message Projection { repeated uint64 idx = 1; }
"""

_TIME_RANGE: Final = """\
syntax = "proto3";
package time_range;
message TimeRange { int64 start = 1; /* inclusive */ int64 end = 2; /* exclusive */ }   // [start, end), ms timestamps
"""

_COMMON: Final = """\
syntax = "proto3";
package common;
message ResponseHeader { uint32 code = 1; string error = 2; }
"""

_STORAGE: Final = """\
syntax = "proto3";
package storage;
message ArrowPayload {
  enum Compression { NONE = 0; ZSTD = 1; }
  repeated bytes record_batches = 1;   // each element a standalone Arrow IPC stream; HoraeDB compresses the whole buffer with zstd level 3 at 80 KiB or more
  Compression compression = 2;
}
"""

_CLUSTER: Final = """\
syntax = "proto3";
package cluster;
message PartitionInfo { oneof info { HashPartitionInfo hash = 1; KeyPartitionInfo key = 2; RandomPartitionInfo random = 3; } }
message PartitionDefinition { string name = 1; oneof origin_name { string origin = 2; } }
message HashPartitionInfo { int32 version = 1; repeated PartitionDefinition definitions = 2; bytes expr = 3; bool linear = 4; }
message KeyPartitionInfo { int32 version = 1; repeated PartitionDefinition definitions = 2; repeated string partition_key = 3; bool linear = 4; }
message RandomPartitionInfo { repeated PartitionDefinition definitions = 1; }
"""

PROTOS: Final = {
    "engine/remote_engine.proto": _REMOTE_ENGINE,
    "engine/schema.proto": _SCHEMA,
    "engine/time_range.proto": _TIME_RANGE,
    "common.proto": _COMMON,
    "storage.proto": _STORAGE,
    "cluster.proto": _CLUSTER,
}
"""HoraeDB's files by their import path, as the seed gives them."""

_MODULES: Final = {
    "remote_engine_pb2": "engine.remote_engine_pb2",
    "remote_engine_pb2_grpc": "engine.remote_engine_pb2_grpc",
    "schema_pb2": "engine.schema_pb2",
    "time_range_pb2": "engine.time_range_pb2",
    "common_pb2": "common_pb2",
    "storage_pb2": "storage_pb2",
    "cluster_pb2": "cluster_pb2",
}
_TOP_LEVEL: Final = ("engine", "common_pb2", "storage_pb2", "cluster_pb2")


@dataclass(frozen=True)
class SeedProtos:
    """The generated modules (typed Any: protobuf's generated classes are dynamic)."""

    remote_engine_pb2: Any
    remote_engine_pb2_grpc: Any
    schema_pb2: Any
    time_range_pb2: Any
    common_pb2: Any
    storage_pb2: Any
    cluster_pb2: Any


def write_protos(root: Path) -> list[str]:
    """The seed's files under `root` in HoraeDB's layout; returns their import paths."""
    for name, text in PROTOS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(PROTOS)


def generate(protos: Path, out: Path) -> None:
    """`python -m grpc_tools.protoc`: *_pb2.py for every file, *_pb2_grpc.py for the service."""
    sources = write_protos(protos)
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{protos}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"protoc failed ({result.returncode}): {result.stderr}")


def _import_from(out: Path) -> SeedProtos:
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _ours(name)}
    sys.path.insert(0, str(out))
    importlib.invalidate_caches()
    try:
        loaded = {attr: importlib.import_module(module) for attr, module in _MODULES.items()}
    finally:
        sys.path.remove(str(out))
        for name in [name for name in sys.modules if _ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
    for module in loaded.values():  # generated here, not found elsewhere on sys.path
        assert Path(module.__file__ or "").is_relative_to(out), module.__file__
    return SeedProtos(**loaded)


def _ours(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in _TOP_LEVEL)


@functools.cache
def seed_protos() -> SeedProtos:
    """Generated and imported once per process (blocking: call it outside the event loop)."""
    with tempfile.TemporaryDirectory(prefix="horaedb-seed-protos-") as tmp:
        root = Path(tmp)
        generate(root / "protos", root / "out")
        (root / "out" / "engine" / "__init__.py").touch()
        return _import_from(root / "out")


__all__ = ["PROTOS", "SERVICE", "SeedProtos", "generate", "seed_protos", "write_protos"]
