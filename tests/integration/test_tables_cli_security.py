"""`flightfeed tables` against real `flightfeed worker` processes that serve TLS and require a
bearer token (one of them also a client certificate: mutual TLS): with the right CA, token and
certificate every command works; a missing or wrong token, an unknown CA or a missing client
certificate is exit 1 with one line naming the worker (never the token); a bad flag
combination is exit 2 and nothing is sent. Certificates come from trustme, a test CA."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.certificates import Certificates, make_certificates
from helpers.tables_cli import tables
from helpers.worker_process import worker_process

TOKEN = "tables-cli-s3cret-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def token_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The workers' token file (a comment, then TOKEN, then another), and one with a token
    they do not accept."""
    where = tmp_path_factory.mktemp("tokens")
    good, wrong = where / "tokens", where / "wrong"
    good.write_text(f"# the operators' token\n{TOKEN}\nanother-accepted-token\n")
    wrong.write_text("not-the-token\n")
    return good, wrong


@pytest.fixture(scope="module")
def tls_worker(
    certs: Certificates, token_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A worker serving TLS (no client certificate needed) and requiring a token."""
    tls = certs.server
    with worker_process(
        "--data-dir", str(tmp_path_factory.mktemp("tables")),
        "--tls-cert", tls.cert_chain, "--tls-key", tls.private_key,
        "--auth-token-file", str(token_files[0]),
    ) as (_, location):  # fmt: skip
        assert location.startswith("grpc+tls://")
        yield location


@pytest.fixture(scope="module")
def mtls_worker(
    certs: Certificates, token_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A worker requiring mutual TLS (a client certificate the CA signed) and a token."""
    tls = certs.mutual
    with worker_process(
        "--data-dir", ":memory:",
        "--tls-cert", tls.cert_chain, "--tls-key", tls.private_key, "--tls-ca", str(certs.ca),
        "--auth-token-file", str(token_files[0]),
    ) as (_, location):  # fmt: skip
        yield location


def one_error_line(err: str, command: str, subject: str, worker: str) -> str:
    """The error's one line, naming the command, the table and the worker; its reason. It
    never holds a token."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = f"flightfeed: error: {command} {subject} on {worker}: "
    assert lines[0].startswith(prefix), lines[0]
    assert TOKEN not in err
    assert "not-the-token" not in err
    return lines[0][len(prefix) :]


COLUMNS = ("--column", "ts:timestamp", "--column", "host:string:tag", "--column", "v:double")


def test_every_command_over_tls_with_the_token(
    tls_worker: str,
    certs: Certificates,
    token_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    secured: tuple[str, ...] = ("--worker", tls_worker, "--tls-ca", str(certs.ca))
    secured += ("--auth-token-file", str(token_files[0]))
    code, out, err = tables(capsys, "create", *secured, "cpu", *COLUMNS)
    assert (code, err) == (0, ""), err
    assert out.startswith(f"created table flightfeed.public.cpu on {tls_worker}: 3 columns")

    code, out, err = tables(capsys, "list", *secured)
    assert (code, out, err) == (0, "flightfeed.public.cpu\n", "")

    code, out, err = tables(capsys, "count", *secured, "cpu")
    assert (code, out, err) == (0, "0\n", "")

    code, out, err = tables(capsys, "describe", *secured, "cpu", "--json")
    assert (code, err) == (0, ""), err
    described = json.loads(out)
    assert described["worker"] == tls_worker
    assert [c["name"] for c in described["columns"]] == ["ts", "host", "v"]

    code, out, err = tables(capsys, "alter", *secured, "cpu", "--add-column", "region:string")
    assert (code, err) == (0, ""), err
    assert "added column(s) region (schema version 1 → 2)" in out

    code, out, err = tables(capsys, "drop", *secured, "cpu")
    assert (code, out, err) == (0, f"dropped table flightfeed.public.cpu on {tls_worker}\n", "")
    code, out, err = tables(capsys, "list", *secured)
    assert (code, out, err) == (0, "", f"no tables on {tls_worker}\n")


@pytest.mark.parametrize("command", ["list", "count", "describe", "create", "drop"])
def test_without_the_token_the_worker_refuses(
    tls_worker: str, certs: Certificates, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = {"list": [], "create": ["t", *COLUMNS]}.get(command, ["t"])
    code, out, err = tables(
        capsys, command, "--worker", tls_worker, "--tls-ca", str(certs.ca), *extra
    )
    assert (code, out) == (1, "")
    subject = "tables" if command == "list" else "flightfeed.public.t"
    reason = one_error_line(err, command, subject, tls_worker)
    assert reason == "the worker requires a bearer token: give --auth-token-file FILE"


@pytest.mark.parametrize("command", ["list", "describe"])
def test_a_wrong_token_is_refused_without_showing_it(
    tls_worker: str,
    certs: Certificates,
    token_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    extra = [] if command == "list" else ["t"]
    code, out, err = tables(
        capsys, command, "--worker", tls_worker, "--tls-ca", str(certs.ca),
        "--auth-token-file", str(token_files[1]), *extra,
    )  # fmt: skip
    assert (code, out) == (1, "")
    subject = "tables" if command == "list" else "flightfeed.public.t"
    reason = one_error_line(err, command, subject, tls_worker)
    assert reason == "the worker refused the token (of --auth-token-file)"


def test_without_the_ca_the_server_is_not_trusted(
    tls_worker: str,
    certs: Certificates,
    token_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = ("--auth-token-file", str(token_files[0]))
    for ca in ([], ["--tls-ca", str(certs.other_ca)]):  # the system's roots; another CA
        code, out, err = tables(capsys, "list", "--worker", tls_worker, *ca, *token)
        assert (code, out) == (1, "")
        reason = one_error_line(err, "list", "tables", tls_worker)
        assert reason.startswith("cannot reach the worker ("), reason
        assert "CERTIFICATE_VERIFY_FAILED" in reason, reason
        assert "--tls-ca must be the CA that signed the worker's certificate" in reason


def test_mutual_tls_with_and_without_a_client_certificate(
    mtls_worker: str,
    certs: Certificates,
    token_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    secured: tuple[str, ...] = ("--worker", mtls_worker, "--tls-ca", str(certs.ca))
    secured += ("--auth-token-file", str(token_files[0]))
    client = ("--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key))
    code, out, err = tables(capsys, "create", *secured, *client, "mem", *COLUMNS)
    assert (code, err) == (0, ""), err
    code, out, err = tables(capsys, "list", *secured, *client)
    assert (code, out, err) == (0, "flightfeed.public.mem\n", "")
    code, out, err = tables(capsys, "count", *secured, *client, "mem")
    assert (code, out, err) == (0, "0\n", "")

    for command, extra in (("list", []), ("count", ["mem"])):
        code, out, err = tables(capsys, command, *secured, *extra)
        assert (code, out) == (1, "")
        subject = "tables" if command == "list" else "flightfeed.public.mem"
        reason = one_error_line(err, command, subject, mtls_worker)
        assert reason.startswith("cannot reach the worker ("), reason
        assert "needs --tls-cert and --tls-key" in reason


def test_bad_flag_combinations_send_nothing(
    tls_worker: str,
    certs: Certificates,
    token_files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = tls_worker.replace("grpc+tls://", "grpc://")
    empty = tmp_path / "empty"
    empty.write_text("# no token here\n\n")
    cases = [
        (
            ["--worker", tls_worker, "--tls-cert", str(certs.client_cert)],
            tls_worker,
            "--tls-cert and --tls-key go together",
        ),
        (
            ["--worker", tls_worker, "--tls-key", str(certs.client_key)],
            tls_worker,
            "--tls-cert and --tls-key go together",
        ),
        (
            ["--worker", plain, "--tls-ca", str(certs.ca)],
            plain,
            f"--tls-ca, --tls-cert and --tls-key are for a grpc+tls:// worker, not {plain}",
        ),
        (
            ["--worker", tls_worker, "--tls-ca", str(tmp_path / "missing.pem")],
            tls_worker,
            "cannot use the client's TLS files",
        ),
        (
            ["--worker", tls_worker, "--auth-token-file", str(tmp_path / "missing")],
            tls_worker,
            "cannot read the token file",
        ),
        (
            ["--worker", tls_worker, "--auth-token-file", str(empty)],
            tls_worker,
            f"the token file {str(empty)!r} holds no token",
        ),
    ]
    for argv, worker, reason in cases:
        code, out, err = tables(capsys, "list", *argv)
        assert (code, out) == (2, ""), err
        assert one_error_line(err, "list", "tables", worker).startswith(reason), err
