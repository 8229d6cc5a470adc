"""Where feeds live inside user nodes, so planners can find every feed of a plan.

A node type registers a getter (`lambda node: node.feed`); `feeds_in(plan)` walks the tree in
pre-order, looking through instrumentation wrappers, and returns each node with its feed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import InvalidArgument
from ..plan.metrics import unwrap
from .handle import WorkUnitFeed

if TYPE_CHECKING:
    from ..plan.base import ExecutionPlan

N = TypeVar("N")

FeedGetter = Callable[[Any], "WorkUnitFeed[Any] | None"]


class FeedRegistry:
    """Node type -> how to get its feed. Subclasses of a registered type match too."""

    def __init__(self) -> None:
        self._getters: dict[type, FeedGetter] = {}

    def register(
        self,
        node_type: type[N],
        getter: Callable[[N], WorkUnitFeed[Any] | None],
        *,
        replace: bool = False,
    ) -> None:
        """Declare how `node_type` exposes its feed (None when a node has none)."""
        if node_type in self._getters and not replace:
            raise InvalidArgument(f"{node_type.__name__} already has a feed getter")
        self._getters[node_type] = getter

    def feed_of(self, node: ExecutionPlan) -> WorkUnitFeed[Any] | None:
        """The feed of one node (looking through wrappers), or None."""
        inner = unwrap(node)
        for cls in type(inner).__mro__:
            getter = self._getters.get(cls)
            if getter is not None:
                feed = getter(inner)
                if feed is not None and not isinstance(feed, WorkUnitFeed):
                    raise InvalidArgument(
                        f"feed getter for {cls.__name__} returned {type(feed).__name__},"
                        " not a WorkUnitFeed"
                    )
                return feed
        return None

    def feeds_in(self, plan: ExecutionPlan) -> list[tuple[ExecutionPlan, WorkUnitFeed[Any]]]:
        """Every (node, feed) of the tree in pre-order; nodes are the unwrapped user nodes."""
        out: list[tuple[ExecutionPlan, WorkUnitFeed[Any]]] = []
        stack = [plan]
        while stack:
            node = unwrap(stack.pop())
            feed = self.feed_of(node)
            if feed is not None:
                out.append((node, feed))
            stack.extend(reversed(node.children))
        return out
