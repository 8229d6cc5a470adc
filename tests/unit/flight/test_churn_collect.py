"""ChurnCollector: garbage cycles are collected at every `every`-th closed connection, and
only while the collector is enabled."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from flightfeed.flight.churn_collect import ChurnCollector


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def no_automatic_passes() -> Iterator[None]:
    """Thresholds no test reaches: a cycle dies only when someone collects."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(10**9, 10**9, 10**9)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def dead_cycle() -> weakref.ref[Node]:
    return weakref.ref(Node())


@pytest.mark.usefixtures("no_automatic_passes")
def test_collects_at_every_nth_closed_connection() -> None:
    collector = ChurnCollector(every=3)
    cycle = dead_cycle()
    collector.connection_closed()
    collector.connection_closed()
    assert cycle() is not None
    assert collector.collections == 0
    collector.connection_closed()
    assert cycle() is None
    assert collector.collections == 1
    later = dead_cycle()
    for _ in range(3):
        collector.connection_closed()
    assert later() is None
    assert (collector.closed, collector.collections) == (6, 2)


@pytest.mark.usefixtures("no_automatic_passes")
def test_leaves_a_disabled_collector_alone() -> None:
    collector = ChurnCollector(every=1)
    cycle = dead_cycle()
    gc.disable()
    try:
        collector.connection_closed()
    finally:
        gc.enable()
    assert cycle() is not None
    assert collector.collections == 0


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ChurnCollector(every=0)
