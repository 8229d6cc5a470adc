"""A task's node metrics written straight to their wire form: TaskMetrics bytes, byte for byte
what betterproto2 writes for `TaskMetrics(pre_order_plan_metrics=[m.to_proto() ...], ...)`.

A finished task reports one Metric message per (partition, kind) of every plan node. Building
them as betterproto2 objects and encoding those took ~0.4 ms per task, 5 µs of each 100-row
work unit of a small feed query (the budget is 100 µs end to end). Here the counters are
written as bytes directly; tests/unit/plan/test_metrics_wire.py holds the two forms equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._generated.flightfeed.v1 import MetricsSet
from ..protoencode import encode_message
from ..protowire import encode_varint
from .metrics import NodeMetrics, PartitionMetrics

_U64: Final = (1 << 64) - 1
# Tag bytes (field number << 3 | wire type) of the fields written here.
_METRICS: Final = b"\x0a"  # MetricsSet.metrics = 1; TaskMetrics.pre_order_plan_metrics = 1
_TASK_METRICS: Final = b"\x12"  # TaskMetrics.task_metrics = 2
_LABELS: Final = b"\x0a"  # Metric.labels = 1 (Label: name = 1, value = 2)
_PARTITION: Final = b"\x10"  # Metric.partition = 2 (optional: written even when 0)
_VALUE: Final = b"\x08"  # OutputRows.value = 1, ... (and NamedCount.name = 1 is b"\x0a")
_NAMED_VALUE: Final = b"\x10"  # NamedCount.value = 2
_OUTPUT_ROWS: Final = b"\x52"  # Metric.output_rows = 10
_ELAPSED_COMPUTE: Final = b"\x5a"  # Metric.elapsed_compute = 11
_COUNT: Final = b"\x82\x01"  # Metric.count = 16
_START_TIMESTAMP: Final = b"\x9a\x01"  # Metric.start_timestamp = 19
_END_TIMESTAMP: Final = b"\xa2\x01"  # Metric.end_timestamp = 20
_OUTPUT_BYTES: Final = b"\xaa\x01"  # Metric.output_bytes = 21
_OUTPUT_BATCHES: Final = b"\xb2\x01"  # Metric.output_batches = 22


def encode_task_metrics(
    pre_order: Sequence[NodeMetrics], task_metrics: MetricsSet, more_task_metrics: bytes = b""
) -> bytes:
    """TaskMetrics(pre_order_plan_metrics=<each node's MetricsSet>, task_metrics=task_metrics)
    in wire form; `more_task_metrics` (entries from `encode_metric`) follow task_metrics's own,
    as if they had been appended to it."""
    out = bytearray()
    for node in pre_order:
        _append_len(out, _METRICS, encode_node_metrics(node))
    _append_len(out, _TASK_METRICS, encode_message(task_metrics) + more_task_metrics)
    return bytes(out)


def encode_metric(
    value_tag: bytes,
    value: bytes,
    *,
    labels: Sequence[tuple[str, str]] = (),
    partition: int | None = None,
) -> bytes:
    """One `MetricsSet.metrics` entry: a Metric whose oneof value is the message `value` under
    the field whose tag bytes are `value_tag` (e.g. COUNT_TAG with `named_value`)."""
    metric = bytearray()
    for name, label_value in labels:
        _append_len(metric, _LABELS, _string(b"\x0a", name) + _string(b"\x12", label_value))
    if partition is not None:
        metric += _PARTITION + encode_varint(partition)
    _append_len(metric, value_tag, value)
    return _len_bytes(_METRICS, bytes(metric))


def named_bytes(name: str, field_tag: bytes, data: bytes) -> bytes:
    """A {string name = 1; bytes ... } message, e.g. PercentileLatency's sketch_bytes."""
    return _string(b"\x0a", name) + (_len_bytes(field_tag, data) if data else b"")


COUNT_TAG: Final = _COUNT
P50_LATENCY_TAG: Final = b"\xf2\x01"  # Metric.custom_p50_latency = 30
SKETCH_BYTES_TAG: Final = b"\x22"  # PercentileLatency.sketch_bytes = 4


def encode_node_metrics(metrics: NodeMetrics) -> bytes:
    """`bytes(metrics.to_proto())`, written directly."""
    out = bytearray()
    for index in sorted(metrics.partitions):
        _append_partition(out, encode_varint(index), metrics.partitions[index])
    for name, value in sorted(metrics.counts.items()):
        _append_len(out, _METRICS, _len_bytes(_COUNT, named_value(name, value)))
    return bytes(out)


def _append_partition(out: bytearray, index: bytes, p: PartitionMetrics) -> None:
    partition = _PARTITION + index
    for key, value in (
        (_OUTPUT_ROWS, p.output_rows),
        (_OUTPUT_BATCHES, p.output_batches),
        (_OUTPUT_BYTES, p.output_bytes),
        (_ELAPSED_COMPUTE, p.elapsed_compute_ns),
    ):
        _append_len(out, _METRICS, partition + _len_bytes(key, _uint64(value)))
    for key, stamp in (
        (_START_TIMESTAMP, p.start_timestamp_ns),
        (_END_TIMESTAMP, p.end_timestamp_ns),
    ):
        if stamp is not None:  # optional int64: written even when 0
            value_message = _VALUE + encode_varint(stamp & _U64)
            _append_len(out, _METRICS, partition + _len_bytes(key, value_message))


def _uint64(value: int) -> bytes:
    """A {uint64 value = 1} message: proto3 leaves a zero out."""
    return _VALUE + encode_varint(value) if value else b""


def _string(key: bytes, text: str) -> bytes:
    """A string field: proto3 leaves an empty one out."""
    return _len_bytes(key, text.encode()) if text else b""


def named_value(name: str, value: int) -> bytes:
    """A {string name = 1; uint64 value = 2} message (NamedCount, NamedGauge, NamedTime)."""
    body = _string(b"\x0a", name)
    if value:
        body += _NAMED_VALUE + encode_varint(value)
    return body


def _len_bytes(key: bytes, payload: bytes) -> bytes:
    return key + encode_varint(len(payload)) + payload


def _append_len(out: bytearray, key: bytes, payload: bytes) -> None:
    out += key
    out += encode_varint(len(payload))
    out += payload


__all__ = [
    "COUNT_TAG",
    "P50_LATENCY_TAG",
    "SKETCH_BYTES_TAG",
    "encode_metric",
    "encode_node_metrics",
    "encode_task_metrics",
    "named_bytes",
    "named_value",
]
