"""Log lines that clients can cause, rate-limited: a flood of bad calls or hostile connections
must not become a flood of log lines (nor fill the disk).

Each category (a kind of event: a method and status, a connection problem) may log `burst` lines
at once, then one every `interval` seconds; the first line let through after a pause says how
many similar ones were left out. `RateLimitFilter` does the same for grpclib's own logger.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

DEFAULT_BURST: Final = 10
DEFAULT_INTERVAL: Final = 6.0
MAX_CATEGORIES: Final = 1024
"""Categories remembered at once; past this the limiter starts afresh (a bounded dict, even
when a logger we do not own formats its messages before logging them)."""


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    suppressed: int = 0


class LogLimit:
    """A token bucket per category: `burst` lines at once, refilled one per `interval` s."""

    def __init__(
        self,
        burst: int = DEFAULT_BURST,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or not interval > 0:
            raise ValueError(f"burst must be at least 1 and interval positive: {burst}, {interval}")
        self.burst = burst
        self.interval = interval
        self._clock = clock
        self._buckets: dict[Hashable, _Bucket] = {}
        self._lock = threading.Lock()  # logging may happen on worker threads too

    def admit(self, category: Hashable) -> int | None:
        """None when this line is to be left out; otherwise how many lines of the category
        were left out since the last one let through."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(category)
            if bucket is None:
                if len(self._buckets) >= MAX_CATEGORIES:
                    self._buckets.clear()
                bucket = self._buckets[category] = _Bucket(float(self.burst), now)
            bucket.tokens = min(
                float(self.burst), bucket.tokens + (now - bucket.stamp) / self.interval
            )
            bucket.stamp = now
            if bucket.tokens < 1:
                bucket.suppressed += 1
                return None
            bucket.tokens -= 1
            suppressed, bucket.suppressed = bucket.suppressed, 0
            return suppressed


def _suppressed_note(count: int) -> str:
    return f" ({count} similar message{'s' if count > 1 else ''} suppressed)"


class RateLimitedLogger:
    """A logger whose lines are rate-limited by category."""

    def __init__(self, logger: logging.Logger, limit: LogLimit | None = None) -> None:
        self.logger = logger
        self.limit = limit or LogLimit()

    def log(
        self,
        category: Hashable,
        level: int,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return  # a line nobody sees spends no budget
        suppressed = self.limit.admit((category, level))
        if suppressed is None:
            return
        if suppressed:
            msg += _suppressed_note(suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)


class RateLimitFilter(logging.Filter):
    """The same limit for a logger flightfeed does not own, by message template and level."""

    def __init__(self, limit: LogLimit | None = None) -> None:
        super().__init__()
        self.limit = limit or LogLimit()

    def filter(self, record: logging.LogRecord) -> bool:
        suppressed = self.limit.admit((record.name, record.levelno, str(record.msg)))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = record.getMessage() + _suppressed_note(suppressed)
            record.args = None
        return True


def limit_logger(name: str, limit: LogLimit | None = None) -> None:
    """Rate-limit the lines of logger `name` (idempotent)."""
    logger = logging.getLogger(name)
    if not any(isinstance(existing, RateLimitFilter) for existing in logger.filters):
        logger.addFilter(RateLimitFilter(limit))


HEADER_LOGGERS = ("hpack", "h2")
"""Libraries whose DEBUG lines print every header decoded or sent, `authorization` included."""


def quiet_header_logs() -> None:
    """Keep the HTTP/2 libraries' DEBUG lines, which hold request headers and so credentials,
    out of the logs even when the application logs at DEBUG (idempotent; a level set higher
    is kept)."""
    for name in HEADER_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:
            logger.setLevel(logging.INFO)


__all__ = ["LogLimit", "RateLimitFilter", "RateLimitedLogger", "limit_logger", "quiet_header_logs"]
