"""HoraeDB's RemoteEngineService on a live `flightfeed worker --data-dir` process, fed valid
requests with bytes changed, cut or added (hypothesis): every call is answered with a gRPC
status that says what was wrong or with a response header of HoraeDB's codes, never INTERNAL
or UNKNOWN and never header code 500, and the worker goes on writing and reading.

The client is grpcio's, with messages from the seed protos (helpers.seed_protos): it shares no
code with the service. `FLIGHTFEED_ENGINE_FUZZ_EXAMPLES` lengthens the run (200 in the suite).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import grpc  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from datafusion import SessionContext
from helpers.contiguous_rows import contiguous_rows
from helpers.cpu_table import CPU_ROWS, CPU_SCHEMA
from helpers.message_strategies import live_fuzz_settings, mutated
from helpers.seed_protos import SERVICE, SeedProtos, seed_protos
from helpers.worker_process import worker_process
from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import CreateTable
from flightfeed.plan import expr
from flightfeed.plan.expr_proto import encode_expr
from flightfeed.spark.source import table_ref

EXAMPLES = int(os.environ.get("FLIGHTFEED_ENGINE_FUZZ_EXAMPLES", "200"))
INTERNAL_CODE: Final = 500
UNCLEAR: Final = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def valid_requests(seed: SeedProtos) -> dict[str, tuple[str, bytes, Any, bool]]:
    """Per seed: its method, a valid request's bytes, its response class, and whether it
    streams."""
    pb = seed.remote_engine_pb2
    table = pb.TableIdentifier(table="cpu")
    payload = seed.storage_pb2.ArrowPayload(record_batches=[ipc_stream(CPU_ROWS)])
    write = pb.WriteRequest(
        table=table, row_group=pb.RowGroup(min_timestamp=1000, max_timestamp=2000, arrow=payload)
    )
    rows = contiguous_rows(CPU_SCHEMA, CPU_ROWS)
    contiguous = pb.ContiguousRows(
        schema_version=rows.schema_version,
        encoded_rows=rows.encoded_rows,
        column_descs=[pb.ColumnDesc(id=d.id, typ=d.typ) for d in rows.column_descs],
    )
    write_contiguous = pb.WriteRequest(table=table, row_group=pb.RowGroup(contiguous=contiguous))
    read = pb.ReadRequest(
        table=table,
        read_request=pb.TableReadRequest(request_id="fuzz", opts=pb.ReadOptions(batch_size=10)),
    )
    predicate = pb.Predicate(
        exprs=[encode_expr(expr.call("greater", expr.col("v"), expr.lit(0.5)))]
    )
    filtered = pb.ReadRequest(
        table=table,
        read_request=pb.TableReadRequest(request_id="fuzz", predicate=predicate),
    )
    horaedb_filtered = pb.ReadRequest(
        table=table,
        read_request=pb.TableReadRequest(
            request_id="fuzz", predicate=pb.Predicate(exprs=horaedb_predicates())
        ),
    )
    return {
        "Write": ("Write", write.SerializeToString(), pb.WriteResponse, False),
        "Write of contiguous rows": (
            "Write",
            write_contiguous.SerializeToString(),
            pb.WriteResponse,
            False,
        ),
        "WriteBatch": (
            "WriteBatch",
            pb.WriteBatchRequest(batch=[write, write_contiguous]).SerializeToString(),
            pb.WriteResponse,
            False,
        ),
        "Read": ("Read", read.SerializeToString(), pb.ReadResponse, True),
        "Read with a predicate": ("Read", filtered.SerializeToString(), pb.ReadResponse, True),
        "Read with HoraeDB's predicates": (
            "Read",
            horaedb_filtered.SerializeToString(),
            pb.ReadResponse,
            True,
        ),
        "GetTableInfo": (
            "GetTableInfo",
            pb.GetTableInfoRequest(table=table).SerializeToString(),
            pb.GetTableInfoResponse,
            False,
        ),
    }


def horaedb_predicates() -> list[bytes]:
    """A filter as HoraeDB sends it: DataFusion's plan of it, encoded by DataFusion."""
    ctx = SessionContext()
    ctx.register_record_batches("cpu", [[CPU_ROWS]])
    where = (
        "host IN ('a', 'b', 'c', 'd', NULL) AND (v BETWEEN 0.5 AND 2 OR host LIKE 'b%')"
        " AND CASE WHEN v IS NULL THEN ts > TIMESTAMP '1970-01-01 00:00:01' ELSE NOT v < 0 END"
    )
    plan = ctx.sql(f"SELECT * FROM cpu WHERE {where}").optimized_logical_plan()
    while type(plan.to_variant()).__name__ != "Filter":
        (plan,) = plan.inputs()
    return [plan.to_variant().predicate().to_bytes()]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = Path(tmp_path_factory.mktemp("engine-fuzz"))
    with worker_process("--data-dir", str(data_dir)) as (_, location):
        create = CreateTable(table=table_ref("cpu"), table_schema=CPU_SCHEMA.to_proto())
        with fl.connect(location) as client:
            list(client.do_action(fl.Action("create_table", bytes(create))))
        yield location.removeprefix("grpc://")


def call(
    channel: grpc.Channel, method: str, body: bytes, response: Any, streams: bool
) -> list[Any]:
    path = SERVICE + method
    parse = response.FromString
    if streams:
        return list(channel.unary_stream(path, response_deserializer=parse)(body, timeout=10))
    return [channel.unary_unary(path, response_deserializer=parse)(body, timeout=10)]


def test_malformed_engine_requests_get_clear_answers_and_the_worker_holds(worker: str) -> None:
    seed = seed_protos()
    requests = valid_requests(seed)
    outcomes: Counter[str] = Counter()
    with grpc.insecure_channel(worker) as channel:

        @live_fuzz_settings(EXAMPLES)
        @given(
            st.sampled_from(sorted(requests)).flatmap(
                lambda m: st.tuples(st.just(m), mutated(requests[m][1]))
            )
        )
        def one(example: tuple[str, bytes]) -> None:
            name, body = example
            method, _, response, streams = requests[name]
            try:
                answers = call(channel, method, body, response, streams)
            except grpc.RpcError as error:
                status, details = error.code(), error.details()
            else:
                status = None
            if status is not None:
                assert status not in UNCLEAR, f"{example!r}: {details}"
                outcomes[status.name] += 1
                return
            codes = [answer.header.code for answer in answers]
            assert INTERNAL_CODE not in codes, f"{example!r}: {answers}"
            outcomes["header " + ",".join(map(str, sorted(set(codes))))] += 1

        one()
        assert sum(outcomes.values()) >= min(EXAMPLES, 50), outcomes
        for name in ("Write", "Write of contiguous rows", "GetTableInfo"):  # it still serves
            method, body, response, streams = requests[name]
            (answer,) = call(channel, method, body, response, streams)
            assert answer.header.code == 0, answer
