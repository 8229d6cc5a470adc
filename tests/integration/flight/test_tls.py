"""TLS and mutual TLS on a real worker (`grpc+tls://`): pyarrow's C++ Flight client with and
without a client certificate, flightfeed's own client, and a coordinator running a shuffled
query over two mutual-TLS workers that read each other over TLS too. Certificates come from
trustme, a test CA."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives import serialization
from helpers.certificates import Certificates, make_certificates
from helpers.coordinator_command import coordinator_command
from helpers.worker_process import worker_process

from flightfeed.coordinator import Coordinator
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import FlightfeedError, InvalidArgument, RemoteError
from flightfeed.flight.client import FlightClient, parse_location
from flightfeed.flight.connection_limits import ConnectionLimits
from flightfeed.flight.tls import ClientTls, ServerTls
from flightfeed.plan.aggregate import agg
from flightfeed.plan.builder import plan_from
from flightfeed.plan.expr import col
from flightfeed.plan.nodes import ParquetScan
from flightfeed.protocol.resolver import ChannelResolver
from flightfeed.worker import Worker, WorkerConfig

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def actions(location: str, **options: object) -> list[str]:
    with fl.connect(location, **options) as client:
        return [a.type for a in client.list_actions()]


async def test_pyarrow_reads_a_worker_over_tls(certs: Certificates) -> None:
    async with Worker(config=WorkerConfig(tls=certs.server)) as worker:
        assert worker.location.startswith("grpc+tls://127.0.0.1:")
        root = certs.ca.read_bytes()
        got = await anyio.to_thread.run_sync(lambda: actions(worker.location, tls_root_certs=root))
        assert "create_table" in got
        plain = worker.location.replace("grpc+tls://", "grpc://")
        with pytest.raises(fl.FlightUnavailableError):
            await anyio.to_thread.run_sync(lambda: actions(plain))  # plaintext is not served


async def test_mutual_tls_needs_a_client_certificate(certs: Certificates) -> None:
    async with Worker(config=WorkerConfig(tls=certs.mutual)) as worker:
        root = certs.ca.read_bytes()
        with pytest.raises(fl.FlightUnavailableError):
            await anyio.to_thread.run_sync(lambda: actions(worker.location, tls_root_certs=root))
        cert, key = certs.client_cert.read_bytes(), certs.client_key.read_bytes()
        got = await anyio.to_thread.run_sync(
            lambda: actions(worker.location, tls_root_certs=root, cert_chain=cert, private_key=key)
        )
        assert "create_table" in got


async def test_flightfeed_clients_check_the_server(certs: Certificates) -> None:
    async with Worker(config=WorkerConfig(tls=certs.mutual)) as worker:
        async with FlightClient(worker.location, tls=certs.client) as client:
            assert "create_table" in [a.type for a in await client.list_actions()]
        untrusted = ClientTls(
            cert_chain=certs.client.cert_chain, private_key=certs.client.private_key
        )
        async with FlightClient(worker.location, tls=untrusted) as client:
            with pytest.raises(FlightfeedError):  # the system's roots do not know the test CA
                await client.list_actions()
        # A server that closes the connection (mutual TLS without a client certificate,
        # plaintext to TLS) was a bare "Connection lost", naming no call and no server.
        plain = worker.location.replace("grpc+tls://", "grpc://")
        no_certificate = ClientTls(str(certs.ca))
        for location, tls in ((worker.location, no_certificate), (plain, None)):
            async with FlightClient(location, tls=tls) as client:
                where = re.escape(location)  # (the refusal may come while connecting)
                lost = f"ListActions: (the connection to {where} was lost|cannot reach {where})"
                with pytest.raises(RemoteError, match=lost):
                    await client.list_actions()


async def test_a_shuffled_query_over_mutual_tls_workers(
    certs: Certificates, tmp_path: Path
) -> None:
    rows = pa.table({"k": pa.array([i % 7 for i in range(700)]), "v": pa.array(range(700))})
    pq.write_table(rows, tmp_path / "rows.parquet", row_group_size=100)
    config = WorkerConfig(tls=certs.mutual, peer_tls=certs.client, parquet_roots=(str(tmp_path),))
    scan = ParquetScan.from_paths(str(tmp_path / "rows.parquet"), partitions=4)
    async with Worker(config=config) as first, Worker(config=config) as second:
        resolver = StaticWorkerResolver([first.location, second.location])
        channels = ChannelResolver(tls=certs.client)
        async with Coordinator(resolver, channels=channels) as coordinator:
            plan = (
                plan_from(scan)
                .aggregate([(col("k"), "k")], [agg("sum", col("v"), name="total")])
                .plan
            )
            explained = await coordinator.explain(plan)
            got = await coordinator.collect(plan)
    assert "NetworkShuffle" in explained  # the workers read each other, over TLS
    expected = rows.group_by("k").aggregate([("v", "sum")])
    assert sorted(zip(got["k"].to_pylist(), got["total"].to_pylist(), strict=True)) == sorted(
        zip(expected["k"].to_pylist(), expected["v_sum"].to_pylist(), strict=True)
    )
    assert pc.sum(got["total"]).as_py() == sum(range(700))


def test_the_worker_command_serves_mutual_tls(certs: Certificates) -> None:
    tls = certs.mutual
    args = ("--tls-cert", tls.cert_chain, "--tls-key", tls.private_key, "--tls-ca", str(certs.ca))
    with worker_process(*args) as (_, location):
        assert location.startswith("grpc+tls://")
        root, cert = certs.ca.read_bytes(), certs.client_cert.read_bytes()
        key = certs.client_key.read_bytes()
        got = actions(location, tls_root_certs=root, cert_chain=cert, private_key=key)
        assert "create_table" in got
        with pytest.raises(fl.FlightUnavailableError):
            actions(location, tls_root_certs=root)  # no client certificate


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(FlightfeedError, match="private key"):
        ClientTls(cert_chain="client.pem")


def test_a_plain_coordinator_reaches_tls_workers_with_peer_tls_ca(certs: Certificates) -> None:
    """`--peer-tls-ca` trusts the workers' CA without making the coordinator's own port ask its
    clients for certificates (as `--tls-ca` does, which needs a certificate of its own)."""
    from flightfeed.coordinator import table_command
    from flightfeed.examples.chunk_scan import scan_rows

    server = ("--tls-cert", certs.server.cert_chain, "--tls-key", certs.server.private_key)
    builder = ("--session-builder", "flightfeed.examples.chunk_scan:chunk_session_builder")
    with worker_process(*server, *builder) as (_, worker):
        assert worker.startswith("grpc+tls://")
        command = [
            sys.executable, "-m", "flightfeed.cli", "coordinator", "--port", "0",
            "--tables", "flightfeed.examples.chunk_scan:catalog", "--worker", worker,
        ]  # fmt: skip
        refused = subprocess.run(
            [*command, "--tls-ca", str(certs.ca)], capture_output=True, text=True, check=False
        )
        assert refused.returncode == 2
        assert "to trust the CA of grpc+tls:// peers only, give it as --peer-tls-ca" in (
            refused.stderr
        )
        with coordinator_command("--worker", worker, "--peer-tls-ca", str(certs.ca)) as (
            _,
            location,
            _,
        ):
            seed = (1, "3,1", "2")
            with fl.connect(location) as client:  # no certificate: the port asks for none
                info = client.get_flight_info(
                    fl.FlightDescriptor.for_command(table_command("scan", seed))
                )
            root = certs.ca.read_bytes()
            parts = []
            for endpoint in info.endpoints:
                assert endpoint.locations[0].uri.decode() == worker
                with fl.connect(worker, tls_root_certs=root) as reader:
                    parts.append(reader.do_get(endpoint.ticket).read_all())
            got = pa.concat_tables(parts).sort_by("partition")
            assert got.equals(scan_rows(*seed).sort_by("partition"))


def test_local_workers_are_secured_as_their_coordinator(
    certs: Certificates, tmp_path: Path
) -> None:
    """A coordinator with TLS and tokens used to start its --local-workers plain and open: the
    endpoints it handed out were grpc:// addresses serving anyone, in cleartext."""
    from flightfeed.coordinator import table_command
    from flightfeed.examples.chunk_scan import scan_rows

    token = "local-workers-token"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token}\n")
    call = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    root = certs.ca.read_bytes()
    with coordinator_command(
        "--local-workers", "2",
        "--tls-cert", certs.server.cert_chain, "--tls-key", certs.server.private_key,
        "--peer-tls-ca", str(certs.ca), "--auth-token-file", str(tokens),
    ) as (_, location, _):  # fmt: skip
        assert location.startswith("grpc+tls://")
        seed = (2, "3,1", "2", "4", "1,1")
        with fl.connect(location, tls_root_certs=root) as client:
            info = client.get_flight_info(
                fl.FlightDescriptor.for_command(table_command("scan", seed)), call
            )
        parts = []
        for endpoint in info.endpoints:
            worker = endpoint.locations[0].uri.decode()
            assert worker.startswith("grpc+tls://")
            with fl.connect(worker, tls_root_certs=root) as reader:
                with pytest.raises(fl.FlightUnauthenticatedError):
                    reader.do_get(endpoint.ticket).read_all()
                parts.append(reader.do_get(endpoint.ticket, call).read_all())
            plain = worker.replace("grpc+tls://", "grpc://")
            with fl.connect(plain) as client, pytest.raises(fl.FlightUnavailableError):
                client.list_actions(call)  # no TLS, no answer
        got = pa.concat_tables(parts).sort_by("partition")
        assert got.equals(scan_rows(*seed).sort_by("partition"))


async def test_connections_that_never_start_tls_are_closed_at_the_handshake_timeout(
    certs: Certificates,
) -> None:
    """A TLS connection is its protocol's only once the handshake is done, so the HTTP/2
    preface timer never started for one that sent nothing: the loop's own TLS timeout held it
    60 s, whatever --handshake-timeout said (found by a probe)."""
    limits = ConnectionLimits(handshake_timeout=0.5)
    async with Worker(config=WorkerConfig(tls=certs.server, connections=limits)) as worker:
        host, port = parse_location(worker.location)
        silent = [await anyio.connect_tcp(host, port) for _ in range(10)]
        try:
            with anyio.fail_after(10):  # (60 s before)
                for connection in silent:
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                        await connection.receive()
        finally:
            for connection in silent:
                await connection.aclose()
        root = certs.ca.read_bytes()
        got = await anyio.to_thread.run_sync(lambda: actions(worker.location, tls_root_certs=root))
        assert "create_table" in got


def test_an_encrypted_private_key_is_refused_saying_so(
    certs: Certificates, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """OpenSSL asked for the passphrase on the terminal (a worker without one printed the
    prompt twice, then failed with 'Invalid argument') (found by a probe)."""
    key = serialization.load_pem_private_key(Path(certs.server.private_key).read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"a passphrase"),
        )
    )
    refused = r"the TLS private key '.*encrypted\.key' is encrypted \(it asks for a passphrase\)"
    with pytest.raises(InvalidArgument, match=refused):
        ServerTls(certs.server.cert_chain, str(encrypted)).context()
    with pytest.raises(InvalidArgument, match=refused):
        ClientTls(str(certs.ca), certs.server.cert_chain, str(encrypted)).context()
    assert "pass phrase" not in capfd.readouterr().out.lower()
