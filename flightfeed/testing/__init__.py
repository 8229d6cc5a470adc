"""Helpers for users' tests and ours: real workers on free ports (or in-process) and a
Coordinator over them, a TCP proxy for fault injection, and a watchdog for the event loop."""

from .proxy import TcpProxy, tcp_proxy
from .watchdog import LoopWatchdog, Stall
from .workers import start_cluster, start_workers, wait_for_no_tasks

__all__ = [
    "LoopWatchdog",
    "Stall",
    "TcpProxy",
    "start_cluster",
    "start_workers",
    "tcp_proxy",
    "wait_for_no_tasks",
]
