"""What a server connection must keep doing to stay open: finish what it started sending, at a
minimum rate, and make calls.

A client that starts a request message and then sends it a byte a second holds a call, its task
and its buffers for as long as it likes; one that opens a connection and makes no call holds a
descriptor. So, with the limits of connection_limits.py:

- A request message that has started arriving must keep arriving at `min_receive_rate` bytes a
  second, averaged since its first byte, after `receive_grace` seconds. Time between messages
  does not count (a CoordinatorChannel is quiet for minutes between two), nor time in which our
  own flow-control window held the sender back (a handler slow to read). Too slow: the call
  ends with RESOURCE_EXHAUSTED and its stream is reset; the connection and its other calls go on.
- A frame or header block that has started arriving must finish at the same rate. Nothing else
  can arrive on the connection meanwhile, and a header block must be decoded to keep HPACK in
  step, so the connection is closed with GOAWAY.
- A connection without calls for `idle_timeout` is closed with GOAWAY(NO_ERROR); a client
  reconnects for its next call.

The guard only keeps time; the connection protocol (grpc.py) feeds it what arrives and carries
out its verdicts. Timers are loop timers, re-armed only at the next deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from h2.errors import ErrorCodes
from h2.events import DataReceived, StreamEnded, StreamReset
from h2.exceptions import NoSuchStreamError, StreamClosedError

from .connection_limits import ConnectionLimits

HELD_WINDOW: Final = 16 * 1024
"""A receive window below this (one default frame) means the sender waits on us, not we on it."""
TIMER_SLACK: Final = 1e-3
"""Loop timers may fire this much early (uvloop rounds to milliseconds)."""
_CONNECTION: Final = 0
"""The clock key of the connection's own frame or header block (stream 0 is the connection)."""


class Timer(Protocol):
    def cancel(self) -> None: ...


CallAt = Callable[[float, Callable[[], None]], Timer]


class FlowWindows(Protocol):
    """What the guard reads of h2's connection: how much the peer may still send."""

    @property
    def inbound_flow_control_window(self) -> int: ...

    def remote_flow_control_window(self, stream_id: int) -> int: ...


class MessageFraming:
    """Where a stream's request bytes are in gRPC's length-prefixed framing."""

    def __init__(self) -> None:
        self._prefix = bytearray()
        self._body_left = 0

    @property
    def mid_message(self) -> bool:
        return bool(self._prefix) or self._body_left > 0

    def feed(self, data: Any) -> tuple[bool, int]:
        """Take the next bytes of the stream. Returns whether the message still unfinished
        after them began within them, and how many of them belong to it (0 at a boundary)."""
        if self._body_left > len(data):  # the common case: more of a large message
            self._body_left -= len(data)
            return False, len(data)
        view = memoryview(data).cast("B")
        size = len(view)
        began: int | None = None if self.mid_message else 0
        pos = 0
        while pos < size:
            if self._body_left:
                take = min(self._body_left, size - pos)
                self._body_left -= take
                pos += take
                if not self._body_left:
                    began = pos
                continue
            take = min(5 - len(self._prefix), size - pos)
            self._prefix += view[pos : pos + take]
            pos += take
            if len(self._prefix) == 5:
                self._body_left = int.from_bytes(self._prefix[1:], "big")
                self._prefix.clear()
                if not self._body_left:
                    began = pos  # an empty message: complete already
        if not self.mid_message:
            return False, 0
        return began is not None, size - (began or 0)


@dataclass
class _Clock:
    """Something the peer started sending: when, how much of it arrived since, and whether our
    flow control held the sender back meanwhile."""

    started: float
    received: int
    held: bool = False

    def due(self, grace: float, rate: float) -> float:
        return self.started + grace + self.received / rate


class ConnectionGuard:
    """The receive-rate and idle rules of one server connection (see the module docstring).

    `fail_call(stream_id, reason)` must end that call with RESOURCE_EXHAUSTED and reset its
    stream; `close(reason, error_code)` must send GOAWAY and close the connection.
    `unfinished()` names what the peer started and has not finished ("a header block", "an
    HTTP/2 frame") or None; `write_pending()` is how many bytes still wait to be sent.
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        *,
        windows: FlowWindows,
        unfinished: Callable[[], str | None],
        write_pending: Callable[[], int],
        fail_call: Callable[[int, str], None],
        close: Callable[[str, ErrorCodes], None],
        now: Callable[[], float],
        call_at: CallAt,
    ) -> None:
        self._rate = limits.min_receive_rate
        self._grace = limits.receive_grace
        self._idle_timeout = limits.idle_timeout
        self._windows = windows
        self._unfinished = unfinished
        self._write_pending = write_pending
        self._fail_call = fail_call
        self._close = close
        self._now = now
        self._call_at = call_at
        self._framing: dict[int, MessageFraming] = {}
        self._clocks: dict[int, _Clock] = {}
        self._timer: Timer | None = None
        self._due = 0.0
        self._calls: set[int] = set()
        self._idle_timer: Timer | None = None
        self._stopped = False
        self._arm_idle()

    # -- what arrives --------------------------------------------------------------------------

    def received(self, nbytes: int, events: Iterable[Any]) -> None:
        """After the connection took `nbytes` and h2 made `events` of them."""
        if self._stopped or self._rate is None:
            return
        now = self._now()
        fed: list[int] = []
        for event in events:
            if isinstance(event, DataReceived):
                if event.stream_id in self._calls:  # else its call is over: nothing waits
                    self._data(event.stream_id, event.data, now)
                    fed.append(event.stream_id)
            elif isinstance(event, StreamEnded | StreamReset):
                self._forget(event.stream_id)
        if self._clocks:
            self._note_held(fed)
        if self._unfinished() is None:
            self._clocks.pop(_CONNECTION, None)
        elif (clock := self._clocks.get(_CONNECTION)) is not None:
            clock.received += nbytes
        else:
            self._start(_CONNECTION, now, 0)

    def _data(self, stream_id: int, data: Any, now: float) -> None:
        framing = self._framing.get(stream_id)
        if framing is None:
            framing = self._framing[stream_id] = MessageFraming()
        began, belonging = framing.feed(data)
        if not belonging:  # at a message boundary
            self._clocks.pop(stream_id, None)
            return
        clock = self._clocks.get(stream_id)
        if began or clock is None:
            self._start(stream_id, now, belonging)
        else:
            clock.received += belonging

    def _held(self, stream_id: int) -> bool:
        try:
            return self._windows.remote_flow_control_window(stream_id) < HELD_WINDOW
        except (NoSuchStreamError, StreamClosedError):  # the stream is gone
            return False

    def _note_held(self, fed: list[int]) -> None:
        """Mark the messages whose sender our flow control stopped: the time is ours."""
        if self._windows.inbound_flow_control_window < HELD_WINDOW:
            fed = list(self._clocks)  # the connection window holds every stream back
        for stream_id in fed:
            clock = self._clocks.get(stream_id)
            if clock is None or clock.held or stream_id == _CONNECTION:
                continue
            if self._held(stream_id):
                clock.held = True

    # -- calls ---------------------------------------------------------------------------------

    def call_opened(self, stream_id: int) -> None:
        self._calls.add(stream_id)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def call_closed(self, stream_id: int) -> None:
        self._calls.discard(stream_id)
        self._forget(stream_id)
        if not self._calls:
            self._arm_idle()

    def _forget(self, stream_id: int) -> None:
        self._framing.pop(stream_id, None)
        self._clocks.pop(stream_id, None)

    def stop(self) -> None:
        """The connection is closing: no more verdicts."""
        self._stopped = True
        for timer in (self._timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._idle_timer = None
        self._clocks.clear()
        self._framing.clear()

    # -- timers --------------------------------------------------------------------------------

    def _start(self, key: int, now: float, received: int) -> None:
        assert self._rate is not None
        clock = self._clocks[key] = _Clock(now, received)
        self._arm(clock.due(self._grace, self._rate))

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            if self._due <= when:
                return
            self._timer.cancel()
        self._due = when
        self._timer = self._call_at(when, self.check)

    def check(self) -> None:
        """The timer: end what is too slow, forgive what our flow control held back, and
        re-arm for the next deadline."""
        self._timer = None
        if self._stopped or self._rate is None:
            return
        now = self._now()
        upcoming: float | None = None
        for key, clock in list(self._clocks.items()):
            due = clock.due(self._grace, self._rate)
            if due > now + TIMER_SLACK:
                upcoming = due if upcoming is None else min(upcoming, due)
                continue
            if key != _CONNECTION and (clock.held or self._held(key)):
                self._clocks[key] = fresh = _Clock(now, 0, held=self._held(key))
                due = fresh.due(self._grace, self._rate)
                upcoming = due if upcoming is None else min(upcoming, due)
                continue
            del self._clocks[key]
            self._expire(key, clock, now)
            if self._stopped:
                return
        if upcoming is not None:
            self._arm(upcoming)

    def _expire(self, key: int, clock: _Clock, now: float) -> None:
        pace = (
            f"{clock.received} bytes in {now - clock.started:.1f} s, slower than the minimum of"
            f" {self._rate:g} bytes/s after {self._grace:g} s"
        )
        if key == _CONNECTION:
            what = self._unfinished() or "an HTTP/2 frame"
            self._close(f"{what} arrived too slowly: {pace}", ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            self._forget(key)
            self._fail_call(key, f"the request message arrived too slowly: {pace}")

    def _arm_idle(self) -> None:
        if self._idle_timeout is not None and not self._stopped:
            self._idle_timer = self._call_at(self._now() + self._idle_timeout, self._idle)

    def _idle(self) -> None:
        self._idle_timer = None
        if self._stopped or self._calls:
            return
        if self._write_pending():  # still delivering the end of the last call
            self._arm_idle()
            return
        self._close(f"no calls for {self._idle_timeout:g} s", ErrorCodes.NO_ERROR)


__all__ = ["HELD_WINDOW", "ConnectionGuard", "FlowWindows", "MessageFraming"]
