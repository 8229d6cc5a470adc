"""Session: what one query runs with on a worker (UDFs, configuration, memory budget, codecs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..plan.base import ExecutionPlan
from ..plan.codec import CodecRegistry, decode_plan, encode_plan
from ..plan.functions import AggregateUdf, ScalarUdf


@dataclass(frozen=True, eq=False)
class Session:
    """Immutable; build one with `SessionStateBuilder`. Satisfies the plan's `PlanSession`.

    Plans name functions; this session resolves them: session UDFs first, then built-ins.
    """

    scalar_udfs: Mapping[str, ScalarUdf] = field(default_factory=lambda: MappingProxyType({}))
    aggregate_udfs: Mapping[str, AggregateUdf] = field(default_factory=lambda: MappingProxyType({}))
    config: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    memory_budget_bytes: int | None = None
    codecs: CodecRegistry = field(default_factory=CodecRegistry.builtin)

    def scalar_udf(self, name: str, /) -> ScalarUdf | None:
        return self.scalar_udfs.get(name)

    def aggregate_udf(self, name: str, /) -> AggregateUdf | None:
        return self.aggregate_udfs.get(name)

    def encode_plan(self, plan: ExecutionPlan) -> bytes:
        return encode_plan(plan, self.codecs)

    def decode_plan(self, data: bytes) -> ExecutionPlan:
        """Decode with this session's codecs and functions (PlanDecodeError, UnknownUdfError)."""
        return decode_plan(data, self.codecs, self)
