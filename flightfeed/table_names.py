"""A table's name as text: `TABLE` or `CATALOG.SCHEMA.TABLE`, a part with a dot in it (or
starting with a double quote) in double quotes, a quote inside doubled, as in SQL. So
`flightfeed.public."a.b.c"` is the table named a.b.c, and `a.b.c` is table c of catalog a,
schema b. The command line, Spark's `table` option and every message name tables this way:
before, both of those tables were listed as a.b.c, and `drop a.b.c` dropped the second."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .errors import InvalidArgument

TABLE_ID_METADATA: Final = b"flightfeed.table_id"
"""The schema metadata key under which a worker's GetSchema of a table gives the table's id: a
table dropped and created again under the same name has another, and a Spark write that
learned one refuses to publish into the other."""


def split_name(text: str) -> list[str]:
    """The parts of a table's name as text (one or more; InvalidArgument for an empty one or
    an unclosed quote)."""
    parts: list[str] = []
    part: list[str] = []
    quoted = False
    at = 0
    while at < len(text):
        char = text[at]
        if quoted and char == '"' and text[at + 1 : at + 2] == '"':
            part.append('"')
            at += 1
        elif char == '"' and (quoted or not part):
            quoted = not quoted
        elif char == "." and not quoted:
            parts.append("".join(part))
            part = []
        else:
            part.append(char)
        at += 1
    if quoted:
        raise InvalidArgument(f"a table name's quote is not closed: {text!r}")
    parts.append("".join(part))
    if "" in parts:
        raise InvalidArgument(f"bad table name {text!r}: a part of it is empty")
    return parts


def joined_name(parts: Iterable[str]) -> str:
    """The parts as text that `split_name` reads back."""
    return ".".join(_quoted(part) for part in parts)


def _quoted(part: str) -> str:
    if "." in part or part.startswith('"'):
        return '"' + part.replace('"', '""') + '"'
    return part


THREE_PARTS = "a table is TABLE or CATALOG.SCHEMA.TABLE"
"""The start of the error for a name of another number of parts."""
QUOTE_HINT = """(a name with a dot in it is quoted: '"a.b"')"""


__all__ = ["QUOTE_HINT", "THREE_PARTS", "joined_name", "split_name"]
