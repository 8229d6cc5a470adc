"""What one write call may decode its rows to, all of them together (dictionaries as their
values: `dictionary_expansion`).

A limit per payload element, or per request, is no limit: a 100 KB Write of a dozen small zstd
frames, each declaring 256 MiB (under the limit on its own), took a worker to 3.2 GB before
anything was refused. Every element of every request of a Write or WriteBatch spends from one
budget, before the memory is taken, and the first element past it is refused.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

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


def _variable_width(type_: pa.DataType) -> bool:
    return any(
        test(type_)
        for test in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_string_view,
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_binary_view,
        )
    )


def dictionary_expansion(batch: pa.RecordBatch) -> int:
    """Bytes a batch's dictionary columns take once decoded, as a table stores them: a 1 MB
    write of one 1 MiB dictionary value and 3,000 indices decoded to 3 GiB, past every limit
    that counted only the bytes sent. Computed by Arrow over the indices (no decoding)."""
    total = 0
    for column in batch.columns:
        if not pa.types.is_dictionary(column.type):
            continue
        values, indices = column.dictionary, column.indices
        if _variable_width(values.type):
            if pa.types.is_string_view(values.type) or pa.types.is_binary_view(values.type):
                values = values.cast(pa.large_binary())  # (binary_length takes no view)
            lengths = pc.binary_length(values)
            total += (pc.sum(pc.take(lengths, indices)).as_py() or 0) + 8 * len(indices)
        elif len(values):
            total += -(-values.nbytes * len(indices) // len(values))  # (fixed width: exact)
    return total


__all__ = ["DecodeBudget", "dictionary_expansion"]
