"""Token files (`--auth-token-file`, flightfeed.flight.auth.read_tokens): what is wrong is said
by file and line, before anything starts, and never with a token in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightfeed.errors import InvalidArgument
from flightfeed.flight.auth import BearerTokens, read_tokens


def test_tokens_one_a_line_skipping_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# ours\n\n  first-token  \nsecond.token~=\n")
    assert read_tokens(str(path)) == ["first-token", "second.token~="]
    assert BearerTokens.from_file(str(path)).accepts("second.token~=")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"good\nsp\xc3\xabcret\n", r"is not ASCII text \(byte 7\)"),
        (b"\xff\xfe", r"is not ASCII text \(byte 0\)"),
        (b"good\nwith space\n", r"line 2: a token is printable ASCII without spaces"),
        (b"good\nbell\x07\n", r"line 2: a token is printable ASCII without spaces"),
        (b"", "holds no token"),
        (b"# only a comment\n\n", "holds no token"),
    ],
)
def test_a_bad_token_file_is_refused_by_file_and_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(content)
    with pytest.raises(InvalidArgument, match=message) as refused:
        read_tokens(str(path))
    assert str(path) in str(refused.value)
    assert "good" not in str(refused.value)
    assert "cret" not in str(refused.value)


def test_a_missing_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"cannot read the token file .*No such file"):
        read_tokens(str(tmp_path / "absent"))
