"""A table's schema: columns with stable ids, the timestamp column, tags and the primary key,
and a version that every change raises. It converts to and from HoraeDB's `schema.TableSchema`
(what GetTableInfo answers and AlterTableSchema asks for) and to Arrow.

Rules, as HoraeDB has them: the timestamp column is a non-null TIMESTAMP and part of the
primary key; primary-key columns are not null; tags are not floating point. The default
primary key is the tags, then the timestamp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import pyarrow as pa

from .._generated.schema import ColumnSchema, DataType
from .._generated.schema import TableSchema as TableSchemaProto
from ..errors import InvalidArgument
from .types import ColumnType, of_arrow, of_data_type

MAX_COLUMNS: Final = 4096
MAX_NAME_BYTES: Final = 255


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True
    is_tag: bool = False
    id: int = 0
    comment: str = ""

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type.arrow, nullable=self.nullable)


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[Column, ...]
    timestamp: str
    primary_key: tuple[str, ...]
    version: int = 1

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def from_arrow(
        cls,
        schema: pa.Schema,
        *,
        timestamp: str,
        tags: Sequence[str] = (),
        primary_key: Sequence[str] | None = None,
    ) -> TableSchema:
        """A new table's schema from Arrow fields (ids 1, 2, ...). The timestamp and primary-key
        columns become non-null whatever the fields say."""
        key = tuple(primary_key) if primary_key is not None else (*tags, timestamp)
        unknown = sorted({timestamp, *tags, *key} - set(schema.names))
        if unknown:
            raise InvalidArgument(f"no column(s) {unknown} in {schema.names}")
        columns = tuple(
            Column(
                name=f.name,
                type=of_arrow(f.type),
                nullable=f.nullable and f.name not in key and f.name != timestamp,
                is_tag=f.name in tags,
                id=i + 1,
            )
            for i, f in enumerate(schema)
        )
        return cls(columns, timestamp, key)

    @property
    def arrow(self) -> pa.Schema:
        return pa.schema([c.field for c in self.columns])

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise InvalidArgument(f"no column {name!r} in {self.names}")

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_tag)

    def with_added(self, added: Sequence[Column]) -> TableSchema:
        """The next version with `added` columns appended, as given: nullable (old rows hold
        none), a tag or not, each with its id if it has one (a HoraeDB node assigns them, and
        writes by them: the id must be new), else the next free one (id 0: unset)."""
        taken = {c.id: c.name for c in self.columns}
        for c in added:
            if not c.nullable:
                raise InvalidArgument(f"an added column must be nullable: {c.name!r} is not")
            if c.id and c.id in taken:
                raise InvalidArgument(
                    f"added column {c.name!r} asks for id {c.id}, which column"
                    f" {taken[c.id]!r} has: an added column's id must be new"
                )
            if c.id:
                taken[c.id] = c.name
        next_id = max(taken, default=0) + 1
        fresh = []
        for c in added:
            if c.id:
                fresh.append(c)
            else:
                fresh.append(replace(c, id=next_id))
                next_id += 1
        return replace(self, columns=(*self.columns, *fresh), version=self.version + 1)

    def to_proto(self) -> TableSchemaProto:
        ids = {c.name: c.id for c in self.columns}
        return TableSchemaProto(
            columns=[
                ColumnSchema(
                    name=c.name,
                    data_type=c.type.data_type,
                    is_nullable=c.nullable,
                    id=c.id,
                    is_tag=c.is_tag,
                    comment=c.comment,
                )
                for c in self.columns
            ],
            version=self.version,
            timestamp_id=ids[self.timestamp],
            primary_key_ids=[ids[name] for name in self.primary_key],
        )

    @classmethod
    def from_proto(cls, msg: TableSchemaProto) -> TableSchema:
        """From the network: every id and type is checked."""
        columns = tuple(
            Column(
                name=c.name,
                type=of_data_type(c.data_type),
                nullable=c.is_nullable,
                is_tag=c.is_tag,
                id=c.id,
                comment=c.comment,
            )
            for c in msg.columns
        )
        if len(columns) > MAX_COLUMNS:
            raise InvalidArgument(f"a table has at most {MAX_COLUMNS} columns, got {len(columns)}")
        by_id: dict[int, str] = {}
        for c in columns:
            if c.id in by_id:
                raise InvalidArgument(
                    f"column ids in a table schema must be distinct: {by_id[c.id]!r} and"
                    f" {c.name!r} are both id {c.id}"
                )
            by_id[c.id] = c.name
        missing = [i for i in (msg.timestamp_id, *msg.primary_key_ids) if i not in by_id]
        if missing:
            raise InvalidArgument(f"the table schema names column ids {missing} it does not have")
        return cls(
            columns,
            by_id[msg.timestamp_id],
            tuple(by_id[i] for i in msg.primary_key_ids),
            msg.version or 1,  # an alteration's requested schema need not carry one
        )


RESERVED_PREFIX = "__ff_"
"""Columns the store adds to a table's staging (job, partition, attempt) or its writes (order)."""


def check_new_column_names(names: Sequence[str]) -> None:
    """Refuse the names a table cannot take for a new column: DuckDB's row id pseudo-column
    (a column of that name hides it: reads split by row id returned no rows) and the store's
    own columns. Checked where columns are created, not for stored tables."""
    for name in names:
        folded = name.casefold()
        if folded == "rowid" or folded.startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"column name {name!r} is reserved (rowid, and names starting with"
                f" {RESERVED_PREFIX!r}, are the table store's own): choose another"
            )


def _check(schema: TableSchema) -> None:
    names = schema.names
    if not names:
        raise InvalidArgument("a table needs at least one column")
    folded = [name.casefold() for name in names]  # SQL names (DuckDB's) ignore case
    if len(set(folded)) != len(folded):
        clashing = [name for name in names if folded.count(name.casefold()) > 1]
        raise InvalidArgument(f"column names must be distinct, ignoring case, got {clashing}")
    for name in names:
        if not name or len(name.encode()) > MAX_NAME_BYTES or "\x00" in name:
            raise InvalidArgument(f"bad column name {name!r} (1 to {MAX_NAME_BYTES} bytes)")
    ts = schema.column(schema.timestamp)
    if ts.type.data_type != DataType.TIMESTAMP or ts.nullable:
        raise InvalidArgument(
            f"the timestamp column {ts.name!r} must be a non-null TIMESTAMP,"
            f" got {ts.type.data_type.name}{' (nullable)' if ts.nullable else ''}"
        )
    if schema.timestamp not in schema.primary_key:
        raise InvalidArgument(f"the primary key {list(schema.primary_key)} must hold {ts.name!r}")
    if len(set(schema.primary_key)) != len(schema.primary_key):
        raise InvalidArgument(f"primary key columns repeat: {list(schema.primary_key)}")
    for name in schema.primary_key:
        if schema.column(name).nullable:
            raise InvalidArgument(f"primary key column {name!r} must not be nullable")
    for c in schema.columns:
        if c.is_tag and c.type.data_type in (DataType.DOUBLE, DataType.FLOAT):
            raise InvalidArgument(f"tag {c.name!r} cannot be floating point")
    if schema.version < 1:
        raise InvalidArgument(f"schema versions start at 1, got {schema.version}")


__all__ = ["MAX_COLUMNS", "Column", "TableSchema", "check_new_column_names", "of_arrow"]
