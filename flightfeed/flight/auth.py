"""Who may call a server: a bearer token in the `authorization` header of every call, on every
service of the port (Flight, the WorkerService, the tables' RemoteEngineService), checked
before any handler runs.

`BearerTokens` accepts a set of tokens (kept as SHA-256 digests, compared in constant time);
any callable that receives a call's headers and says yes or no works too. Flight's Handshake
is how clients that speak Basic auth (pyarrow's `authenticate_basic_token`) get the header:
with a valid token as their password, the answer carries `authorization: Bearer <token>`.
A token never appears in a log line or an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from typing import Final, Protocol

from ..errors import InvalidArgument

AUTHORIZATION: Final = "authorization"
_BEARER: Final = "bearer "
_BASIC: Final = "basic "
REFUSED: Final = "missing or invalid bearer token in the authorization header"

Headers = Sequence[tuple[str, str]]


class Authenticator(Protocol):
    def __call__(self, headers: Headers, /) -> bool:
        """Whether the call with these request headers may run."""
        ...


class BearerTokens:
    """`authorization: Bearer <token>` with one of `tokens`."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = [_digest(t) for t in tokens if t]
        if not self._digests:
            raise InvalidArgument("an authenticator needs at least one token")

    @classmethod
    def from_file(cls, path: str) -> BearerTokens:
        return cls(read_tokens(path))

    def accepts(self, token: str) -> bool:
        digest = _digest(token)
        found = False
        for known in self._digests:  # every one compared: no early exit to time
            found |= hmac.compare_digest(digest, known)
        return found

    def __call__(self, headers: Headers, /) -> bool:
        token = bearer_token(headers)
        return token is not None and self.accepts(token)


def read_tokens(path: str) -> list[str]:
    """A token file: one token per line (blank lines and lines starting with # skipped), each
    printable ASCII without spaces, as an `authorization` header carries it. What is wrong is
    said by the file and line, never with the token."""
    try:
        with open(path, encoding="ascii") as file:
            lines = [line.strip() for line in file]
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"the token file {path!r} is not ASCII text (byte {exc.start}): a token is printable"
            " ASCII"
        ) from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read the token file {path!r}: {exc.strerror}") from None
    tokens = []
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith("#"):
            continue
        if not _TOKEN.fullmatch(line):
            raise InvalidArgument(
                f"the token file {path!r}, line {number}: a token is {TOKEN_CHARACTERS}"
            )
        tokens.append(line)
    if not tokens:
        raise InvalidArgument(f"the token file {path!r} holds no token (one a line)")
    return tokens


_TOKEN: Final = re.compile(r"[!-~]+")
TOKEN_CHARACTERS: Final = "printable ASCII without spaces or control characters"


def is_token(text: str) -> bool:
    """Whether `text` can be a bearer token (what an `authorization` header can carry)."""
    return _TOKEN.fullmatch(text) is not None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def bearer_token(headers: Headers) -> str | None:
    """The token of an `authorization: Bearer <token>` header, if there is one."""
    for name, value in headers:
        if name == AUTHORIZATION and value[: len(_BEARER)].lower() == _BEARER:
            return value[len(_BEARER) :].strip()
    return None


def basic_password(headers: Headers) -> str | None:
    """The password of an `authorization: Basic <base64 user:password>` header."""
    for name, value in headers:
        if name == AUTHORIZATION and value[: len(_BASIC)].lower() == _BASIC:
            try:
                decoded = base64.b64decode(value[len(_BASIC) :].strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
            _, _, password = decoded.partition(":")
            return password
    return None


def handshake_token(headers: Headers) -> str | None:
    """What a Handshake answers with: the bearer token, or the password of Basic credentials,
    without the whitespace around it (a password read from a file keeps its line break, and
    the check strips it too); None unless a header can carry it back (printable ASCII, no
    spaces), so that sending it can never fail with the token in the error."""
    token = bearer_token(headers) or basic_password(headers)
    token = token.strip() if token else None
    return token if token and _TOKEN.fullmatch(token) else None


def bearer(token: str) -> dict[str, str]:
    """The header a client sends with every call."""
    return {AUTHORIZATION: f"Bearer {token}"}


__all__ = [
    "AUTHORIZATION",
    "REFUSED",
    "Authenticator",
    "BearerTokens",
    "basic_password",
    "bearer",
    "bearer_token",
    "handshake_token",
    "read_tokens",
]
