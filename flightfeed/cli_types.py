"""The argparse types of the command line: each turns a flag's text into its value, or into
the parser's one-line error (`flightfeed: error: argument --port: must be a port, ...`) before
anything starts. Shared by `flightfeed` and its `tables` commands, and by scripts such as the
examples."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Callable
from typing import Final

from .errors import InvalidArgument
from .flight.client import parse_location
from .flight.listen import MAX_PORT
from .plan.memory import parse_memory_size


def seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None


def non_negative_seconds(text: str) -> float:
    value = seconds(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def count_at_least(minimum: int, message: str, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number of at least `minimum` ("must be {message}, got ..."), and at most
    `maximum` if given (a value the setting can carry)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {message}, got {text}")
        return value

    return parse


non_negative_count = count_at_least(0, "0 or more")
positive_count = count_at_least(1, "1 or more")


def port(text: str) -> int:
    value = non_negative_count(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"must be a port, 0-{MAX_PORT} (0: any free one), got {text}"
        )
    return value


def location(text: str) -> str:
    """A Flight location, checked here and kept as written (peers are matched as named)."""
    try:
        parse_location(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def host_name(text: str) -> str:
    """A host name or address as it goes into a location others dial (`--advertise-host`),
    checked for its form here (a name that does not resolve is the network's business): 'bad
    host!' started, and every query failed dialling it."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _HOST_NAME.fullmatch(text) or len(text) > 253:
            raise argparse.ArgumentTypeError(
                f"must be a host name or an IP address, got {text!r}"
            ) from None
    return text


_HOST_NAME = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


def interface(text: str) -> str:
    """`--host`: an interface to bind; empty is refused (an unset $HOST bound every one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "must name an interface (127.0.0.1, 0.0.0.0 for all), got an empty value"
        )
    return text


def non_negative_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be bytes per second, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more bytes per second, got {text}")
    return value


MIN_MEMORY_LIMIT: Final = 16 << 20
"""The least `--memory-limit` taken: below it every query would fail on its first batch."""


def memory_size(text: str) -> int:
    """A size such as 4GiB, 512MB or 10%, of at least MIN_MEMORY_LIMIT (16 MiB)."""
    try:
        size = parse_memory_size(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if size < MIN_MEMORY_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be at least 16MiB (a worker's queries need room), got {text!r} ({size} bytes)"
        )
    return size


def directory_path(text: str) -> str:
    """A directory to create or use: not empty (an empty path would mean the current one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a directory, got an empty path")
    return text


def existing_directory(text: str) -> str:
    """A directory that exists now, as written (a typo would otherwise surface only when a
    plan reads there, as a file that is not found)."""
    if not os.path.isdir(text):
        why = "not a directory" if os.path.exists(text) else "no such directory"
        raise argparse.ArgumentTypeError(f"must be an existing directory, got {text!r} ({why})")
    return text


__all__ = [
    "count_at_least",
    "directory_path",
    "existing_directory",
    "location",
    "memory_size",
    "non_negative_count",
    "non_negative_rate",
    "non_negative_seconds",
    "port",
    "positive_count",
    "positive_seconds",
    "seconds",
]
