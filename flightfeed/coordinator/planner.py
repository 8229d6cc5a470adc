"""Distributed planning: cut a plan at its exchanges into stages of tasks that read each other.

First filters and projections move into the TableScans of durable tables, and partitions no row
can come from are pruned (plan/table_pushdown.py). Then every node gets the input partitioning
it needs (plan/distribution.py). With more than one worker, an input that must be
hash-partitioned gets a Repartition (a shuffle), one that must be whole a Coalesce; with one
worker, a Coalesce either way. A partitioned join whose build side the leaves estimate small
(plan/statistics.py) becomes a broadcast join instead.

A leaf is distributable when its node kind has a TaskEstimator, it holds a registered
work-unit feed, or it reads data that lives on one worker (a TableScan naming its worker: one
task, pinned to that worker). Walking up from the leaves, an exchange above distributable
leaves is a stage boundary: its input subtree becomes a stage of T tasks, and the exchange
reads that stage:

- a Coalesce reads it through a NetworkCoalesce (on the coordinator, or in a task above);
- a Repartition becomes a NetworkShuffle: each producer task hash-splits its output into N
  buckets and the stage above, split into tasks, reads its share of the buckets;
- the build (left) side of a collect-left HashJoin is cut too and read whole: in a stage of
  several tasks that is a NetworkBroadcast (every task gets every build row, the probe side
  stays where it is).

A NetworkShuffle is a distributable leaf of the stage above; a NetworkCoalesce or broadcast is
read whole by each of its tasks. A stage's T is the smallest of its leaves' task counts
(estimators, capped by the workers; a shuffle: its bucket count, capped by the workers and by
its input's estimated size at `shuffle_bytes_per_task` a task, when the leaves below say how big
that is: a small shuffle is read by one task instead of one per worker), lowered
so that it divides every leaf's partition count P: each task owns global partitions
[t*P/T, (t+1)*P/T). A stage runs as one task, unsplit, when splitting could change its result:
a leaf that cannot be split (every task would read it), an input read whole that is not a
join's build side (every task would pass its rows on), a collect-left join whose build side
is split (each task would join its share only: coordinator/task_rows.py), a node
that mixes partitions (a Repartition left in place, a partitioned join over inputs not shuffled
on its keys), or a leaf the estimator declines to scale; a union's inputs may then run on tasks
of their own (IsolatedUnion). Distributable leaves with no exchange above them are a
stage too, its tasks' outputs the query's result; only what is above the last cut, or a plan
with no distributable leaf, runs on the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import InvalidArgument
from ..feeds import FeedAssignment, FeedRegistry, WorkUnitFeed
from ..plan.base import ExecutionPlan
from ..plan.distribution import (
    HashPartitioned,
    enforce_distribution,
    required_input_distribution,
)
from ..plan.expr import col
from ..plan.metrics import unwrap
from ..plan.nodes import (
    Coalesce,
    HashJoin,
    IsolatedUnion,
    NetworkBroadcast,
    NetworkCoalesce,
    NetworkShuffle,
    Repartition,
    TableScan,
    TaskSpan,
    Union,
)
from ..plan.nodes.hash_join import needs_all_right_rows
from ..plan.partitioning import MAX_PARTITIONS, Partitioning
from ..plan.stage_input import StageInput
from ..plan.statistics import estimated_bytes
from ..plan.table_pushdown import push_into_table_scans
from .estimator import TaskEstimation, TaskEstimator, TaskEstimators
from .stage import DistributedPlan, Stage, StageTask
from .task_rows import split_conflicts

DEFAULT_SHUFFLE_BYTES_PER_TASK: Final = 64 * 1024 * 1024
"""How much shuffled input one task of the stage reading a shuffle should get, when the input's
size is estimated (as Spark's advisoryPartitionSizeInBytes): fewer, fuller tasks for small
shuffles, one per worker for large or unknown ones."""

DEFAULT_BROADCAST_THRESHOLD_BYTES: Final = 10 * 1024 * 1024
"""A partitioned join's build side estimated at most this big is broadcast (as Spark's
autoBroadcastJoinThreshold): copying it to every task beats shuffling the large side."""

PARTITION_MIXING_KINDS: frozenset[str] = frozenset({"Repartition"})
"""Nodes whose output partition depends on more than the same input partition (a partitioned
HashJoin is one too unless its inputs are shuffles: see `_stage`)."""


@dataclass(eq=False, slots=True)
class _Leaf:
    node: ExecutionPlan
    estimator: TaskEstimator | None
    estimation: TaskEstimation | None
    feed: WorkUnitFeed[Any] | None

    def task_count(self, workers: int) -> int:
        wanted = self.estimation.resolve(workers) if self.estimation is not None else 1
        return max(1, min(wanted, self.node.output_partitions))

    def describe(self) -> str:
        if isinstance(self.node, TableScan) and self.node.worker:
            return f"on {self.node.worker}, which holds the table"
        if self.estimation is None:
            return "feed without a task estimation, one task"
        kind = "at most" if self.estimation.is_maximum else "desired"
        return f"{kind} {self.estimation.task_count}"

    def scale(self, tasks: int) -> ExecutionPlan | None:
        return _scale(self, tasks)


@dataclass(eq=False, slots=True)
class _ShuffleLeaf:
    """A NetworkShuffle as a leaf of the stage reading it: split by buckets, one task per
    `bytes_per_task` of its input where the input's size is estimated."""

    node: NetworkShuffle
    input_bytes: int | None
    bytes_per_task: int

    def task_count(self, workers: int) -> int:
        count = min(workers, self.node.output_partitions)
        if self.input_bytes is not None:
            count = min(count, -(-self.input_bytes // self.bytes_per_task))
        return max(1, count)

    def describe(self) -> str:
        buckets = f"{self.node.output_partitions} buckets"
        if self.input_bytes is None:
            return buckets
        return f"{buckets} of ~{_megabytes(self.input_bytes)}"

    def scale(self, tasks: int) -> ExecutionPlan | None:
        return self.node.for_tasks(tasks)


@dataclass(eq=False)
class _Planning:
    workers: int
    stages: list[Stage] = field(default_factory=list)
    leaves: dict[int, _Leaf | None] = field(default_factory=dict)
    shuffle_inputs: dict[int, int | None] = field(default_factory=dict)
    """The estimated input bytes of each NetworkShuffle the planner made (by id)."""
    exchanges: set[int] = field(default_factory=set)
    """The Repartitions enforce_distribution added (by id): shuffles where their input is
    distributable; where it is not, Coalesces (the cheaper exchange in one process) unless a
    partitioned join needs the partition count kept."""


class DistributedPlanner:
    """Turns a plan into a DistributedPlan for a cluster of a given size."""

    def __init__(
        self,
        *,
        feed_registry: FeedRegistry | None = None,
        estimators: TaskEstimators | None = None,
        partition_mixing_kinds: Collection[str] = PARTITION_MIXING_KINDS,
        max_tasks_per_stage: int | None = None,
        broadcast_threshold_bytes: int = DEFAULT_BROADCAST_THRESHOLD_BYTES,
        shuffle_bytes_per_task: int = DEFAULT_SHUFFLE_BYTES_PER_TASK,
    ) -> None:
        """`max_tasks_per_stage` caps every stage's task count (None: the workers and the
        leaves decide; an estimator's desired count may exceed the workers). A partitioned
        join whose build (left) side is estimated at no more than `broadcast_threshold_bytes`
        is broadcast instead (0: never). A stage reading a shuffle whose input is estimated
        gets a task per `shuffle_bytes_per_task` of it (at most one per worker)."""
        if max_tasks_per_stage is not None and max_tasks_per_stage < 1:
            raise InvalidArgument(
                f"max_tasks_per_stage must be at least 1, got {max_tasks_per_stage}"
            )
        if shuffle_bytes_per_task < 1:
            raise InvalidArgument(
                f"shuffle_bytes_per_task must be at least 1, got {shuffle_bytes_per_task}"
            )
        self._shuffle_bytes_per_task = shuffle_bytes_per_task
        self._max_tasks = max_tasks_per_stage
        self._broadcast_threshold = broadcast_threshold_bytes
        self._feeds = feed_registry
        self._estimators = estimators or TaskEstimators()
        self._mixing = frozenset(partition_mixing_kinds)

    def feeds_in(self, plan: ExecutionPlan) -> list[WorkUnitFeed[Any]]:
        """The plan's feeds the registry finds, in pre-order (none without a registry)."""
        return [feed for _, feed in self._feeds.feeds_in(plan)] if self._feeds is not None else []

    def plan(self, plan: ExecutionPlan, workers: int) -> DistributedPlan:
        """Stages cut at the plan's exchanges, after enforce_distribution added those its
        nodes need (a grouped aggregate over partitions not split by its keys, say)."""
        state = _Planning(workers=max(workers, 1))
        exchange = self._hash_exchange(state) if state.workers > 1 else None
        plan = push_into_table_scans(plan)
        enforced = enforce_distribution(plan, hash_exchange=exchange)
        if state.workers > 1 and self._broadcast_threshold > 0:
            enforced = broadcast_small_builds(enforced, self._broadcast_threshold)
        root, pending = self._rewrite(enforced, state)
        if pending:  # distributable leaves with nothing above to cut at: their tasks' outputs
            root = NetworkCoalesce(self._input(self._stage(root, state)))  # are the result
        return DistributedPlan(root, tuple(state.stages))

    def plan_on_workers(self, plan: ExecutionPlan, workers: int) -> DistributedPlan:
        """The whole plan as one stage whose tasks' outputs are its result (nothing runs on the
        coordinator): for queries read straight from the workers. It is split across tasks
        as a leaf stage is; a plan with a Coalesce runs as one task, since a Coalesce must see
        every task's rows. A Repartition becomes a Coalesce: its outputs, each read by an
        endpoint of its own, would have to be read together (a fan-out buffers a few batches
        an output) and once, where a reader reads endpoints in any order and again."""
        state = _Planning(workers=max(workers, 1))
        plan = enforce_distribution(_without_repartitions(push_into_table_scans(plan)))
        if plan.output_partitions == 0:  # (no endpoint to read: one that yields no rows)
            plan = Coalesce(plan)
        stage = self._stage(unwrap(plan), state, single_partition_kinds=frozenset({"Coalesce"}))
        return DistributedPlan(NetworkCoalesce(self._input(stage)), (stage,))

    def _hash_exchange(
        self, state: _Planning
    ) -> Callable[[ExecutionPlan, HashPartitioned, int], ExecutionPlan | None]:
        def exchange(child: ExecutionPlan, need: HashPartitioned, width: int) -> ExecutionPlan:
            partitioning = Partitioning(need.keys, min(width, MAX_PARTITIONS))
            node = Repartition(child, partitioning)
            state.exchanges.add(id(node))
            return node

        return exchange

    # -- finding boundaries --------------------------------------------------------------------

    def _leaf(self, node: ExecutionPlan, state: _Planning) -> _Leaf | None:
        key = id(node)
        if key not in state.leaves:
            estimator = self._estimators.for_node(node)
            estimation = estimator.task_estimation(node) if estimator is not None else None
            feed = self._feeds.feed_of(node) if self._feeds is not None else None
            if isinstance(node, TableScan) and node.worker:
                estimation = TaskEstimation.desired(1)  # where its table is: nowhere else
            found = None
            if (estimation is not None or feed is not None) and node.output_partitions >= 1:
                found = _Leaf(node, estimator, estimation, feed)
            state.leaves[key] = found
        return state.leaves[key]

    def _rewrite(
        self, node: ExecutionPlan, state: _Planning, *, alone: bool = True
    ) -> tuple[ExecutionPlan, bool]:
        """The rewritten node, and whether distributable leaves below still await a stage.
        `alone`: the node is its parent's only input (its partition count is nobody else's
        business: a partitioned join's inputs must keep theirs alike)."""
        node = unwrap(node)
        if not node.children:
            distributable = isinstance(node, NetworkShuffle) or self._leaf(node, state) is not None
            return node, distributable
        originals = [unwrap(child) for child in node.children]
        sole = len(originals) == 1
        rewritten = [self._rewrite(child, state, alone=sole) for child in originals]
        children = [child for child, _ in rewritten]
        pending = [flag for _, flag in rewritten]
        if isinstance(node, Coalesce) and pending[0]:
            reader = NetworkCoalesce(self._input(self._stage(children[0], state)))
            return node.with_children([reader]), False
        if isinstance(node, Repartition) and pending[0]:
            stage = self._stage(children[0], state)
            shuffle = NetworkShuffle(self._input(stage), node.partitioning)
            state.shuffle_inputs[id(shuffle)] = estimated_bytes(children[0])
            return shuffle, True
        if isinstance(node, Repartition) and id(node) in state.exchanges and alone:
            return Coalesce(children[0]), False  # nothing to shuffle across workers
        if isinstance(node, HashJoin) and node.collect_left and pending[0]:
            build = NetworkCoalesce(self._input(self._stage(children[0], state)))
            children[0], pending[0] = build, False  # a broadcast once its stage has tasks
        if any(new is not old for new, old in zip(children, originals, strict=True)):
            node = node.with_children(children)
        return node, any(pending)

    # -- building a stage ------------------------------------------------------------------------

    def _input(self, stage: Stage) -> StageInput:
        return StageInput(stage.stage_id, stage.task_count, stage.partitions_per_task, stage.schema)

    def _stage(
        self,
        subtree: ExecutionPlan,
        state: _Planning,
        *,
        single_partition_kinds: frozenset[str] = frozenset(),
    ) -> Stage:
        plan, tasks, note = self._split(subtree, state, None, single_partition_kinds)
        isolated = self._isolated(subtree, state, tasks, single_partition_kinds)
        if isolated is not None:
            plan, tasks, note = isolated
        stage_id = len(state.stages) + 1
        stage = Stage(
            stage_id,
            plan,
            tuple(
                StageTask(t, self._feed_assignments(plan, t, tasks), _pinned_worker(plan, t))
                for t in range(tasks)
            ),
            note=f"{tasks} task{'s' if tasks != 1 else ''} ({note})",
        )
        state.stages.append(stage)
        return stage

    def _split(
        self,
        subtree: ExecutionPlan,
        state: _Planning,
        cap: int | None,
        single_partition_kinds: frozenset[str],
    ) -> tuple[ExecutionPlan, int, str]:
        """`subtree` as each of T tasks runs it (T at most `cap` if given), T, and why T."""
        leaves: list[_Leaf | _ShuffleLeaf] = []
        whole: list[ExecutionPlan] = []
        blockers: list[str] = []
        for node in _walk(subtree):
            if node.children:
                if node.name in self._mixing:
                    blockers.append(f"{node.name} mixes partitions across tasks")
                elif node.name in single_partition_kinds:
                    blockers.append(f"{node.name} must see every task's rows")
                elif isinstance(node, HashJoin) and not node.collect_left:
                    if not _inputs_are_shuffles(node, lambda n: self._leaf(n, state) is not None):
                        blockers.append("a partitioned HashJoin over inputs not shuffled by key")
                elif self._feeds is not None and self._feeds.feed_of(node) is not None:
                    blockers.append(f"{node.name} has a feed but is not a leaf")
                continue
            if isinstance(node, NetworkShuffle):
                size = state.shuffle_inputs.get(id(node))
                leaves.append(_ShuffleLeaf(node, size, self._shuffle_bytes_per_task))
            elif isinstance(node, NetworkCoalesce | NetworkBroadcast):
                whole.append(node)  # read whole by each task
            elif (found := self._leaf(node, state)) is not None:
                leaves.append(found)
            else:
                blockers.append(f"leaf {node.name} cannot be split (every task would read it)")
        counts = [leaf.task_count(state.workers) for leaf in leaves]
        for limit in (cap, self._max_tasks):
            if limit is not None:
                counts = [min(count, limit) for count in counts]
        tasks = min(counts, default=1)
        note = ", ".join(f"{leaf.node.name}: {leaf.describe()}" for leaf in leaves)
        note = note or "no leaf that splits into tasks"
        if tasks > 1:
            blockers.extend(split_conflicts(subtree, {id(node) for node in whole}))
        if blockers and tasks > 1:
            tasks, note = 1, "; ".join(blockers)
        sizes = [leaf.node.output_partitions for leaf in leaves]
        tasks = max(t for t in range(tasks, 0, -1) if all(p % t == 0 for p in sizes))
        scaled: dict[int, ExecutionPlan] = {}
        if tasks > 1:
            for leaf in leaves:
                per_task = leaf.scale(tasks)
                if per_task is None:
                    tasks, note, scaled = 1, f"{leaf.node.name} cannot be scaled up", {}
                    break
                scaled[id(leaf.node)] = per_task
        if tasks > 1:
            for node in whole:
                assert isinstance(node, NetworkCoalesce | NetworkBroadcast)
                scaled[id(node)] = NetworkBroadcast(node.source, tasks)
        return (_replace(subtree, scaled) if scaled else subtree), tasks, note

    def _isolated(
        self,
        subtree: ExecutionPlan,
        state: _Planning,
        tasks: int,
        single_partition_kinds: frozenset[str],
    ) -> tuple[ExecutionPlan, int, str] | None:
        """The stage with its union's inputs on tasks of their own, when that gives it more
        tasks than `tasks` (what splitting every input alike gives): each input split as a
        stage of its own, together on at most as many tasks as workers (or inputs)."""
        chain: list[ExecutionPlan] = []
        node = unwrap(subtree)
        while not isinstance(node, Union):
            if len(node.children) != 1 or node.name in self._mixing | single_partition_kinds:
                return None
            if required_input_distribution(node) != [None]:  # (a global aggregate over a
                return None  # union of one partition: split, each task would aggregate apart)
            chain.append(node)
            node = unwrap(node.children[0])
        inputs = [unwrap(child) for child in node.children]
        shared = self._share_a_feed(_union_inputs(node))
        if shared:  # each use of the feed on tasks of its own, a union's inside one too
            inputs = _union_inputs(node)  # (`t.union(t).union(t)`)
        if len(inputs) < 2:
            return None
        budget = max(state.workers, len(inputs))
        if self._max_tasks is not None:
            budget = min(budget, self._max_tasks)
            if budget < len(inputs):
                return None  # every input needs a task of its own
        split = [self._split(i, state, None, single_partition_kinds) for i in inputs]
        while sum(count for _, count, _ in split) > budget:  # take tasks off the widest input
            widest = max(range(len(split)), key=lambda i: split[i][1])
            cap = split[widest][1] - 1  # >= 1: the budget is at least one task per input
            split[widest] = self._split(inputs[widest], state, cap, single_partition_kinds)
        total = sum(count for _, count, _ in split)
        if total <= tasks and not shared:
            return None  # (inputs reading one feed need tasks of their own: one reader each)
        spans, first = [], 0
        for _, count, _ in split:
            spans.append(TaskSpan(first, count))
            first += count
        plan: ExecutionPlan = IsolatedUnion([p for p, _, _ in split], spans, total)
        for above in reversed(chain):
            plan = above.with_children([plan])
        note = "union inputs on tasks of their own: " + "; ".join(
            f"{_span(span)}: {why}" for span, (_, _, why) in zip(spans, split, strict=True)
        )
        return plan, total, note

    def _share_a_feed(self, inputs: list[ExecutionPlan]) -> bool:
        """Whether two inputs read the same feed (a builder used twice): a task's feed partition
        has one reader, so each needs tasks of its own."""
        if self._feeds is None:
            return False
        seen: set[bytes] = set()
        for node in inputs:
            ids = {feed.id for _, feed in self._feeds.feeds_in(node)}
            if ids & seen:
                return True
            seen |= ids
        return False

    def _feed_assignments(
        self, plan: ExecutionPlan, task: int, tasks: int
    ) -> dict[bytes, FeedAssignment]:
        """Each feed of the task's plan with the global partitions task `task` owns (under an
        IsolatedUnion, only its input's feeds that runs on the task, split its own way)."""
        out: dict[bytes, FeedAssignment] = {}
        if self._feeds is not None:
            self._collect_feeds(plan, task, tasks, out)
        return out

    def _collect_feeds(
        self, plan: ExecutionPlan, task: int, tasks: int, out: dict[bytes, FeedAssignment]
    ) -> None:
        assert self._feeds is not None
        node = unwrap(plan)
        if isinstance(node, IsolatedUnion):
            found = node.owner(task)
            if found is not None:
                index, span = found
                self._collect_feeds(node.children[index], task - span.first, span.count, out)
            return
        feed = self._feeds.feed_of(node)
        if feed is not None:
            provider = feed.inner()
            if provider is None:
                raise InvalidArgument(
                    f"{node.name}: feed {feed.uuid} is a remote handle; only a feed with its"
                    " provider (WorkUnitFeed.new) can be distributed from the coordinator"
                )
            per_task = node.output_partitions
            first = task * per_task if tasks > 1 else 0
            partitions = range(first, first + per_task)
            if feed.id in out:  # (a worker gives a task's feed partition one reader)
                raise InvalidArgument(
                    f"{node.name}: feed {feed.uuid} is read twice by one task (the same node"
                    " used twice where its uses cannot run on tasks of their own): create the"
                    " node twice (call the table or scan function again) to read its feed twice"
                )
            out[feed.id] = FeedAssignment(provider, partitions)
        for child in node.children:
            self._collect_feeds(child, task, tasks, out)


def _pinned_worker(plan: ExecutionPlan, task: int) -> str | None:
    """The worker task `task` must run on: the one holding the tables its TableScans read (under
    an IsolatedUnion, those of the input that runs on the task)."""
    found: set[str] = set()

    def visit(node: ExecutionPlan, task: int) -> None:
        node = unwrap(node)
        if isinstance(node, IsolatedUnion):
            owner = node.owner(task)
            if owner is not None:
                index, span = owner
                visit(node.children[index], task - span.first)
            return
        if isinstance(node, TableScan) and node.worker:
            found.add(node.worker)
        for child in node.children:
            visit(child, task)

    visit(plan, task)
    if len(found) > 1:
        raise InvalidArgument(
            f"one task would read tables held by several workers ({', '.join(sorted(found))}):"
            " put a Union over them (each input gets a task of its own) or an exchange between"
        )
    return found.pop() if found else None


def _scale(leaf: _Leaf, tasks: int) -> ExecutionPlan | None:
    if leaf.estimator is None:
        return None
    per_task = leaf.estimator.scale_up_leaf_node(leaf.node, tasks)
    if per_task is None:
        return None
    total = leaf.node.output_partitions
    if per_task.output_partitions * tasks != total:
        raise InvalidArgument(
            f"scale_up_leaf_node({leaf.node.name}, {tasks}) gave "
            f"{per_task.output_partitions} partitions per task; the leaf has {total}, so each"
            f" task must own {total // tasks}"
        )
    return per_task


def broadcast_small_builds(plan: ExecutionPlan, threshold: int) -> ExecutionPlan:
    """`plan` with each partitioned join whose build side is estimated at no more than
    `threshold` bytes turned into a collect-left (broadcast) join of the same inputs, the hash
    exchanges on its keys dropped. Join types that must see every right row in one place
    (left outer, semi, anti; full outer) stay partitioned."""
    node = unwrap(plan)
    if not node.children:
        return node
    children = [broadcast_small_builds(child, threshold) for child in node.children]
    if (
        isinstance(node, HashJoin)
        and not node.collect_left
        and not needs_all_right_rows(node.join_type)
    ):
        build = estimated_bytes(children[0])
        if build is not None and build <= threshold:
            left = _without_exchange(children[0], [key for key, _ in node.on])
            right = _without_exchange(children[1], [key for _, key in node.on])
            return HashJoin(left, right, node.on, node.join_type, collect_left=True)
    if any(new is not old for new, old in zip(children, node.children, strict=True)):
        return node.with_children(children)
    return node


def _union_inputs(union: ExecutionPlan) -> list[ExecutionPlan]:
    """The inputs of `union`, those of a union among them in its place."""
    found: list[ExecutionPlan] = []
    for child in union.children:
        child = unwrap(child)
        found.extend(_union_inputs(child) if isinstance(child, Union) else [child])
    return found


def _without_repartitions(plan: ExecutionPlan) -> ExecutionPlan:
    """`plan` with every Repartition a Coalesce of its input: one partition holds every
    bucket, which is what any node above needs of it (the rows are the same)."""
    node = unwrap(plan)
    children = [_without_repartitions(child) for child in node.children]
    if isinstance(node, Repartition):
        return Coalesce(children[0])
    if any(new is not old for new, old in zip(children, node.children, strict=True)):
        return node.with_children(children)
    return node


def _without_exchange(plan: ExecutionPlan, keys: list[str]) -> ExecutionPlan:
    """The input under a hash exchange on exactly `keys` (there for the partitioned join)."""
    node = unwrap(plan)
    if isinstance(node, Repartition) and node.partitioning.hash_keys == tuple(map(col, keys)):
        return unwrap(node.child)
    return node


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.1f} KiB"


def _span(span: TaskSpan) -> str:
    last = span.first + span.count - 1
    return f"task {span.first}" if span.count == 1 else f"tasks {span.first}..{last}"


def _inputs_are_shuffles(join: HashJoin, splits: Callable[[ExecutionPlan], bool]) -> bool:
    """Whether every leaf of a partitioned join that splits across tasks is a NetworkShuffle:
    then partition i of both sides holds the same buckets in every task."""
    return not any(
        not node.children and not isinstance(node, NetworkShuffle) and splits(node)
        for node in _walk(join)
    )


def _walk(plan: ExecutionPlan) -> list[ExecutionPlan]:
    out: list[ExecutionPlan] = []
    stack = [unwrap(plan)]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(unwrap(child) for child in reversed(node.children))
    return out


def _replace(node: ExecutionPlan, scaled: dict[int, ExecutionPlan]) -> ExecutionPlan:
    node = unwrap(node)
    found = scaled.get(id(node))
    if found is not None:
        return found
    if not node.children:
        return node
    return node.with_children([_replace(child, scaled) for child in node.children])


def distribute(
    plan: ExecutionPlan,
    workers: int,
    *,
    feed_registry: FeedRegistry | None = None,
    estimators: TaskEstimators | None = None,
) -> DistributedPlan:
    """`DistributedPlanner(...).plan(plan, workers)` in one call."""
    return DistributedPlanner(feed_registry=feed_registry, estimators=estimators).plan(
        plan, workers
    )


__all__ = [
    "DEFAULT_BROADCAST_THRESHOLD_BYTES",
    "DEFAULT_SHUFFLE_BYTES_PER_TASK",
    "PARTITION_MIXING_KINDS",
    "DistributedPlanner",
    "broadcast_small_builds",
    "distribute",
]
