"""metrics_wire writes node metrics byte for byte as betterproto2 does, for any counters:
zeros (left out, except the optional fields), 64-bit extremes, negative timestamps, names
of any text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import Metric, MetricsSet, NamedTime, TaskMetrics
from flightfeed.messages import parse_strict
from flightfeed.plan.metrics import NodeMetrics, PartitionMetrics
from flightfeed.plan.metrics_wire import encode_node_metrics, encode_task_metrics

U64 = st.integers(0, 2**64 - 1) | st.just(0)
I64 = st.none() | st.integers(-(2**63), 2**63 - 1) | st.just(0)

partition_metrics = st.builds(PartitionMetrics, U64, U64, U64, U64, I64, I64)
node_metrics = st.builds(
    NodeMetrics,
    node_name=st.text(max_size=8),
    partitions=st.dictionaries(st.integers(0, 2**64 - 1), partition_metrics, max_size=5),
    counts=st.dictionaries(st.text(max_size=12), U64, max_size=4),
)
task_wide = st.builds(
    MetricsSet,
    metrics=st.lists(
        st.builds(
            lambda name, value: Metric(time=NamedTime(name=name, value=value)),
            st.text(max_size=8),
            U64,
        ),
        max_size=3,
    ),
)


@given(node_metrics)
def test_a_node_is_written_as_betterproto2_writes_it(metrics: NodeMetrics) -> None:
    assert encode_node_metrics(metrics) == bytes(metrics.to_proto())


@given(st.lists(node_metrics, max_size=4), task_wide)
def test_a_task_is_written_as_betterproto2_writes_it(
    nodes: list[NodeMetrics], task_metrics: MetricsSet
) -> None:
    expected = TaskMetrics(
        pre_order_plan_metrics=[node.to_proto() for node in nodes], task_metrics=task_metrics
    )
    data = encode_task_metrics(nodes, task_metrics)
    assert data == bytes(expected)
    assert parse_strict(TaskMetrics, data) == expected
