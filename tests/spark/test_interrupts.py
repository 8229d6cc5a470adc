"""Ctrl-C in a program that started a classic Spark session: PySpark's SIGINT handler cancels
the session's jobs from inside the handler, and the JVM calls collide into pages of
tracebacks; `plain_interrupts` (the demo's and the examples') gives the plain
KeyboardInterrupt back."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from flightfeed.spark import plain_interrupts


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
