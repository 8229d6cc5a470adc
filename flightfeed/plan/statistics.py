"""How big a plan's output may be, as far as its leaves know: the planner's broadcast decision
and its task counts for upper stages.

A leaf says what it holds: `estimated_bytes` and `estimated_rows` (a ParquetScan, from the
files' footers) or `embedded_bytes` and `embedded_rows` (a MemoryScan's own batches). Above
the leaves, each node kind bounds its output from its input's:

- a filter, a coalesce or a repartition passes rows on or keeps fewer of them: taken at its
  input's size;
- a projection keeps its input's rows, each as wide as its own fixed-width columns and their
  validity (with a variable-width column: its input's size, an underestimate if it computes
  wider strings);
- a limit, or a sort with a fetch (top-k), keeps at most `fetch` rows per partition;
- an aggregate keeps at most one row per group, and its rows are its own schema's: keys and
  aggregate values, not its input's columns. Without keys that is one row per partition,
  as wide as its fixed-width columns and their validity. With keys it is at most a row per
  input row: the smaller of that many of its own rows and its input's bytes (an estimate,
  not a bound: a count per key can make a few more bytes than the input had). A variable
  width column is bounded by nothing better than the input's size;
- a union is the sum of its inputs.

Anything else (a join) is unknown: None. Rows are None where the leaves did not say; the
bytes then pass through unbounded by row counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from .base import ExecutionPlan
from .metrics import unwrap

PASSING_KINDS: Final = frozenset({"Filter", "Coalesce", "Repartition"})
"""Nodes whose output is taken at their input's size."""

_VALIDITY_BYTES: Final = 1
"""Per column and row, rounding an Arrow validity bitmap's bit up: keeps the bound a bound."""


@dataclass(frozen=True)
class Estimate:
    """At most `bytes` of Arrow data in at most `rows` rows (None: not known)."""

    bytes: int
    rows: int | None = None

    def keeping(self, rows: int) -> Estimate:
        """This output cut to at most `rows` rows, its bytes in proportion."""
        if self.rows is None:
            return Estimate(self.bytes, rows)
        kept = min(self.rows, rows)
        share = self.bytes * kept // self.rows if self.rows else 0
        return Estimate(share, kept)


def estimate(plan: ExecutionPlan) -> Estimate | None:
    """The size `plan`'s output may decode to, or None when nothing says."""
    node = unwrap(plan)
    if not node.children:
        return _leaf(node)
    if node.name == "Union":
        parts = [estimate(child) for child in node.children]
        if any(part is None for part in parts):
            return None
        known = [part for part in parts if part is not None]
        rows = [part.rows for part in known]
        total_rows = None if any(r is None for r in rows) else sum(r for r in rows if r)
        return Estimate(sum(part.bytes for part in known), total_rows)
    if len(node.children) != 1:
        return None
    below = estimate(node.children[0])
    if below is None:
        return None
    if node.name in PASSING_KINDS:
        return below
    if node.name == "Projection":  # as many rows, each as wide as its own columns if known
        width = _fixed_row_width(node.schema)
        if width is None or below.rows is None:
            return below
        return Estimate(below.rows * width, below.rows)
    if node.name in ("Limit", "Sort"):  # fetch None: every row
        fetch = getattr(node, "fetch", None)
        return below.keeping(fetch * node.output_partitions) if isinstance(fetch, int) else below
    if node.name == "HashAggregate":
        return _aggregate(node, below)
    return None


def estimated_bytes(plan: ExecutionPlan) -> int | None:
    """The bytes `plan`'s output may decode to, or None when nothing says."""
    found = estimate(plan)
    return found.bytes if found is not None else None


def _leaf(node: ExecutionPlan) -> Estimate | None:
    for size_name, rows_name in (
        ("estimated_bytes", "estimated_rows"),
        ("embedded_bytes", "embedded_rows"),
    ):
        size = getattr(node, size_name, None)
        if isinstance(size, int):
            rows = getattr(node, rows_name, None)
            return Estimate(size, rows if isinstance(rows, int) else None)
    return None


def _aggregate(node: ExecutionPlan, below: Estimate) -> Estimate:
    keys = getattr(node, "group_by", ())
    rows = below.rows if keys else node.output_partitions
    width = _fixed_row_width(node.schema)
    if rows is None:
        return below
    if width is None:  # a string key or value: no better bound than the input's bytes
        return Estimate(below.bytes, rows)
    if not keys:
        return Estimate(rows * width, rows)
    return Estimate(min(below.bytes, rows * width), rows)


def _fixed_row_width(schema: pa.Schema) -> int | None:
    """Bytes per row of `schema`'s columns, validity included; None if one is variable-width."""
    width = 0
    for field in schema:
        try:
            bits = field.type.bit_width
        except ValueError:  # variable width (strings, lists, ...)
            return None
        width += -(-bits // 8) + _VALIDITY_BYTES
    return width


__all__ = ["PASSING_KINDS", "Estimate", "estimate", "estimated_bytes"]
