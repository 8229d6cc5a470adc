"""A table's name as text (`TableName.__str__`, in lists and messages) reads back as the same
table (`TableName.parse`, the command line's): a part with a dot or a leading quote is quoted,
so the table named "a.b.c" is not table c of catalog a, schema b."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.tables.store import TableName

PART = st.text(st.sampled_from('ab."_ \\é'), min_size=1, max_size=8)


@given(PART, PART, PART)
def test_a_name_as_text_reads_back_as_the_same_table(table: str, catalog: str, schema: str) -> None:
    name = TableName.of(table, catalog, schema)
    assert TableName.parse(str(name)) == name


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("t", ("flightfeed", "public", "t")),
        ("a.b.c", ("a", "b", "c")),
        ('"a.b.c"', ("flightfeed", "public", "a.b.c")),
        ('a."b.c".d', ("a", "b.c", "d")),
        ('"say ""hi"""', ("flightfeed", "public", 'say "hi"')),
        ('x"y', ("flightfeed", "public", 'x"y')),
    ],
)
def test_parse(text: str, parts: tuple[str, str, str]) -> None:
    name = TableName.parse(text)
    assert (name.catalog, name.schema, name.table) == parts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a.b", "a table is TABLE or CATALOG.SCHEMA.TABLE, got 'a.b'"),
        ("a.b.c.d", "a table is TABLE or CATALOG.SCHEMA.TABLE"),
        ('"a.b', "quote is not closed"),
        ('a.."', "quote is not closed"),
        ("a..c", "bad table name 'a..c': a part of it is empty"),
        ('""', "a part of it is empty"),
    ],
)
def test_a_name_that_is_not_one_is_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        TableName.parse(text)
