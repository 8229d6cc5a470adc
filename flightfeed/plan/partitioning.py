"""Hash partitioning spec, shared by the Repartition node and the worker's repartition head.

RepartitionExecHead.partitioning carries `encode_partitioning(...)` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._generated.flightfeed.v1 import Partitioning as PartitioningProto
from ..errors import InvalidArgument, PlanDecodeError
from ..protoencode import encode_message
from .expr import Expr
from .expr_proto import expr_from_proto, expr_to_proto
from .protobuf import parse_message

MAX_PARTITIONS = 4096
"""Each output partition of a repartition gets a buffer (and a stream at its reader): 65,536
were accepted, and cost what 65,536 buffers cost. A worker's fan-out head has the same cap."""


@dataclass(frozen=True)
class Partitioning:
    """Rows with equal `hash_keys` values go to the same of `partition_count` partitions."""

    hash_keys: tuple[Expr, ...]
    partition_count: int

    def __post_init__(self) -> None:
        if not self.hash_keys:
            raise InvalidArgument("hash partitioning needs at least one key")
        if not 1 <= self.partition_count <= MAX_PARTITIONS:
            raise InvalidArgument(
                f"partition count must be in [1, {MAX_PARTITIONS}], got {self.partition_count}"
            )

    def to_proto(self) -> PartitioningProto:
        return PartitioningProto(
            hash_keys=[expr_to_proto(k) for k in self.hash_keys],
            partition_count=self.partition_count,
        )

    @classmethod
    def from_proto(cls, msg: PartitioningProto | None) -> Partitioning:
        if msg is None:
            raise PlanDecodeError("missing partitioning")
        keys = tuple(expr_from_proto(k) for k in msg.hash_keys)
        try:
            return cls(keys, msg.partition_count)
        except InvalidArgument as exc:
            raise PlanDecodeError(f"invalid partitioning: {exc.message}") from exc

    def __str__(self) -> str:
        return f"Hash([{', '.join(map(str, self.hash_keys))}], {self.partition_count})"


def encode_partitioning(partitioning: Partitioning) -> bytes:
    return encode_message(partitioning.to_proto())


def decode_partitioning(data: bytes) -> Partitioning:
    """Inverse of `encode_partitioning`; PlanDecodeError on bad bytes."""
    return Partitioning.from_proto(parse_message(PartitioningProto, data, "partitioning bytes"))
