"""What one write call may decode its rows to, all of them together.

A limit per payload element, or per request, is no limit: a 100 KB Write of a dozen small zstd
frames, each declaring 256 MiB (under the limit on its own), took a worker to 3.2 GB before
anything was refused. Every element of every request of a Write or WriteBatch spends from one
budget, before the memory is taken, and the first element past it is refused.
"""

from __future__ import annotations

from ..errors import ResourceExhausted


class DecodeBudget:
    """`spend` before decoding; ResourceExhausted once the call's total would pass `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, size: int, what: str, advice: str = "") -> None:
        """Take `size` bytes for `what` (the error names it, and adds `advice`)."""
        if self.spent + size > self.limit:
            before = f", after {self.spent} bytes decoded before it" if self.spent else ""
            raise ResourceExhausted(
                f"{what} decodes to {size} bytes{before}: over the worker's limit of"
                f" {self.limit} bytes for one write{advice}"
            )
        self.spent += size


__all__ = ["DecodeBudget"]
