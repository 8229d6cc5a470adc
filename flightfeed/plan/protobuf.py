"""Strict protobuf parsing for untrusted plan bytes (see flightfeed.messages): a malformed plan
or payload is a PlanDecodeError naming what was being decoded."""

from __future__ import annotations

from typing import TypeVar

import betterproto2

from ..errors import InvalidArgument, PlanDecodeError
from ..messages import parse_strict

M = TypeVar("M", bound=betterproto2.Message)


def parse_message(message: type[M], data: bytes, what: str) -> M:
    """`message` parsed strictly from `data`; PlanDecodeError naming `what` on any failure."""
    try:
        return parse_strict(message, data)
    except PlanDecodeError:
        raise
    except InvalidArgument as exc:
        raise PlanDecodeError(f"{what} is not a valid {message.__name__}: {exc.message}") from None
