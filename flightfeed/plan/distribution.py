"""What a node needs of its inputs' partitioning, and the pass that makes every plan meet it.

Every node runs per partition. For most that is the point (a filter, a per-partition sort), but
a grouped aggregation that finishes groups (SINGLE or FINAL) is right only when all rows of a
group reach the same partition, and a partitioned join only when both sides are partitioned
alike on the join keys. A hand-built plan that forgot its Coalesce used to return one group per
partition, silently. Now nodes say what they need and `enforce_distribution` meets it; the
coordinator's planner runs it on every plan, so no plan it runs can give such an answer.

A node states its needs with two optional methods, looked up by name, so user nodes can too:

- `required_input_distribution() -> Sequence[Distribution | None]`: one entry per child;
  None (or no method) means any partitioning will do;
- `output_hash_keys() -> tuple[Expr, ...] | None`: the keys its output is hash-partitioned on,
  if known (Repartition; nodes that keep their input's partitions pass it on).

A requirement is met by an input of one partition, or, for `HashPartitioned`, by an input
hash-partitioned on the keys (on a subset of them for an aggregation: rows equal on every key
are equal on the subset; on exactly them, in order, for co-partitioned join sides). An unmet
requirement is met by a Coalesce of that input: always correct, and a stage boundary for the
distributed planner, which then splits the input into tasks. Unmet co-partitioned inputs are
coalesced together, so they stay partitioned alike. A node of one input may offer a better
shape with `around_exchange(exchange)`: a SINGLE aggregate becomes PARTIAL below the Coalesce
and FINAL above it, so the tasks below send states, not rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from .base import ExecutionPlan
from .expr import Expr
from .metrics import unwrap


@dataclass(frozen=True)
class SinglePartition:
    """All rows in one partition (a global aggregate, say)."""

    def __str__(self) -> str:
        return "a single partition"


@dataclass(frozen=True)
class HashPartitioned:
    """Rows with equal `keys` in the same partition. `co_partitioned`: the input must be
    partitioned on exactly these keys, in order, as its sibling inputs are on theirs."""

    keys: tuple[Expr, ...]
    co_partitioned: bool = False

    def __str__(self) -> str:
        return f"hash-partitioned on [{', '.join(map(str, self.keys))}]"


Distribution: TypeAlias = SinglePartition | HashPartitioned


def required_input_distribution(node: ExecutionPlan) -> list[Distribution | None]:
    """What `node` needs of each child (None: anything)."""
    method = getattr(node, "required_input_distribution", None)
    if method is None:
        return [None] * len(node.children)
    required = list(method())
    if len(required) != len(node.children):
        raise ValueError(
            f"{node.name}.required_input_distribution() gave {len(required)} entries for"
            f" {len(node.children)} children"
        )
    return required


def output_hash_keys(node: ExecutionPlan) -> tuple[Expr, ...] | None:
    """The keys `node`'s output is known to be hash-partitioned on, if any."""
    node = unwrap(node)
    method = getattr(node, "output_hash_keys", None)
    return None if method is None else method()


def satisfies(child: ExecutionPlan, required: Distribution | None) -> bool:
    """Whether `child`'s output meets `required`."""
    if required is None or child.output_partitions == 1:
        return True
    if isinstance(required, SinglePartition):
        return False
    keys = output_hash_keys(child)
    if not keys:
        return False
    if required.co_partitioned:
        return keys == required.keys
    return all(key in required.keys for key in keys)


HashExchange: TypeAlias = Callable[[ExecutionPlan, HashPartitioned, int], ExecutionPlan | None]
"""Builds the exchange that hash-partitions an input on a requirement's keys into N partitions
(None: it cannot, a Coalesce is used instead)."""


def enforce_distribution(
    plan: ExecutionPlan, *, hash_exchange: HashExchange | None = None
) -> ExecutionPlan:
    """`plan` with a Coalesce under every input whose partitioning its node cannot use; the
    plan itself (the same object) when every node's needs are met.

    With `hash_exchange` (the distributed planner's), an input that must be hash-partitioned
    gets that exchange instead of a Coalesce (a Repartition, which the planner turns into a
    NetworkShuffle), into as many partitions as it has (the most of co-partitioned inputs).
    Co-partitioned inputs (a partitioned join's) already split on their keys keep their split,
    and the others are exchanged into its width: no second shuffle of a final aggregate's
    groups on their way into a join on the same keys."""
    node = unwrap(plan)
    originals = [unwrap(child) for child in node.children]
    children = [enforce_distribution(child, hash_exchange=hash_exchange) for child in originals]
    required = required_input_distribution(node)
    unmet = [not satisfies(child, need) for child, need in zip(children, required, strict=True)]
    co_partitioned = [
        isinstance(need, HashPartitioned) and need.co_partitioned and child.output_partitions > 1
        for child, need in zip(children, required, strict=True)
    ]
    # Co-partitioned inputs that already meet their keys keep their partitioning (a final
    # aggregate's shuffle also serves the join above it) and the others are exchanged into
    # its width; in one process (no hash exchange), every co-partitioned input is coalesced.
    kept_width = _kept_width(children, unmet, co_partitioned) if hash_exchange else None
    if kept_width is None and any(u and c for u, c in zip(unmet, co_partitioned, strict=True)):
        unmet = [u or c for u, c in zip(unmet, co_partitioned, strict=True)]
    changed = any(new is not old for new, old in zip(children, originals, strict=True))
    if unmet == [True]:
        rebuilt = _around_exchange(node.with_children(children) if changed else node)
        if rebuilt is not None:
            return _hashed_inputs(rebuilt, hash_exchange) if hash_exchange else rebuilt
    width = max((c.output_partitions for c, u in zip(children, unmet, strict=True) if u), default=1)
    fixed = _exchanged(children, required, unmet, kept_width or width, hash_exchange)
    widths = {c.output_partitions for c, co in zip(fixed, co_partitioned, strict=True) if co}
    if kept_width is not None and len(widths) > 1:  # an exchange fell back to a Coalesce
        unmet = [u or c for u, c in zip(unmet, co_partitioned, strict=True)]
        width = max(c.output_partitions for c, u in zip(children, unmet, strict=True) if u)
        fixed = _exchanged(children, required, unmet, width, hash_exchange)
    if any(new is not old for new, old in zip(fixed, originals, strict=True)):
        return node.with_children(fixed)
    return plan


def _kept_width(
    children: Sequence[ExecutionPlan], unmet: Sequence[bool], co_partitioned: Sequence[bool]
) -> int | None:
    """The width of the co-partitioned inputs that meet their keys already, when some do and
    others do not, and they agree on it; else None."""
    kept = {
        child.output_partitions
        for child, u, c in zip(children, unmet, co_partitioned, strict=True)
        if c and not u
    }
    moving = any(u and c for u, c in zip(unmet, co_partitioned, strict=True))
    return kept.pop() if moving and len(kept) == 1 else None


def _exchanged(
    children: Sequence[ExecutionPlan],
    required: Sequence[Distribution | None],
    unmet: Sequence[bool],
    width: int,
    hash_exchange: HashExchange | None,
) -> list[ExecutionPlan]:
    """`children` with each unmet one given its exchange into `width` partitions."""
    return [
        _exchange(child, need, width, hash_exchange) if move else child
        for child, need, move in zip(children, required, unmet, strict=True)
    ]


def _exchange(
    child: ExecutionPlan,
    need: Distribution | None,
    width: int,
    hash_exchange: HashExchange | None,
) -> ExecutionPlan:
    """What meets `need` for `child`: the hash exchange when there is one and it applies,
    else a Coalesce (always correct)."""
    from .nodes import Coalesce  # nodes import this module's types

    if hash_exchange is not None and isinstance(need, HashPartitioned) and width > 1:
        exchanged = hash_exchange(child, need, width)
        if exchanged is not None:
            return exchanged
    return Coalesce(child)


def _hashed_inputs(node: ExecutionPlan, hash_exchange: HashExchange) -> ExecutionPlan:
    """A node rebuilt around a Coalesce (`around_exchange`), its Coalesce swapped for the hash
    exchange its own requirement asks for (a FINAL aggregate: its group keys)."""
    from .nodes import Coalesce

    (child,) = node.children
    (need,) = required_input_distribution(node)
    inner = unwrap(child)
    if not isinstance(inner, Coalesce) or not isinstance(need, HashPartitioned):
        return node
    below = unwrap(inner.child)
    if below.output_partitions <= 1:
        return node
    exchanged = hash_exchange(below, need, below.output_partitions)
    return node if exchanged is None else node.with_children([exchanged])


def _around_exchange(node: ExecutionPlan) -> ExecutionPlan | None:
    """The node rebuilt around a Coalesce, if it offers a better shape than a Coalesce under
    it (`around_exchange`: a SINGLE aggregate splits into PARTIAL below and FINAL above)."""
    from .nodes import Coalesce

    method = getattr(node, "around_exchange", None)
    return None if method is None else method(Coalesce)


__all__ = [
    "Distribution",
    "HashExchange",
    "HashPartitioned",
    "SinglePartition",
    "enforce_distribution",
    "output_hash_keys",
    "required_input_distribution",
    "satisfies",
]
