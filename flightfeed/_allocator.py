"""Arrow's allocator, configured before pyarrow loads (so this module must not import it).

pyarrow's default memory pool is mimalloc. A worker streaming batches frees and allocates the
same few hundred megabytes over and over, and two of mimalloc's defaults made the kernel
zero memory for almost every batch (in a Parquet group-by, 17% of a worker's CPU in
`clear_page_erms`, 4,000-5,000 page faults per query per worker):

- it hands freed pages back to the kernel after a short delay, so the next batch gets fresh
  pages: keeping them for PURGE_DELAY_MS brings the faults to a few hundred at most;
- it asks for transparent huge pages on its memory, so each fault on memory it had not handed
  out before zeroes 2 MiB, touched or not (still 8% of the worker's CPU): without them a
  fault zeroes the 4 KiB page touched.

Together they took `benchmarks/distributed_aggregate.py` from 0.72-0.81 to 0.87-0.90 of
Acero in one process. Memory still goes back: workers and coordinators force the purge after
a second of quiet (`flight.idle_release`, `release_free_memory`), and any other process gets
its pages purged once they have been free for the delay. mimalloc reads its options when the
library loads, so this works only if flightfeed is imported before pyarrow; a value already
in the environment always wins, and processes started from this one inherit the settings.
"""

from __future__ import annotations

import os
import sys
from typing import Final

PURGE_DELAY_MS: Final = 10_000
OPTIONS: Final = {
    "MIMALLOC_PURGE_DELAY": str(PURGE_DELAY_MS),
    "MIMALLOC_ALLOW_THP": "0",
}
"""mimalloc's environment options, as flightfeed sets them."""


def configure_arrow_allocator() -> dict[str, bool]:
    """Set each of OPTIONS unless pyarrow is loaded already or the environment has a value;
    per option, whether flightfeed's value is in force for this process (and its children)."""
    if "pyarrow" not in sys.modules:  # (once it is, a value set now would only mislead)
        for name, value in OPTIONS.items():
            os.environ.setdefault(name, value)
    return {name: os.environ.get(name) == value for name, value in OPTIONS.items()}


configure_arrow_allocator()
