"""Ctrl-C in a program that drives classic Spark: one plain KeyboardInterrupt, no tracebacks, no
JVM left behind.

PySpark's own SIGINT handler cancels the session's jobs from inside the handler: a call into the
JVM while the interrupted one still reads the same py4j socket, so both log tracebacks. A plain
KeyboardInterrupt raised inside a py4j call logs one too ("KeyboardInterrupt while sending
command"), and one raised while the session starts leaves things half made: Spark's JVM ignores
SIGINT, so a JVM cut off before its gateway came up lives on as an orphan.

So here the JVM calls run on a thread of their own and the main thread only waits for them:
Ctrl-C then lands outside any py4j call. A notebook, where Ctrl-C should cancel a job and keep
the session, wants PySpark's handler: leave it there.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

ACTION_END_WAIT = 30.0
"""Seconds an interrupted action's thread is given to end once its jobs are cancelled."""


def plain_interrupts() -> None:
    """Make Ctrl-C raise KeyboardInterrupt again, as before a classic session started (call it
    after the session starts, from a program's main thread; elsewhere it does nothing)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _started(function: Callable[[], T], name: str) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(function())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def _result(outcome: list[Any]) -> Any:
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def on_a_thread(function: Callable[[], T], name: str) -> T:
    """`function()` on a thread of its own, the caller waiting. A SparkContext started there
    does not install PySpark's SIGINT handler (it does so only on the main thread)."""
    thread, outcome = _started(function, name)
    thread.join()
    result: T = _result(outcome)
    return result


def interruptible(spark: Any, action: Callable[[], T]) -> T:
    """`action()`, a Spark action on `spark`, with Ctrl-C cancelling it cleanly: the session's
    jobs are cancelled, the action is given `ACTION_END_WAIT` seconds to end, and
    KeyboardInterrupt is raised. Elsewhere than on the main thread, and on a Spark Connect
    session (whose gRPC client takes Ctrl-C as it should), `action()` just runs."""
    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    if connect or threading.current_thread() is not threading.main_thread():
        return action()
    thread, outcome = _started(action, "flightfeed-spark-action")
    try:
        thread.join()
    except KeyboardInterrupt:
        spark.sparkContext.cancelAllJobs()
        thread.join(ACTION_END_WAIT)
        raise
    result: T = _result(outcome)
    return result


class Interrupted:
    """Whether Ctrl-C was pressed while interrupts were held; a second press is let through."""

    def __init__(self) -> None:
        self.pressed = False

    def __bool__(self) -> bool:
        return self.pressed

    def _handle(self, signum: int, frame: object) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


@contextmanager
def held_interrupts() -> Iterator[Interrupted]:
    """Ctrl-C is held (noted, not raised) inside the block, for work that must not be cut off
    halfway, such as a session's start; a second Ctrl-C is let through at once, for work that
    hangs. Only on the main thread; elsewhere nothing is held."""
    interrupted = Interrupted()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, interrupted._handle)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
