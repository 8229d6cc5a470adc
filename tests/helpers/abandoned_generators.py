"""Which of flightfeed's async generators were left unfinished for the garbage collector.

An async generator dropped before its end is closed when it is collected, by a task the event
loop starts for it (`sys.set_asyncgen_hooks`' finalizer): its `finally` blocks run late, and
each costs the loop a cross-thread wake-up. flightfeed closes what it opens (`closing`);
this watches the finalizer for the generators that slip through.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import flightfeed

PACKAGE = str(Path(flightfeed.__file__).parent)


@contextmanager
def abandoned_generators() -> Iterator[list[str]]:
    """The flightfeed generators (first iterated inside the block, in this thread) that the
    collector finalized unfinished, as "qualname (file:line)"; the list is complete when the
    block exits (it collects cyclic garbage first)."""
    found: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen: Any) -> None:
        code = agen.ag_code
        if code.co_filename.startswith(PACKAGE):
            frame = agen.ag_frame
            line = frame.f_lineno if frame is not None else code.co_firstlineno
            where = Path(code.co_filename).relative_to(PACKAGE)
            found.append(f"{code.co_qualname} ({where}:{line})")
        if hooks.finalizer is not None:
            hooks.finalizer(agen)

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        yield found
    finally:
        gc.collect()
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)
