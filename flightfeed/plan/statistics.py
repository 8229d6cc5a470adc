"""How big a plan's output may be, as far as its leaves know: the planner's broadcast decision.

A leaf says what it holds with an `estimated_bytes` attribute (a ParquetScan, from the files'
footers) or `embedded_bytes` (a MemoryScan's own batches). Nodes that pass rows on or keep
fewer of them (a filter, a projection, a limit, a sort, an exchange, an aggregate) are taken at
their input's size: an upper bound for most, an estimate for a projection that computes wider
columns. A union is the sum of its inputs. Anything else (a join) is unknown: None.
"""

from __future__ import annotations

from typing import Final

from .base import ExecutionPlan
from .metrics import unwrap

PASSING_KINDS: Final = frozenset(
    {
        "Filter",
        "Projection",
        "Limit",
        "Sort",
        "Coalesce",
        "Repartition",
        "HashAggregate",
    }
)
"""Nodes whose output is taken at their input's size."""


def estimated_bytes(plan: ExecutionPlan) -> int | None:
    """The bytes `plan`'s output may decode to, or None when nothing says."""
    node = unwrap(plan)
    for attribute in ("estimated_bytes", "embedded_bytes"):
        found = getattr(node, attribute, None)
        if isinstance(found, int) and not node.children:
            return found
    if node.name in PASSING_KINDS and len(node.children) == 1:
        return estimated_bytes(node.children[0])
    if node.name == "Union":
        sizes = [estimated_bytes(child) for child in node.children]
        return None if any(size is None for size in sizes) else sum(s for s in sizes if s)
    return None


__all__ = ["PASSING_KINDS", "estimated_bytes"]
