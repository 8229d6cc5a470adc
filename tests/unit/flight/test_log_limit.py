"""Rate-limited log lines: a burst goes through, a flood is cut, and the next line let through
says how many were left out."""

from __future__ import annotations

import logging

import pytest

from flightfeed.flight.log_limit import (
    MAX_CATEGORIES,
    LogLimit,
    RateLimitedLogger,
    RateLimitFilter,
    limit_logger,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_through_then_one_line_per_interval() -> None:
    clock = Clock()
    limit = LogLimit(burst=3, interval=10.0, clock=clock)
    assert [limit.admit("bad call") for _ in range(5)] == [0, 0, 0, None, None]
    clock.now += 9.0
    assert limit.admit("bad call") is None  # not a whole token yet
    clock.now += 1.0
    assert limit.admit("bad call") == 3  # the three left out meanwhile
    assert limit.admit("bad call") is None


def test_a_quiet_category_refills_to_its_burst_only() -> None:
    clock = Clock()
    limit = LogLimit(burst=2, interval=1.0, clock=clock)
    assert [limit.admit("x") for _ in range(3)] == [0, 0, None]
    clock.now += 3600.0
    assert [limit.admit("x") for _ in range(3)] == [1, 0, None]


def test_categories_have_budgets_of_their_own() -> None:
    limit = LogLimit(burst=1, interval=60.0, clock=Clock())
    assert limit.admit(("DoGet", "INVALID_ARGUMENT")) == 0
    assert limit.admit(("DoGet", "INVALID_ARGUMENT")) is None
    assert limit.admit(("DoGet", "NOT_FOUND")) == 0


def test_the_categories_remembered_are_bounded() -> None:
    """Past MAX_CATEGORIES the limiter starts afresh (a logger may format its own lines)."""
    limit = LogLimit(burst=1, interval=60.0, clock=Clock())
    assert limit.admit("first") == 0
    assert limit.admit("first") is None
    for index in range(MAX_CATEGORIES):
        assert limit.admit(index) == 0
    assert limit.admit("first") == 0  # forgotten, so it has its budget again


def test_a_limit_needs_a_burst_and_an_interval() -> None:
    with pytest.raises(ValueError, match="burst"):
        LogLimit(burst=0)
    with pytest.raises(ValueError, match="interval"):
        LogLimit(interval=0)


def test_the_logger_notes_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLogger(logging.getLogger("test.limited"), LogLimit(2, 5.0, clock))
    with caplog.at_level(logging.INFO, logger="test.limited"):
        for peer in range(6):
            limited.log("refused", logging.INFO, "refused a call from %s", peer)
        clock.now += 5.0
        limited.log("refused", logging.INFO, "refused a call from %s", 9)
    assert [record.getMessage() for record in caplog.records] == [
        "refused a call from 0",
        "refused a call from 1",
        "refused a call from 9 (4 similar messages suppressed)",
    ]


def test_lines_nobody_sees_spend_no_budget(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLogger(logging.getLogger("test.quiet"), LogLimit(1, 60.0, Clock()))
    with caplog.at_level(logging.INFO, logger="test.quiet"):
        for _ in range(5):
            limited.log("cancelled", logging.DEBUG, "a call was cancelled")
        limited.log("cancelled", logging.INFO, "a call was cancelled")
    assert [record.getMessage() for record in caplog.records] == ["a call was cancelled"]


def test_a_traceback_goes_with_its_line(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLogger(logging.getLogger("test.trace"), LogLimit(1, 60.0, Clock()))
    error = KeyError("x")
    with caplog.at_level(logging.WARNING, logger="test.trace"):
        limited.log("internal", logging.WARNING, "call failed", exc_info=error)
    (record,) = caplog.records
    assert record.exc_info is not None
    assert record.exc_info[1] is error


def test_the_filter_limits_a_logger_it_does_not_own(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    library = logging.getLogger("test.library")
    library.addFilter(RateLimitFilter(LogLimit(1, 10.0, clock)))
    with caplog.at_level(logging.INFO, logger="test.library"):
        for reason in ("reset", "lost", "lost"):
            library.info("Request was cancelled: %s", reason)
        library.info("another template")  # a category of its own
        clock.now += 10.0
        library.info("Request was cancelled: %s", "reset")
    assert [record.getMessage() for record in caplog.records] == [
        "Request was cancelled: reset",
        "another template",
        "Request was cancelled: reset (2 similar messages suppressed)",
    ]


def test_limiting_a_logger_twice_adds_one_filter() -> None:
    limit_logger("test.twice")
    limit_logger("test.twice")
    filters = logging.getLogger("test.twice").filters
    assert sum(isinstance(found, RateLimitFilter) for found in filters) == 1
