"""LoopWatchdog: notice when something holds the event loop too long, and say what it was.

A callback that runs long on the event loop (CPU work, a blocking call) stops every other
stream the process serves. The watchdog keeps a heartbeat on the loop (a timer callback) and
measures how late each beat runs: a beat later than `threshold` is a stall. A thread beside the
loop samples the loop thread's stack while a beat is overdue, so the report names the code that
held the loop. Works on asyncio and uvloop alike; costs one timer callback per `interval`.

A late beat is not always the loop's fault: on a busy machine the whole process can be off the
CPU for a moment. Such a beat is a `pause`, not a stall, when nothing shows the loop was held:
the sampling thread could not run either (so it took no stack), and the loop thread used less
CPU than half the delay. A loop held by a blocking call is still caught (the sampler runs
beside it and takes its stack), and so is one held by CPU work (its thread's CPU time shows it,
even where it keeps the GIL from the sampler).

    async with LoopWatchdog(threshold=0.5) as watchdog:
        ...
    assert not watchdog.stalls, watchdog.report()
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import TracebackType

import anyio.to_thread


@dataclass(frozen=True)
class Stall:
    """The loop did not run a due callback for `seconds`; `stack` is where it was held."""

    seconds: float
    stack: str


class LoopWatchdog:
    """Records every stall of the running event loop longer than `threshold` seconds."""

    def __init__(self, threshold: float = 0.5, *, interval: float | None = None) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold must be positive, got {threshold}")
        self.threshold = threshold
        self.interval = interval if interval is not None else threshold / 5
        self.stalls: list[Stall] = []
        self.pauses: list[float] = []
        """Delays, in seconds, in which the process was off the CPU and nothing held the loop."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._scheduled_cpu = 0.0
        # (beat it was taken for, stack): written by the sampling thread in one assignment,
        # read on the loop, so neither side ever waits on a lock.
        self._sample_slot: tuple[float, str] = (0.0, "")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    async def __aenter__(self) -> LoopWatchdog:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._schedule()
        self._thread = threading.Thread(target=self._sample, name="loop watchdog", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._beat(final=True)
        self._stop.set()
        if self._thread is not None:
            await anyio.to_thread.run_sync(self._thread.join)

    def report(self) -> str:
        """The stalls, longest first, each with the stack that held the loop."""
        lines = [
            f"the event loop was blocked {len(self.stalls)} time(s) for more than "
            f"{self.threshold:g} s:"
        ]
        lines += [
            f"--- {stall.seconds:.3f} s, held at:\n{stall.stack}"
            for stall in sorted(self.stalls, key=lambda s: -s.seconds)
        ]
        if self.pauses:
            lines.append(
                f"(not counted: {len(self.pauses)} pause(s) with the process off the CPU, "
                f"the longest {max(self.pauses):.3f} s)"
            )
        return "\n".join(lines)

    # -- on the loop ------------------------------------------------------------------------

    def _schedule(self) -> None:
        assert self._loop is not None
        self._scheduled_cpu = time.thread_time()
        self._due = time.monotonic() + self.interval
        self._handle = self._loop.call_later(self.interval, self._beat)

    def _beat(self, *, final: bool = False) -> None:
        late = time.monotonic() - self._due
        cpu = time.thread_time() - self._scheduled_cpu
        sampled_for, stack = self._sample_slot
        if sampled_for != self._due:
            stack = ""
        if late > self.threshold:
            if stack or cpu >= late / 2:
                self.stalls.append(Stall(late, stack or "(not sampled: the loop kept the GIL)"))
            else:
                self.pauses.append(late)
        if not final:
            self._schedule()

    # -- beside the loop --------------------------------------------------------------------

    def _sample(self) -> None:
        """While a beat is overdue by half the threshold, keep the loop thread's stack; but
        only from a wake-up that came on time: one that came late means the whole process was
        off the CPU, and a stack taken then shows where the loop resumed, not what held it."""
        woken_by = time.monotonic() + self.interval
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            on_time = now - woken_by < self.threshold / 2
            woken_by = now + self.interval
            due = self._due
            overdue = now - due > self.threshold / 2
            if on_time and overdue and self._sample_slot[0] != due:
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
                self._sample_slot = (due, stack)
