"""The receive-rate and idle rules of a server connection, on a clock the tests move: slowness
within a message counts, quiet between messages and time our flow control held the sender do
not, and a connection without calls is closed when idle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from h2.errors import ErrorCodes
from h2.events import DataReceived, StreamEnded, StreamReset

from flightfeed.flight.connection_guard import ConnectionGuard, MessageFraming
from flightfeed.flight.connection_limits import ConnectionLimits

WINDOW = 4 * 1024 * 1024


def prefixed(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([prefixed(b"abc")], [(False, 0)]),  # whole: at a boundary
        ([prefixed(b"abc")[:2], prefixed(b"abc")[2:]], [(True, 2), (False, 0)]),
        ([prefixed(b"abc")[:6], b"bc"], [(True, 6), (False, 0)]),
        ([prefixed(b"") + prefixed(b"xy")[:3]], [(True, 3)]),  # an empty one, then the next
        ([prefixed(b"a")[:5], b"a" + prefixed(b"bb")[:6]], [(True, 5), (True, 6)]),
    ],
    ids=["whole", "split-prefix", "split-body", "empty-then-next", "end-and-next"],
)
def test_framing_says_where_the_unfinished_message_began(
    chunks: list[bytes], expected: list[tuple[bool, int]]
) -> None:
    framing = MessageFraming()
    assert [framing.feed(chunk) for chunk in chunks] == expected


def test_framing_continues_a_message_across_chunks() -> None:
    framing = MessageFraming()
    message = prefixed(bytes(100))
    assert framing.feed(message[:10]) == (True, 10)
    assert framing.feed(message[10:50]) == (False, 40)
    assert framing.mid_message
    assert framing.feed(message[50:]) == (False, 0)
    assert not framing.mid_message


@dataclass
class FakeTimer:
    when: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeLoop:
    now: float = 100.0
    timers: list[FakeTimer] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(when, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock on, running the timers that come due on the way, in order."""
        target = self.now + seconds
        while due := [t for t in self.timers if not t.cancelled and t.when <= target]:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.now = target


@dataclass
class FakeWindows:
    inbound_flow_control_window: int = WINDOW
    streams: dict[int, int] = field(default_factory=dict)

    def remote_flow_control_window(self, stream_id: int) -> int:
        return min(self.inbound_flow_control_window, self.streams.get(stream_id, WINDOW))


@dataclass
class Connection:
    """A guard and what it decided."""

    loop: FakeLoop = field(default_factory=FakeLoop)
    windows: FakeWindows = field(default_factory=FakeWindows)
    unfinished: str | None = None
    write_pending: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)
    closed: list[tuple[str, ErrorCodes]] = field(default_factory=list)
    guard: ConnectionGuard = field(init=False)

    def start(self, **limits: object) -> Connection:
        options: dict[str, object] = {
            "min_receive_rate": 1000,
            "receive_grace": 1.0,
            "idle_timeout": None,
            "max_connections": 16,
            **limits,
        }
        self.guard = ConnectionGuard(
            ConnectionLimits(**options),  # type: ignore[arg-type]
            windows=self.windows,
            unfinished=lambda: self.unfinished,
            write_pending=lambda: self.write_pending,
            fail_call=lambda stream_id, reason: self.failed.append((stream_id, reason)),
            close=lambda reason, code: self.closed.append((reason, code)),
            now=self.loop.time,
            call_at=self.loop.call_at,
        )
        return self

    def data(self, stream_id: int, data: bytes) -> None:
        event = DataReceived(stream_id=stream_id, data=data, flow_controlled_length=len(data))
        self.guard.received(9 + len(data), [event])


def test_a_message_trickled_in_ends_its_call_after_the_grace() -> None:
    connection = Connection().start()
    connection.guard.call_opened(1)
    message = prefixed(bytes(100))
    for index in range(5):  # a byte every 0.2 s: 5 bytes/s
        connection.data(1, message[index : index + 1])
        connection.loop.advance(0.2)
    connection.loop.advance(0.1)
    (failed,) = connection.failed
    assert failed[0] == 1
    assert failed[1].startswith("the request message arrived too slowly: 5 bytes in 1.0 s")
    assert "slower than the minimum of 1000 bytes/s after 1 s" in failed[1]
    assert not connection.closed


def test_a_message_arriving_at_the_rate_is_left_alone() -> None:
    connection = Connection().start()
    connection.guard.call_opened(1)
    message = prefixed(bytes(20_000))
    for offset in range(0, len(message), 150):  # 1,500 bytes/s for ~13 s
        connection.data(1, message[offset : offset + 150])
        connection.loop.advance(0.1)
    connection.loop.advance(60)
    assert connection.failed == []


def test_quiet_between_messages_does_not_count() -> None:
    connection = Connection().start()
    connection.guard.call_opened(1)
    connection.data(1, prefixed(b"set plan"))
    connection.loop.advance(600)  # a CoordinatorChannel waiting for its next message
    connection.data(1, prefixed(b"credits")[:3])  # the next one starts: a fresh clock
    connection.loop.advance(0.9)
    assert connection.failed == []
    connection.loop.advance(0.2)
    assert [stream_id for stream_id, _ in connection.failed] == [1]


def test_time_our_flow_control_held_the_sender_is_forgiven() -> None:
    """A handler slow to read leaves the sender no window: that time is ours, not its."""
    connection = Connection().start()
    connection.guard.call_opened(1)
    connection.windows.streams[1] = 0  # what arrived filled the stream's window, unread
    connection.data(1, prefixed(bytes(100))[:10])
    connection.loop.advance(30)
    assert connection.failed == []
    connection.windows.streams[1] = WINDOW  # read at last; but the sender stays silent
    connection.loop.advance(2.1)  # the period under way was forgiven, the next one is not
    assert [stream_id for stream_id, _ in connection.failed] == [1]


def test_a_full_connection_window_holds_every_stream() -> None:
    connection = Connection().start()
    for stream_id in (1, 3):
        connection.guard.call_opened(stream_id)
    connection.data(1, prefixed(bytes(100))[:10])
    connection.windows.inbound_flow_control_window = 0  # stream 3's data, unread, took it all
    connection.data(3, prefixed(bytes(100))[:10])
    connection.windows.inbound_flow_control_window = WINDOW  # read soon after
    connection.loop.advance(1.05)
    assert connection.failed == []  # both were held back meanwhile
    connection.loop.advance(1.0)
    assert sorted(stream_id for stream_id, _ in connection.failed) == [1, 3]


def test_an_unfinished_frame_or_header_block_closes_the_connection() -> None:
    connection = Connection().start()
    connection.unfinished = "a header block"
    for _ in range(6):
        connection.guard.received(10, [])
        connection.loop.advance(0.2)
    (closed,) = connection.closed
    assert closed[0].startswith("a header block arrived too slowly: 50 bytes in ")
    assert closed[1] == ErrorCodes.ENHANCE_YOUR_CALM


def test_a_frame_finished_in_time_stops_its_clock() -> None:
    connection = Connection().start()
    connection.unfinished = "an HTTP/2 frame"
    connection.guard.received(5, [])
    connection.loop.advance(0.5)
    connection.unfinished = None
    connection.guard.received(5, [])
    connection.loop.advance(60)
    assert connection.closed == []


def test_a_stream_that_ended_or_a_call_that_closed_is_forgotten() -> None:
    connection = Connection().start()
    for stream_id in (1, 3, 5):
        connection.guard.call_opened(stream_id)
        connection.data(stream_id, prefixed(bytes(100))[:10])
    connection.guard.received(0, [StreamEnded(stream_id=1), StreamReset(stream_id=3)])
    connection.guard.call_closed(5)
    connection.data(7, prefixed(bytes(100))[:10])  # no call of ours: nothing waits for it
    connection.loop.advance(60)
    assert connection.failed == []


def test_a_connection_without_calls_is_closed_when_idle() -> None:
    connection = Connection().start(idle_timeout=5.0)
    connection.loop.advance(4.9)
    connection.guard.call_opened(1)
    connection.loop.advance(60)  # a call open for a minute: not idle
    connection.guard.call_closed(1)
    connection.loop.advance(4.9)
    assert connection.closed == []
    connection.loop.advance(0.2)
    assert connection.closed == [("no calls for 5 s", ErrorCodes.NO_ERROR)]


def test_an_idle_connection_is_kept_while_its_last_answer_goes_out() -> None:
    connection = Connection().start(idle_timeout=5.0)
    connection.write_pending = 1 << 20
    connection.loop.advance(5.1)
    assert connection.closed == []
    connection.write_pending = 0
    connection.loop.advance(5.0)
    assert connection.closed == [("no calls for 5 s", ErrorCodes.NO_ERROR)]


def test_without_a_minimum_rate_only_idleness_counts() -> None:
    connection = Connection().start(min_receive_rate=None, idle_timeout=5.0)
    connection.guard.call_opened(1)
    connection.unfinished = "an HTTP/2 frame"
    connection.data(1, prefixed(bytes(100))[:1])
    connection.loop.advance(600)
    assert connection.failed == []
    assert connection.closed == []


def test_a_stopped_guard_decides_nothing() -> None:
    connection = Connection().start(idle_timeout=5.0)
    connection.guard.call_opened(1)
    connection.data(1, prefixed(bytes(100))[:1])
    connection.guard.stop()
    connection.guard.call_closed(1)
    connection.loop.advance(600)
    assert connection.failed == []
    assert connection.closed == []
    assert all(timer.cancelled for timer in connection.loop.timers)
