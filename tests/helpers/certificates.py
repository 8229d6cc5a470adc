"""Test certificates from trustme, a test CA, written as PEM files: a server certificate for
127.0.0.1 and localhost, a client certificate for mutual TLS, and the ServerTls of a server
with and without the client check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from flightfeed.flight.tls import ClientTls, ServerTls


@dataclass(frozen=True)
class Certificates:
    ca: Path
    """The CA that signed the server's and the client's certificates (PEM)."""
    server: ServerTls
    mutual: ServerTls
    """The same server, requiring a client certificate the CA signed."""
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: a client trusting only it refuses the server."""

    @property
    def client(self) -> ClientTls:
        """Trusts the CA and presents the client certificate."""
        return ClientTls(str(self.ca), str(self.client_cert), str(self.client_key))


def make_certificates(where: Path) -> Certificates:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(where / "other-ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(where / "server.pem"))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(where / "server.pem"), append=True)
    server.private_key_pem.write_to_path(str(where / "server.key"))
    client = ca.issue_cert("client.flightfeed.test")
    client.cert_chain_pems[0].write_to_path(str(where / "client.pem"))
    client.private_key_pem.write_to_path(str(where / "client.key"))
    server_tls = ServerTls(str(where / "server.pem"), str(where / "server.key"))
    return Certificates(
        ca=where / "ca.pem",
        server=server_tls,
        mutual=ServerTls(server_tls.cert_chain, server_tls.private_key, str(where / "ca.pem")),
        client_cert=where / "client.pem",
        client_key=where / "client.key",
        other_ca=where / "other-ca.pem",
    )
