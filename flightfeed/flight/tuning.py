"""Process and connection tuning for the data path, applied once at start-up.

- glibc malloc: Arrow allocates large, short-lived buffers; without a high mmap threshold every
  batch costs fresh mmap/munmap page faults, which dominate a transfer.
- h2 logs `repr(frame)` for every received frame, even with logging off, and a DATA frame's
  repr hexlifies its whole payload: we make that repr constant-cost.
- HTTP/2 settings: 4 MiB max frame and 4 MiB windows, so a batch travels in few frames;
  servers allow 1,024 concurrent streams per connection (h2's default is 100).
- uvloop by default, with a switch to turn it off.
- The cyclic garbage collector, in processes flightfeed runs (`run`): by default it runs a
  young-generation pass every 700 net allocations, and a busy coordinator allocates that many
  in a few hundred microseconds (messages, tasks, batches), so 14% of its CPU went to passes
  that found little. Passes at GC_THRESHOLDS, with the start-up heap frozen out
  of them, cost a few percent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

import h2.settings
from grpclib.config import Configuration

from .log_limit import quiet_header_logs

MAX_FRAME_SIZE: Final = 4 * 1024 * 1024
WINDOW_SIZE: Final = 4 * 1024 * 1024
MAX_CONCURRENT_STREAMS: Final = 1024
"""Calls a server lets one connection hold open: every task channel and read of a busy
coordinator shares its connections, and clients open another connection only past this."""
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD: Final = 64 * 1024 * 1024
TRIM_THRESHOLD: Final = 1024 * 1024 * 1024
GC_THRESHOLDS: Final = (20_000, 20, 10)
"""gc.set_threshold for processes flightfeed runs: young passes ~30x rarer than Python's default,
older ones as often relative to them (their cost grows with the heap, not the pass count)."""
_applied = False
_gc_tuned = False

T = TypeVar("T")


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds; returns False where glibc is not in use."""
    libc = _libc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and ok


@functools.cache
def tune_malloc_once() -> bool:
    """`tune_malloc`, once per process, unless FLIGHTFEED_NO_MALLOC_TUNING=1. Also for processes
    flightfeed only reads in (a Spark Python worker running the data source: gRPC C++ takes its
    receive buffers from malloc; spark/python_worker.py)."""
    if os.environ.get("FLIGHTFEED_NO_MALLOC_TUNING") == "1":
        return False
    return tune_malloc()


@functools.cache
def _libc() -> Any:
    """glibc, or None where it is not the C library in use."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def release_free_memory() -> None:
    """Hand memory that is free but kept back to the operating system: cyclic garbage the
    raised GC thresholds left for later, glibc's heap (kept up to TRIM_THRESHOLD, so a burst's
    peak stays resident) and Arrow's allocator's unused pages. Takes milliseconds to tens of
    them: call it when a process has gone quiet."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _cheap_data_repr(self: Any) -> str:
    return f"<{len(self.data)} bytes>"


def patch_h2_frame_repr() -> None:
    """Make DATA-frame repr O(1): h2 evaluates it for a trace log on every received frame."""
    from .internals import set_data_frame_repr

    set_data_frame_repr(_cheap_data_repr)


def grpc_config() -> Configuration:
    """grpclib configuration with flightfeed's window sizes."""
    return Configuration(
        http2_connection_window_size=WINDOW_SIZE,
        http2_stream_window_size=WINDOW_SIZE,
    )


def advertise_settings(h2_connection: Any, max_header_list_size: int | None = None) -> None:
    """Announce a 4 MiB max frame to the peer (h2 defaults to the 16 KiB minimum) and, from a
    server, room for MAX_CONCURRENT_STREAMS calls per connection (h2 defaults to 100). With
    `max_header_list_size`, also the header list size accepted, which h2's HPACK decoder holds
    lists to from now on (not only once the peer acknowledged it)."""
    settings = {h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_SIZE}
    if not h2_connection.config.client_side:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = MAX_CONCURRENT_STREAMS
    if max_header_list_size is not None:
        settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] = max_header_list_size
        h2_connection.decoder.max_header_list_size = max_header_list_size
    h2_connection.update_settings(settings)


def apply_process_tuning() -> None:
    """Idempotent process-wide tuning: malloc thresholds, the h2 repr patch, and the HTTP/2
    libraries' header logging kept quiet (it would print credentials)."""
    global _applied
    if _applied:
        return
    _applied = True
    tune_malloc_once()
    patch_h2_frame_repr()
    quiet_header_logs()


def tune_gc() -> bool:
    """Raise the collector's thresholds and freeze what exists now (modules, start-up state)
    out of its passes, once per process; FLIGHTFEED_NO_GC_TUNING=1 leaves Python's defaults.
    Only for processes flightfeed runs: an application embedding flightfeed keeps its own."""
    global _gc_tuned
    if _gc_tuned or os.environ.get("FLIGHTFEED_NO_GC_TUNING") == "1":
        return False
    _gc_tuned = True
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()
    return True


def use_uvloop_default() -> bool:
    """Whether to run on uvloop: on unless FLIGHTFEED_UVLOOP=0 or uvloop is missing."""
    if os.environ.get("FLIGHTFEED_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Callable[[], Coroutine[Any, Any, T]], *, use_uvloop: bool | None = None) -> T:
    """Run a coroutine function on uvloop (default) or asyncio, after process tuning (malloc,
    h2 and the garbage collector: `run` is how flightfeed's own processes start)."""
    import anyio

    apply_process_tuning()
    tune_gc()
    uvloop_on = use_uvloop_default() if use_uvloop is None else use_uvloop
    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": uvloop_on})
