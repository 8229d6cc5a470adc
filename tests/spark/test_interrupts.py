"""Ctrl-C in a program that started a classic Spark session: PySpark's SIGINT handler cancels
the session's jobs from inside the handler, and the JVM calls collide into pages of
tracebacks; `plain_interrupts` (the demo's and the examples') gives the plain
KeyboardInterrupt back."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from flightfeed.spark import interruptible, local_session, plain_interrupts


def test_plain_interrupts_gives_ctrl_c_back_to_python(spark: Any) -> None:
    pysparks = signal.getsignal(signal.SIGINT)
    assert getattr(pysparks, "__module__", "").startswith("pyspark")  # set by the session
    try:
        plain_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, pysparks)


def test_a_session_asked_for_plain_ctrl_c_has_it(spark: Any) -> None:
    """`local_session(ctrl_c="plain")` sets it as soon as the session exists, so that Ctrl-C
    during the check of Spark's Python workers (a job of a few seconds) is plain too: the
    demo's call after `local_session` returned left that window to PySpark (66 lines)."""
    pysparks = signal.getsignal(signal.SIGINT)
    try:
        assert local_session("flightfeed-tests", ctrl_c="plain") is spark  # (the same session)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, pysparks)


def _ctrl_c_once_a_task_runs(listener: socket.socket) -> None:
    """Presses Ctrl-C once a Spark task connects to `listener`: SIGINT to the process, which the
    kernel hands to the main thread, as a terminal's (`raise_signal` would go to this thread,
    and a main thread waiting on a lock would not notice it)."""
    connection, _ = listener.accept()
    connection.close()
    os.kill(os.getpid(), signal.SIGINT)


def _hang_after_calling(port: int) -> Any:
    def hang(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        with socket.create_connection(("127.0.0.1", port)):
            pass
        time.sleep(600)
        yield from batches

    return hang


def test_ctrl_c_in_an_interruptible_action_cancels_its_job_and_keeps_the_session(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain KeyboardInterrupt raised inside a py4j call logged "KeyboardInterrupt while
    sending command" with a traceback."""
    listener = socket.create_server(("127.0.0.1", 0))
    presser = threading.Thread(target=_ctrl_c_once_a_task_runs, args=(listener,))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        presser.start()
        hang = _hang_after_calling(listener.getsockname()[1])
        frame = spark.range(1, numPartitions=1).mapInArrow(hang, "id long")
        with caplog.at_level(logging.INFO), pytest.raises(KeyboardInterrupt):
            interruptible(spark, frame.collect)
        presser.join()
    finally:
        signal.signal(signal.SIGINT, previous)
        listener.close()
    assert [r.getMessage() for r in caplog.records if "sending command" in r.getMessage()] == []
    tracker = spark.sparkContext.statusTracker()
    job = max(tracker.getJobIdsForGroup())  # the interrupted collect's
    deadline = time.monotonic() + 30  # the tracker hears of the job's end through Spark's bus
    while tracker.getJobInfo(job).status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tracker.getJobInfo(job).status == "FAILED"  # cancelled, not left to sleep on
    assert spark.range(3).count() == 3


def test_ctrl_c_while_a_plain_session_starts_stops_it_once_it_is_up(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held until the start is over: cut off mid-start, Spark's JVM (which ignores SIGINT) lived
    on after the program. Here the press comes during the check of Spark's Python workers."""
    import flightfeed.spark.session as session

    checked = session.register

    def pressed_during(started: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        checked(started)

    stopped: list[Any] = []
    monkeypatch.setattr(session, "register", pressed_during)
    monkeypatch.setattr(spark, "stop", lambda: stopped.append(spark))  # the shared session
    pysparks = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            local_session("flightfeed-tests", ctrl_c="plain")
        assert stopped == [spark]
        assert signal.getsignal(signal.SIGINT) is pysparks  # as before the call
    finally:
        signal.signal(signal.SIGINT, pysparks)
