"""Ctrl-C in a program that started a classic Spark session: PySpark's SIGINT handler cancels
the session's jobs from inside the handler, and the JVM calls collide into pages of
tracebacks; `plain_interrupts` (the demo's and the examples') gives the plain
KeyboardInterrupt back."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from flightfeed.spark import local_session, plain_interrupts


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
