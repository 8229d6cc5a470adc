"""The data source's token and TLS options (flightfeed.spark.client.Connection): parsed in any
case, checked together (a client certificate needs its key, one token option at most), files
read where a call is made with an error naming the option, the token sent as a bearer header
and never shown in a repr or an error, and everything plain data that pickles to executors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from flightfeed.errors import InvalidArgument, RemoteError, Unauthenticated
from flightfeed.spark.client import (
    COORDINATOR,
    PLAIN,
    Connection,
    Endpoint,
    flight_error,
    read_endpoint,
)
from flightfeed.spark.source import FlightfeedReader, TableOptions
from flightfeed.spark.writer import FlightfeedTableWriter, TableTarget

URI = "grpc+tls://127.0.0.1:1"  # nothing listens: a test that reached the network would fail
TOKEN = "unit-s3cret-token"
SCHEMA = StructType([StructField("n", LongType())])


def options(**more: str) -> dict[str, str]:
    return {"uri": URI, "table": "scan", **more}


def test_the_options_in_any_case() -> None:
    table = TableOptions.of(
        options(
            TOKEN=TOKEN,
            TLSROOTCERTS="/ca.pem",
            tlscertchain="/client.pem",
            TlsPrivateKey="/client.key",
        )
    )
    assert table.connection == Connection(
        token=TOKEN, root_certs="/ca.pem", cert_chain="/client.pem", private_key="/client.key"
    )
    assert TableOptions.of(options(tokenFile="/tokens")).connection == Connection(
        token_file="/tokens"
    )
    assert TableOptions.of(options()).connection == PLAIN


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tlsCertChain": "/c.pem"}, "options 'tlsCertChain' and 'tlsPrivateKey' go together"),
        ({"tlsPrivateKey": "/c.key"}, "options 'tlsCertChain' and 'tlsPrivateKey' go together"),
        ({"token": TOKEN, "tokenFile": "/t"}, "give option 'token' or 'tokenFile', not both"),
        ({"token": "  "}, "option 'token' is empty"),
        # gRPC refused these only once sent: INTERNAL "Invalid metadata" (found by a probe)
        ({"token": f"{TOKEN}\u2019"}, "option 'token': a token is printable ASCII without"),
        ({"token": "two words"}, "option 'token': a token is printable ASCII without"),
        ({"token": f"{TOKEN}\x07"}, "option 'token': a token is printable ASCII without"),
        ({"token": TOKEN, "header.Authorization": "Bearer x"}, "both set the authorization"),
        ({"tokenFile": "/t", "header.authorization": "Bearer x"}, "both set the authorization"),
    ],
)
def test_options_that_do_not_go_together(given: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        TableOptions.of(options(**given))
    assert TOKEN not in str(info.value)


def test_the_token_is_sent_as_a_bearer_header(tmp_path: Path) -> None:
    assert Connection(token=f" {TOKEN} ").headers() == [
        (b"authorization", f"Bearer {TOKEN}".encode())
    ]
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# ours\n\n{TOKEN}\nsecond\n")
    assert Connection(token_file=str(tokens)).headers() == [
        (b"authorization", f"Bearer {TOKEN}".encode())
    ]
    assert PLAIN.headers() == []


def test_a_missing_file_is_named_by_its_option_before_anything_is_sent(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    existing = tmp_path / "exists.pem"
    existing.write_text("not read: the other file is missing first\n")
    cases = {
        "tlsRootCerts": {"tlsRootCerts": missing},
        "tlsCertChain": {"tlsCertChain": missing, "tlsPrivateKey": str(existing)},
        "tlsPrivateKey": {"tlsCertChain": str(existing), "tlsPrivateKey": missing},
        "tokenFile": {"tokenFile": missing},
    }
    for option, given in cases.items():
        table = TableOptions.of(options(**given))
        with pytest.raises(InvalidArgument, match=f"option '{option}': cannot read ") as info:
            table.arrow_schema()
        assert missing in str(info.value)
        assert "on Spark's executors too" in str(info.value)
    with pytest.raises(InvalidArgument, match=r"option 'tokenFile': .* holds no token"):
        TableOptions.of(options(tokenFile=str(empty))).arrow_schema()


def test_a_file_that_holds_something_else_is_named_by_its_option(tmp_path: Path) -> None:
    """Before, a key or a token file given as the CA's certificate failed the first call with
    gRPC's "empty address list"."""
    token = tmp_path / "token"
    token.write_text(f"{TOKEN}\n")
    certificate = tmp_path / "cert.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    cases = {
        "tlsRootCerts": ({"tlsRootCerts": str(token)}, "certificates"),
        "tlsCertChain": ({"tlsCertChain": str(token), "tlsPrivateKey": str(token)}, "certif"),
        "tlsPrivateKey": (
            {"tlsCertChain": str(certificate), "tlsPrivateKey": str(certificate)},
            "private key",
        ),
    }
    for option, (given, what) in cases.items():
        table = TableOptions.of(options(**given))
        with pytest.raises(InvalidArgument, match=f"option '{option}': .* holds no {what}") as info:
            table.arrow_schema()
        assert TOKEN not in str(info.value)


def test_a_reader_on_an_executor_reads_the_files_there(tmp_path: Path) -> None:
    """A read (what an executor runs) reads the files itself, and names a missing one."""
    table = TableOptions.of(options(tokenFile=str(tmp_path / "absent")))
    endpoint = Endpoint(b"ticket", (URI,))
    with pytest.raises(InvalidArgument, match="option 'tokenFile'"):
        list(read_endpoint(endpoint, table.headers, connection=table.connection))


def test_no_repr_shows_the_token() -> None:
    table = TableOptions.of(options(token=TOKEN, tlsRootCerts="/ca.pem"))
    table_with_header = TableOptions.of(options(**{"header.Authorization": f"Bearer {TOKEN}"}))
    target = TableTarget(URI, "t", pa.schema([]), {}, 1.0, table.connection)
    writer = FlightfeedTableWriter(target, "job", False)
    for shown in (table, table_with_header, table.connection, target):
        assert TOKEN not in repr(shown)
        assert TOKEN not in str(shown)
        assert "<hidden>" in repr(shown)
    assert "root_certs='/ca.pem'" in repr(table)
    assert TOKEN not in repr(vars(writer))
    assert repr(Connection(token_file="/t")) == "Connection(token_file='/t')"


def test_the_reader_and_writer_pickle_with_their_connection() -> None:
    """Spark pickles the reader and the writer to other processes."""
    table = TableOptions.of(
        options(token=TOKEN, tlsRootCerts="/ca.pem", tlsCertChain="/c.pem", tlsPrivateKey="/c.k")
    )
    reader = pickle.loads(pickle.dumps(FlightfeedReader(table, SCHEMA)))
    assert reader.table == table
    assert reader.table.connection.bearer_token() == TOKEN
    target = TableTarget(URI, "t", pa.schema([("n", pa.int64())]), {}, 1.0, table.connection)
    writer = pickle.loads(pickle.dumps(FlightfeedTableWriter(target, "job", True)))
    assert writer.target == target


@pytest.mark.parametrize(
    ("said", "error"),
    [  # (what pyarrow's client raised: the coordinator down, then up without its workers)
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9:"
            " Failed to connect to remote host: Connection refused",
            f"cannot reach the flightfeed coordinator at {URI} (GetFlightInfo): unavailable"
            " error, with message: failed to connect",
        ),
        (
            "no worker can be reached: grpc://127.0.0.1:9: grpc://127.0.0.1:9 did not answer"
            " GetWorkerInfo (GetWorkerInfo: cannot reach grpc://127.0.0.1:9: [Errno 111]"
            " Connection refused): is it a flightfeed worker, and is it up?",
            f"the flightfeed coordinator at {URI} answered GetFlightInfo UNAVAILABLE:"
            " unavailable error, with message: no worker can be reached",
        ),
    ],
)
def test_unavailable_says_whether_the_server_answered(said: str, error: str) -> None:
    """A coordinator that answered "no worker can be reached" was reported as one that could
    not be reached (found by a probe)."""
    unavailable = fl.FlightUnavailableError(
        f"Flight returned unavailable error, with message: {said}"
    )
    found = flight_error(URI, "GetFlightInfo", unavailable, COORDINATOR)
    assert isinstance(found, RemoteError)
    assert str(found).startswith(error)


def test_an_unauthenticated_answer_says_the_token_was_missing_or_refused() -> None:
    refused = fl.FlightUnauthenticatedError(
        "Flight returned unauthenticated error, with message: missing or invalid bearer token"
    )
    error = flight_error(URI, "GetSchema", refused, COORDINATOR)
    assert isinstance(error, Unauthenticated)
    assert str(error) == (
        f"the flightfeed coordinator at {URI} refused GetSchema: the bearer token is missing or"
        " wrong (give option 'token' or 'tokenFile' a token it accepts)"
    )
    # pyarrow raises some statuses as a plain OSError (a coordinator's, with a detail)
    plain = OSError(
        "Flight returned unauthenticated error, with message: missing or invalid bearer token"
        " in the authorization header. Detail: Unauthenticated"
    )
    assert isinstance(flight_error(URI, "DoGet", plain), Unauthenticated)
    assert isinstance(flight_error(URI, "x", pa.ArrowInvalid("bad")), InvalidArgument)
