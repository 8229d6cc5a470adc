"""The catalog a coordinator serves: named tables, each a factory from arguments to a plan,
and what those plans need to run distributed (node codecs, feed getters, task estimators).

    catalog = Catalog()

    @catalog.table("scan", description="chunks discovered at runtime")
    def scan(task_count: int, *partitions: str) -> ExecutionPlan: ...

Building a plan must not start any work: providers start only when the query runs. A module
of tables is loaded by import path (`flightfeed coordinator --tables pkg.module:catalog`), as
workers load their session builder.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from ..errors import FlightfeedError, InvalidArgument, NotFound
from ..feeds import FeedRegistry, WorkUnitFeed
from ..plan.base import ExecutionPlan
from ..plan.codec import PlanCodec
from ..session import Session, SessionStateBuilder, WorkerQueryContext
from .estimator import EstimatorKey, TaskEstimator

TableFactory = Callable[..., ExecutionPlan]
"""Positional arguments (int, float, str or bool) → the table's plan."""
F = TypeVar("F", bound=TableFactory)
N = TypeVar("N")


@dataclass(frozen=True)
class TableDefinition:
    name: str
    factory: TableFactory
    description: str = ""

    @property
    def signature(self) -> str:
        """How to call the table, for listings and error messages."""
        parameters = _parameters(self.factory)
        if parameters is None:
            return f"{self.name}(...)"
        return f"{self.name}({', '.join(str(p) for p in parameters.values())})"


@dataclass(eq=False)
class Catalog:
    """Named tables, and the wiring their plans need on the coordinator and the workers."""

    tables: dict[str, TableDefinition] = field(default_factory=dict)
    codecs: list[PlanCodec] = field(default_factory=list)
    feeds: list[tuple[type, Callable[[Any], WorkUnitFeed[Any] | None]]] = field(
        default_factory=list
    )
    estimators: dict[EstimatorKey, TaskEstimator] = field(default_factory=dict)

    # -- building it ------------------------------------------------------------------------

    @overload
    def table(
        self, name: str, factory: None = None, *, description: str = ""
    ) -> Callable[[F], F]: ...

    @overload
    def table(self, name: str, factory: F, *, description: str = "") -> F: ...

    def table(
        self, name: str, factory: F | None = None, *, description: str = ""
    ) -> Callable[[F], F] | F:
        """Register `factory` as table `name` (or use as a decorator)."""

        def register(found: F) -> F:
            if not name or name in self.tables:
                raise InvalidArgument(f"table name {name!r} is empty or already taken")
            doc = description or (inspect.getdoc(found) or "").split("\n")[0]
            self.tables[name] = TableDefinition(name, found, doc)
            return found

        return register(factory) if factory is not None else register

    def with_codec(self, codec: PlanCodec) -> Catalog:
        """A node codec the tables' plans need (on the coordinator and every worker)."""
        self.codecs.append(codec)
        return self

    def with_feed(
        self, node_type: type[N], getter: Callable[[N], WorkUnitFeed[Any] | None]
    ) -> Catalog:
        """How the planner finds the feed of a node type the tables use."""
        self.feeds.append((node_type, getter))
        return self

    def with_estimator(self, key: EstimatorKey, estimator: TaskEstimator) -> Catalog:
        """How many tasks a leaf kind of the tables' plans gets."""
        self.estimators[key] = estimator
        return self

    # -- using it ---------------------------------------------------------------------------

    def get(self, name: str) -> TableDefinition:
        found = self.tables.get(name)
        if found is None:
            known = ", ".join(sorted(self.tables)) or "none"
            raise NotFound(f"no table {name!r} in this coordinator's catalog (it has: {known})")
        return found

    def plan(self, name: str, arguments: Sequence[object] = ()) -> ExecutionPlan:
        """The plan of table `name` for `arguments`; a bad call is InvalidArgument."""
        table = self.get(name)
        _check_arguments(table, arguments)
        try:
            plan = table.factory(*arguments)
        except FlightfeedError as exc:
            raise InvalidArgument(f"{name}: {exc.message}") from exc
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{name}: {exc}") from exc
        return plan

    def session(self) -> Session:
        """The coordinator's session: it encodes the tables' nodes."""
        builder = SessionStateBuilder()
        for codec in self.codecs:
            builder = builder.with_codec(codec)
        return builder.build()

    def feed_registry(self) -> FeedRegistry:
        registry = FeedRegistry()
        for node_type, getter in self.feeds:
            registry.register(node_type, getter)
        return registry

    def coordinator_options(self) -> dict[str, Any]:
        """`Coordinator(resolver, **catalog.coordinator_options())` plans and encodes the tables."""
        return {
            "session": self.session(),
            "feed_registry": self.feed_registry(),
            "task_estimators": dict(self.estimators),
        }

    async def worker_session(self, ctx: WorkerQueryContext) -> Session:
        """A worker session builder that decodes the tables' nodes."""
        builder = ctx.builder
        for codec in self.codecs:
            builder = builder.with_codec(codec, replace_existing=True)
        return builder.build()


def _parameters(factory: TableFactory) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(factory, eval_str=True).parameters
    except (TypeError, ValueError, NameError):
        return None


_SIMPLE_TYPES: dict[object, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
}


def _check_arguments(table: TableDefinition, arguments: Sequence[object]) -> None:
    """InvalidArgument naming the table's signature for a call that cannot work."""
    parameters = _parameters(table.factory)
    if parameters is None:
        return  # no signature to check against: the call says what is wrong
    try:
        bound = inspect.Signature(list(parameters.values())).bind(*arguments)
    except TypeError as exc:
        raise InvalidArgument(f"{table.signature}: {exc}") from None
    for name, value in bound.arguments.items():
        parameter = parameters[name]
        wanted = _SIMPLE_TYPES.get(parameter.annotation)
        values = value if parameter.kind is inspect.Parameter.VAR_POSITIONAL else (value,)
        for item in values:
            if wanted is not None and (
                not isinstance(item, wanted) or (bool not in wanted and isinstance(item, bool))
            ):
                kind = parameter.annotation.__name__
                raise InvalidArgument(f"{table.signature}: {name} must be {kind}, got {item!r}")


def load_catalog(path: str) -> Catalog:
    """Import `package.module:attribute`: a Catalog, or a function returning one."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(f"catalog {path!r} must look like 'package.module:catalog'")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"catalog {path!r}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed as it was imported
        raise InvalidArgument(
            f"catalog {path!r}: importing {module_name!r} failed: {exc!r}"
        ) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgument(
                f"catalog {path!r}: {module_name!r} has no {attribute!r}"
            ) from None
    if callable(target) and not isinstance(target, Catalog):
        target = _call_factory(path, target)
    if not isinstance(target, Catalog):
        raise InvalidArgument(f"catalog {path!r} is a {type(target).__name__}, not a Catalog")
    return target


def _call_factory(path: str, factory: Callable[..., object]) -> object:
    """What a catalog function returns; InvalidArgument when it needs arguments or fails."""
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise InvalidArgument(
            f"catalog {path!r} is a function that takes arguments: give a Catalog, or a function"
            " of no arguments that returns one"
        ) from None
    except ValueError:  # no signature to look at (some builtins): calling it will tell
        pass
    try:
        return factory()
    except FlightfeedError:
        raise  # (says what is wrong already)
    except Exception as exc:
        raise InvalidArgument(f"catalog {path!r}: calling it failed: {exc!r}") from exc
