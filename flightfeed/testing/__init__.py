"""Helpers for users' tests and ours: real workers on free ports (or in-process) and a
Coordinator over them, a TCP proxy for fault injection, and a watchdog for the event loop."""

from .feeds import (
    COUNT_AT_END,
    UNIT_SCHEMA,
    LiveProvider,
    Probe,
    StartBarrier,
    UnitProvider,
    UnitScan,
    UnitScanCodec,
    UnitScanEstimator,
    Waiters,
    live_provider,
    probe,
    unit_coordinator_options,
    unit_coordinator_session,
    unit_feed_registry,
    unit_scan,
    unit_session_builder,
)
from .proxy import TcpProxy, tcp_proxy
from .watchdog import LoopWatchdog, Stall
from .workers import start_cluster, start_workers, wait_for_no_tasks

__all__ = [
    "COUNT_AT_END",
    "UNIT_SCHEMA",
    "LiveProvider",
    "LoopWatchdog",
    "Probe",
    "Stall",
    "StartBarrier",
    "TcpProxy",
    "UnitProvider",
    "UnitScan",
    "UnitScanCodec",
    "UnitScanEstimator",
    "Waiters",
    "live_provider",
    "probe",
    "start_cluster",
    "start_workers",
    "tcp_proxy",
    "unit_coordinator_options",
    "unit_coordinator_session",
    "unit_feed_registry",
    "unit_scan",
    "unit_session_builder",
    "wait_for_no_tasks",
]
