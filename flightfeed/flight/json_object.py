"""A JSON object from untrusted bytes, every way it can be wrong a ValueError."""

from __future__ import annotations

import json
from typing import Any


def json_object(data: bytes) -> dict[str, Any]:
    """The object `data` holds; ValueError saying why not, for the caller to word: not JSON,
    nested deeper than Python's decoder recurses (its RecursionError is no ValueError: it came
    out of two parsers as INTERNAL), or not an object."""
    try:
        found = json.loads(data)
    except ValueError as exc:  # (UnicodeDecodeError too)
        raise ValueError(f"is not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("nests too deep") from None
    if isinstance(found, dict):
        return found
    raise ValueError("is not an object")


__all__ = ["json_object"]
