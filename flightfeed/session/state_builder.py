"""SessionStateBuilder: the pre-populated builder a session builder customizes per request.

Immutable: every `with_*` returns a new builder, so a worker can hand the same defaults to
concurrent requests without one request's UDFs leaking into another's session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..errors import InvalidArgument
from ..plan.codec import CodecRegistry, PlanCodec
from ..plan.functions import AggregateUdf, ScalarUdf
from .session import Session


@dataclass(frozen=True)
class SessionStateBuilder:
    scalar_udfs: Mapping[str, ScalarUdf] = field(default_factory=lambda: MappingProxyType({}))
    aggregate_udfs: Mapping[str, AggregateUdf] = field(default_factory=lambda: MappingProxyType({}))
    config: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    memory_budget_bytes: int | None = None
    codecs: CodecRegistry = field(default_factory=CodecRegistry.builtin)

    def with_scalar_udf(self, udf: ScalarUdf) -> SessionStateBuilder:
        """Add (or replace) a scalar UDF under `udf.name`."""
        _check_name(udf.name)
        return replace(self, scalar_udfs=MappingProxyType({**self.scalar_udfs, udf.name: udf}))

    def with_scalar_udfs(self, udfs: Iterable[ScalarUdf]) -> SessionStateBuilder:
        builder = self
        for udf in udfs:
            builder = builder.with_scalar_udf(udf)
        return builder

    def with_aggregate_udf(self, udf: AggregateUdf) -> SessionStateBuilder:
        """Add (or replace) an aggregate UDF under `udf.name`."""
        _check_name(udf.name)
        if not udf.state_types:
            raise InvalidArgument(f"aggregate UDF {udf.name!r} needs at least one state type")
        udfs = MappingProxyType({**self.aggregate_udfs, udf.name: udf})
        return replace(self, aggregate_udfs=udfs)

    def with_config(self, key: str, value: str) -> SessionStateBuilder:
        return replace(self, config=MappingProxyType({**self.config, key: value}))

    def with_configs(self, values: Mapping[str, str]) -> SessionStateBuilder:
        return replace(self, config=MappingProxyType({**self.config, **values}))

    def with_memory_budget(self, nbytes: int | None) -> SessionStateBuilder:
        """Per-operator limit on buffered state; None means unlimited."""
        if nbytes is not None and nbytes <= 0:
            raise InvalidArgument(f"memory budget must be positive, got {nbytes}")
        return replace(self, memory_budget_bytes=nbytes)

    def with_codec(
        self, codec: PlanCodec, *, replace_existing: bool = False
    ) -> SessionStateBuilder:
        """Teach the session to encode/decode the user node kinds `codec.kinds`."""
        return replace(self, codecs=self.codecs.with_codec(codec, replace=replace_existing))

    def build(self) -> Session:
        return Session(
            scalar_udfs=MappingProxyType(dict(self.scalar_udfs)),
            aggregate_udfs=MappingProxyType(dict(self.aggregate_udfs)),
            config=MappingProxyType(dict(self.config)),
            memory_budget_bytes=self.memory_budget_bytes,
            codecs=self.codecs,
        )


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("a UDF needs a non-empty name")
