"""The distributed plan as Graphviz DOT: the coordinator's part and each stage as a cluster,
every node a box (its repr and output partitions), and an edge from each stage's root to the
network node that reads it (NetworkCoalesce, NetworkShuffle, NetworkBroadcast), labelled with
its tasks and the workers they run on.

`dot -Tsvg plan.dot > plan.svg` draws it; the text form (display.py) stays the one for logs.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap
from ..plan.stage_input import StageInput
from .stage import DistributedPlan, Stage


def format_distributed_plan_dot(
    plan: DistributedPlan, workers: Mapping[tuple[int, int], str] | None = None
) -> str:
    """A `digraph` of the plan; `workers`: (stage id, task number) → where the task runs."""
    graph = _Graph()
    readers: dict[int, str] = {}  # stage id → the network node reading it
    graph.lines.append("  subgraph cluster_coordinator {")
    graph.lines.append('    label="Coordinator"; style=rounded;')
    graph.add_tree(plan.root, readers, indent="    ")
    graph.lines.append("  }")
    roots: list[tuple[Stage, str]] = []
    for stage in plan.stages:
        graph.lines.append(f"  subgraph cluster_stage_{stage.stage_id} {{")
        graph.lines.append(f"    label={_quote(*_stage_label(stage, workers))}; style=dashed;")
        roots.append((stage, graph.add_tree(stage.plan, readers, indent="    ")))
        graph.lines.append("  }")
    for stage, root in roots:  # (a stage's reader may be in a later stage)
        reader = readers.get(stage.stage_id)
        if reader is not None:
            tasks = f"{stage.task_count} task{'s' if stage.task_count != 1 else ''}"
            graph.lines.append(f"  {root} -> {reader} [label={_quote(tasks)}, style=bold];")
    header = [
        "digraph distributed_plan {",
        "  rankdir=BT;",
        '  node [shape=box, fontname="monospace"];',
    ]
    return "\n".join([*header, *graph.lines, "}"]) + "\n"


class _Graph:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._count = 0

    def add_tree(self, plan: ExecutionPlan, readers: dict[int, str], indent: str) -> str:
        """Add `plan`'s nodes and edges (child → parent); returns the root's id."""
        node = unwrap(plan)
        node_id = f"n{self._count}"
        self._count += 1
        label = _quote(repr(node), f"partitions={node.output_partitions}")
        self.lines.append(f"{indent}{node_id} [label={label}];")
        source = getattr(node, "source", None)
        if isinstance(source, StageInput):  # a network node: the stage it reads points here
            readers[source.stage_id] = node_id
        for child in node.children:
            child_id = self.add_tree(child, readers, indent)
            self.lines.append(f"{indent}{child_id} -> {node_id};")
        return node_id


def _stage_label(stage: Stage, workers: Mapping[tuple[int, int], str] | None) -> list[str]:
    placed = [
        f"task {task.task_number} on {where}"
        for task in stage.tasks
        if (where := (workers or {}).get((stage.stage_id, task.task_number))) is not None
    ]
    return [f"Stage {stage.stage_id}: {stage.note}", *placed]


def _quote(*lines: str) -> str:
    """A DOT string literal of `lines`: quotes and backslashes escaped, one line each."""
    escaped = (line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)
    return '"' + "\\n".join(escaped) + '"'


__all__ = ["format_distributed_plan_dot"]
