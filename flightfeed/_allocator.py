"""Arrow's allocator, configured before pyarrow loads (so this module must not import it).

pyarrow's default memory pool is mimalloc, which hands freed pages back to the kernel after
a short delay. A worker streaming batches frees and allocates the same few hundred megabytes
over and over, so every batch came back as fresh pages the kernel had to fault in and zero:
in a Parquet group-by that was 17% of a worker's CPU (`clear_page_erms`), 4,000-5,000 page
faults per query per worker. Keeping freed pages for PURGE_DELAY_MS brings the faults to a
few hundred at most, the zeroing to 8% (memory mimalloc has not handed out before) and the
worker's CPU down by about 15% (benchmarks/distributed_aggregate.py).

Memory still goes back: workers and coordinators force the purge after a second of quiet
(`flight.idle_release`, `release_free_memory`), and any other process gets its pages purged
once they have been free for the delay. mimalloc reads its options when the library loads,
so this works only if flightfeed is imported before pyarrow; an explicit
`MIMALLOC_PURGE_DELAY` in the environment always wins.
"""

from __future__ import annotations

import os
import sys
from typing import Final

PURGE_DELAY_MS: Final = 10_000
_OPTION: Final = "MIMALLOC_PURGE_DELAY"


def keep_freed_pages() -> bool:
    """Set mimalloc's purge delay unless pyarrow is loaded already or the user chose one;
    True when the setting is in force for this process (and its children)."""
    if "pyarrow" in sys.modules:
        return os.environ.get(_OPTION) == str(PURGE_DELAY_MS)
    os.environ.setdefault(_OPTION, str(PURGE_DELAY_MS))
    return os.environ[_OPTION] == str(PURGE_DELAY_MS)


keep_freed_pages()
