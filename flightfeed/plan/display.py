"""A plan as indented text, for logs, errors and EXPLAIN-like output."""

from __future__ import annotations

from .base import ExecutionPlan
from .metrics import Instrumented, unwrap


def format_plan(plan: ExecutionPlan, *, with_metrics: bool = False) -> str:
    """One line per node (repr, output partitions), children indented under their parent."""
    lines: list[str] = []

    def visit(node: ExecutionPlan, depth: int) -> None:
        line = f"{'  ' * depth}{unwrap(node)!r} partitions={node.output_partitions}"
        if with_metrics and isinstance(node, Instrumented):
            m = node.metrics
            line += (
                f" rows={m.output_rows} batches={m.output_batches} bytes={m.output_bytes}"
                f" compute={m.elapsed_compute_ns / 1e6:.3f}ms"
            )
        lines.append(line)
        for child in node.children:
            visit(child, depth + 1)

    visit(plan, 0)
    return "\n".join(lines)
