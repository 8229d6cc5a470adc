"""Spark reads and writes flightfeed servers that serve TLS (`grpc+tls://`) and require a bearer
token: a coordinator's catalog table (the coordinator and its workers all TLS and token), and
a worker's durable table behind mutual TLS, written then read back. The options `token` or
`tokenFile`, `tlsRootCerts`, `tlsCertChain` and `tlsPrivateKey` reach every call, the driver's
and the executors'; without the token the read fails saying so, and the token never shows in
the error. Certificates come from trustme, a test CA."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from helpers.certificates import Certificates, make_certificates
from helpers.spark_catalog import NUMBERS, spark_test_catalog, tagging_session
from helpers.spark_fixtures import worker_in_background

from flightfeed._generated.flightfeed.v1 import CreateTable, RowCount, TableRef
from flightfeed.cluster import CoordinatorCluster, serve_in_background
from flightfeed.flight.auth import BearerTokens
from flightfeed.flight.tls import ClientTls
from flightfeed.tables.schema import TableSchema
from flightfeed.worker import Worker, WorkerConfig

TOKEN = "spark-s3cret-token"
AUTH = BearerTokens([TOKEN])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(f"# the Spark job's token\n{TOKEN}\n")
    return path


@pytest.fixture(scope="module")
def secure_service(certs: Certificates) -> Iterator[CoordinatorCluster]:
    """The test catalog on a TLS coordinator and 2 TLS workers, each requiring TOKEN (the
    coordinator sends it to the workers, the workers to each other)."""
    reach = ClientTls(str(certs.ca))
    workers = WorkerConfig(tls=certs.server, peer_tls=reach, auth=AUTH, peer_token=TOKEN)
    with serve_in_background(
        spark_test_catalog(),
        local_workers=2,
        session_builder=tagging_session,
        worker_config=workers,
        tls=certs.server,
        worker_tls=reach,
        auth=AUTH,
        worker_token=TOKEN,
    ) as cluster:
        assert cluster.location.startswith("grpc+tls://")
        yield cluster


@pytest.fixture(scope="module")
def mtls_worker(certs: Certificates) -> Iterator[Worker]:
    """A worker holding durable tables in memory, requiring mutual TLS and TOKEN."""
    config = WorkerConfig(data_dir=":memory:", tls=certs.mutual, auth=AUTH)
    with worker_in_background(config) as worker:
        yield worker


def tls_options(certs: Certificates, *, client: bool = False) -> dict[str, str]:
    found = {"tlsRootCerts": str(certs.ca)}
    if client:
        found |= {"tlsCertChain": str(certs.client_cert), "tlsPrivateKey": str(certs.client_key)}
    return found


def reader(spark: Any, uri: str, table: str, **options: str) -> Any:
    found = spark.read.format("flightfeed").option("uri", uri).option("table", table)
    for key, value in options.items():
        found = found.option(key, value)
    return found


def test_a_catalog_table_over_tls_with_a_token(
    spark: Any, secure_service: CoordinatorCluster, certs: Certificates
) -> None:
    """Every call carries the token next to the query's own headers: the driver's to the
    coordinator, each executor's to the worker of its endpoint."""
    df = reader(
        spark, secure_service.location, "tagged", token=TOKEN, **{"header.x-tag": "secure"},
        **tls_options(certs),
    ).load()  # fmt: skip
    got = sorted((row.n, row.tag) for row in df.collect())
    assert got == [(n, "secure") for n in NUMBERS["n"].to_pylist()]


def test_without_the_right_token_the_read_says_so(
    spark: Any, secure_service: CoordinatorCluster, certs: Certificates, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    for token in ({}, {"tokenFile": str(wrong)}):
        with pytest.raises(Exception, match="Unauthenticated") as info:
            reader(spark, secure_service.location, "numbers", **token, **tls_options(certs)).load()
        text = str(info.value)
        assert "refused GetSchema: the bearer token is missing or wrong" in text, text
        assert TOKEN not in text
        assert "not-the-token" not in text


def test_a_write_and_its_read_back_over_mutual_tls(
    spark: Any, mtls_worker: Worker, certs: Certificates, token_file: Path
) -> None:
    secure = {"tokenFile": str(token_file), **tls_options(certs, client=True)}
    name = f"t_{uuid.uuid4().hex[:12]}"
    rows = pa.table({"n": pa.array(range(500), pa.int64()), "ts": pa.array(range(500))})
    rows = rows.set_column(1, "ts", rows["ts"].cast(pa.timestamp("ms", tz="UTC")))
    schema = TableSchema.from_arrow(rows.schema, timestamp="ts", primary_key=["n", "ts"])
    request = CreateTable(table=TableRef(table=name), table_schema=schema.to_proto())
    with fl.connect(
        mtls_worker.location,
        tls_root_certs=certs.ca.read_bytes(),
        cert_chain=certs.client_cert.read_bytes(),
        private_key=certs.client_key.read_bytes(),
    ) as client:
        call = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        list(client.do_action(fl.Action("create_table", bytes(request)), call))

        writer = spark.createDataFrame(rows.to_pandas()).repartition(2).write
        writer = writer.format("flightfeed").mode("append").option("uri", mtls_worker.location)
        writer = writer.option("table", name)
        for key, value in secure.items():
            writer = writer.option(key, value)
        writer.save()

        body = bytes(TableRef(table=name))
        answer = list(client.do_action(fl.Action("count_rows", body), call))
        assert RowCount.parse(answer[0].body.to_pybytes()).rows == 500

    back = reader(
        spark, mtls_worker.location, name, source="table", partitions="2", **secure
    ).load()
    assert sorted(row.n for row in back.collect()) == list(range(500))

    without = {k: v for k, v in secure.items() if k not in ("tlsCertChain", "tlsPrivateKey")}
    with pytest.raises(Exception, match="cannot reach the flightfeed worker") as info:
        reader(spark, mtls_worker.location, name, source="table", **without).load()
    assert "a server requiring mutual TLS needs 'tlsCertChain' and 'tlsPrivateKey'" in str(
        info.value
    )
    assert TOKEN not in str(info.value)
