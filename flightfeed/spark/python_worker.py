"""Spark's Python worker, as flightfeed's reader and writer find it: tuned once, where they run.

Everything the data source does runs in Python workers that Spark forks from its daemons
and, by default (`spark.python.worker.reuse`), keeps from one command to the next: `read()`
and `write()` in one kind, and in others creating the source (`schema()`), planning a read
(`reader()`, `pushFilters()`, `partitions()`) or a write, and committing one. Two things
there cost more CPU than the work itself:

- After every task or command, pyspark's daemon runs a full `gc.collect()` over the worker's
  whole heap: pyspark, pyarrow, and everything flightfeed imports (grpclib, h2, ...).
  Measured on a 247 MB read over four Spark tasks, that was 0.25 s of the reading workers'
  0.44 s of CPU, and another ~0.11 s in the two workers that create the source and plan the
  read, for every read however small. Freezing the heap as it stands the first time
  flightfeed runs there (`gc.freeze`, after one collection so that no garbage is kept) takes
  the modules out of those passes (the planning workers' share fell to ~0.01 s); what is
  allocated later is collected as before.
- gRPC C++ takes its receive buffers from malloc: glibc's thresholds are raised as in
  flightfeed's own processes (`flight.tuning.tune_malloc_once`).

FLIGHTFEED_NO_GC_TUNING=1 and FLIGHTFEED_NO_MALLOC_TUNING=1 leave each as Spark has it. Outside
a reused Spark Python worker (SPARK_REUSE_WORKER unset: a test calling the reader in its own
process, say), the heap is left alone.
"""

from __future__ import annotations

import functools
import gc
import os

from ..flight.tuning import tune_malloc_once

REUSED_WORKER = "SPARK_REUSE_WORKER"
"""Set by Spark in its Python daemon's environment when workers are reused (the default)."""


@functools.cache
def settle_python_worker() -> bool:
    """Tune the Python worker this runs in, once per process; whether the heap was frozen."""
    tune_malloc_once()
    if not os.environ.get(REUSED_WORKER) or os.environ.get("FLIGHTFEED_NO_GC_TUNING") == "1":
        return False
    gc.collect()
    gc.freeze()
    return True


__all__ = ["settle_python_worker"]
