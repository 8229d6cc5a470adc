"""flight/shared_memory.py: the control messages (every value from the peer checked), a segment
written by one side and read in place by the other, slots lent back as batches are released (in
groups), a mapping kept for the next read of the same segment, and segments that are not the
server's refused."""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.flight.shared_memory import (
    HEADER_BYTES,
    MAX_HELD,
    MAX_SLOTS,
    NONCE_BYTES,
    SEGMENT_ID_CHARS,
    Freed,
    Mapping,
    Offer,
    Placed,
    Reply,
    Request,
    Segment,
    is_loopback_peer,
    parse_read_command,
    read_command,
)

SLOT = 64 * 1024
SEGMENT_ID = "0123456789abcdef" * 2
segment_ids = st.text("0123456789abcdef", min_size=SEGMENT_ID_CHARS, max_size=SEGMENT_ID_CHARS)


def batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(range(start, start + n), pa.int64()), "s": [f"r{i}" for i in range(n)]}
    )


@given(st.binary(max_size=200))
def test_a_read_command_carries_its_ticket(ticket: bytes) -> None:
    assert parse_read_command(read_command(ticket)) == ticket


def test_another_command_is_not_a_read() -> None:
    assert parse_read_command(b"SELECT 1") is None


@given(
    st.integers(1, MAX_SLOTS),
    st.integers(1, 1024).map(lambda pages: pages * HEADER_BYTES),
    st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
    segment_ids,
)
def test_an_offer_round_trips(slots: int, slot_bytes: int, nonce: bytes, segment_id: str) -> None:
    offer = Offer("/dev/shm/flightfeed-shm-x", nonce, slots, slot_bytes, segment_id)
    assert Offer.decode(offer.encode()) == offer
    again = offer.reuse()  # the same segment, for the reader that maps it: no path
    assert (again.path, again.reused, again.offered) == (None, True, True)
    assert Offer.decode(again.encode()) == again


@given(st.lists(segment_ids, max_size=MAX_HELD))
def test_a_request_round_trips(held: list[str]) -> None:
    assert Request.decode(Request(tuple(held)).encode()) == Request(tuple(held))


def test_an_empty_request_holds_nothing() -> None:
    assert Request.decode(b"{}") == Request(())


@given(st.integers(0, MAX_SLOTS - 1), st.integers(1, 4096), st.integers(0, 2**31 - 1))
def test_a_placed_batch_round_trips(slot: int, nbytes: int, partition: int) -> None:
    offer = Offer("/x", bytes(NONCE_BYTES), MAX_SLOTS, HEADER_BYTES)
    placed = Placed(slot, nbytes, partition)
    assert Placed.decode(placed.encode(), offer) == placed


@given(st.lists(st.integers(0, 7), max_size=8))
def test_freed_slots_round_trip(slots: list[int]) -> None:
    assert Freed.decode(Freed(tuple(slots)).encode(), 8).slots == tuple(slots)


def test_no_offer_and_replies_round_trip() -> None:
    assert Offer.decode(Offer(None).encode()) == Offer(None)
    assert Reply.decode(Reply(True).encode()) == Reply(True)
    assert Reply.decode(Reply(False).encode()) == Reply(False)


OFFER = Offer("/x", bytes(NONCE_BYTES), 8, HEADER_BYTES, SEGMENT_ID)
NONCE_HEX = b"00" * NONCE_BYTES


@pytest.mark.parametrize(
    ("decode", "data", "says"),
    [
        (Offer.decode, None, "got a message without one"),
        (Offer.decode, b"\xff", "not JSON"),
        (Offer.decode, b"[1]", "not an object"),
        (Offer.decode, b'{"segment":"relative"}', "absolute path"),
        (Offer.decode, b'{"segment":"/x","nonce":"00","slots":1,"slot_bytes":4096}', "nonce"),
        (
            Offer.decode,
            b'{"segment":"/x","nonce":"%s","slots":0,"slot_bytes":4096}' % NONCE_HEX,
            "slots must be an integer in 1..1024",
        ),
        (
            Offer.decode,
            b'{"segment":"/x","nonce":"%s","slots":1,"slot_bytes":100}' % NONCE_HEX,
            "page-aligned",
        ),
        (
            Offer.decode,
            b'{"segment":"/x","nonce":"%s","slots":1,"slot_bytes":4096,"id":"xy"}' % NONCE_HEX,
            "the offer's id is not a segment id",
        ),
        (Offer.decode, b'{"segment":null,"reused":"yes"}', "reused must be true or false"),
        (Reply.decode, b'{"opened":1}', "true or false"),
        (Request.decode, b'{"held":"abc"}', "at most 16 segments"),
        (Request.decode, b'{"held":["%s"]}' % (b"a" * 33), "a held segment is not a segment id"),
        (Request.decode, b'{"held":["%s"]}' % (b"G" * 32), "a held segment is not a segment id"),
        (Request.decode, b'{"held":[%s]}' % b",".join([b'"%s"' % (b"a" * 32)] * 17), "at most"),
        (lambda d: Placed.decode(d, OFFER), Placed(8, 1, 0).encode(), "slot"),
        (lambda d: Placed.decode(d, OFFER), Placed(0, 4097, 0).encode(), "nbytes"),
        (lambda d: Placed.decode(d, OFFER), Placed(0, 0, 0).encode(), "nbytes"),
        (lambda d: Placed.decode(d, OFFER), Placed(0, 1, 2**31).encode(), "partition"),
        (lambda d: Placed.decode(d, OFFER), b'{"slot":0,"nbytes":1}', "starting b'PLCD'"),
        (lambda d: Placed.decode(d, OFFER), Placed(0, 1, 0).encode()[:-1], "starting b'PLCD'"),
        (lambda d: Freed.decode(d, 8), b'{"freed":[8]}', "0..7"),
        (lambda d: Freed.decode(d, 8), b'{"freed":"0"}', "0..7"),
        (Offer.decode, b" " * (64 * 1024 + 1), "too large"),
        (Request.decode, b"[" * 30_000 + b"]" * 30_000, "nests too deep"),  # (was RecursionError)
    ],
)
def test_a_malformed_control_message_is_refused_by_name(
    decode: object, data: bytes | None, says: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode(data)  # type: ignore[operator]
    assert says in str(info.value)
    assert str(info.value).startswith("shared-memory read:")


def test_batches_written_into_slots_are_read_in_place_and_lent_back(tmp_path: Path) -> None:
    segment = Segment(str(tmp_path), 2, SLOT)
    try:
        assert stat.S_IMODE(os.stat(segment.path).st_mode) == 0o600
        mapping = Mapping.open(segment.offer())
        assert mapping is not None
        segment.unlink()  # as the server does once the reader mapped it
        assert list(tmp_path.iterdir()) == []
        first, second = batch(100), batch(50, 100)
        got = []
        for slot, sent in enumerate((first, second)):
            nbytes = segment.write(slot, sent)
            got.append(mapping.batch(Placed(slot, nbytes, partition=3)))
        assert got == [first, second]
        assert mapping.take_freed() == []  # both still held
        del got[0]
        gc.collect()
        assert mapping.take_freed() == [0]
        nbytes = segment.write(0, batch(7, 500))  # the slot lent back is written again
        again = mapping.batch(Placed(0, nbytes, 0))
        assert again == batch(7, 500)
        assert got[0] == second  # the other slot untouched
        mapping.close()
        assert again.column("id").to_pylist() == list(range(500, 507))  # mapped while held
    finally:
        segment.close()
        segment.close()  # idempotent


def test_a_batch_larger_than_a_slot_does_not_fit(tmp_path: Path) -> None:
    segment = Segment(str(tmp_path), 1, HEADER_BYTES)
    try:
        assert segment.fits(batch(10))
        assert not segment.fits(batch(10_000))
    finally:
        segment.close()


def test_a_slot_placed_twice_while_held_is_refused(tmp_path: Path) -> None:
    segment = Segment(str(tmp_path), 1, SLOT)
    try:
        mapping = Mapping.open(segment.offer())
        assert mapping is not None
        held = mapping.batch(Placed(0, segment.write(0, batch(3)), 0))
        with pytest.raises(InvalidArgument, match="slot 0 was placed again while still in use"):
            mapping.batch(Placed(0, 10, 0))
        assert held.num_rows == 3
        mapping.close()
    finally:
        segment.close()


def test_a_slot_that_is_not_a_batch_is_refused(tmp_path: Path) -> None:
    segment = Segment(str(tmp_path), 1, SLOT)
    try:
        mapping = Mapping.open(segment.offer())
        assert mapping is not None
        with pytest.raises(InvalidArgument, match="slot 0 is not a batch"):
            mapping.batch(Placed(0, 100, 0))  # zeros: no IPC stream there
        mapping.close()
    finally:
        segment.close()


def test_a_segment_that_is_not_the_servers_is_not_mapped(tmp_path: Path) -> None:
    segment = Segment(str(tmp_path), 1, SLOT)
    try:
        offer = segment.offer()
        wrong_nonce = Offer(offer.path, bytes(NONCE_BYTES), offer.slots, offer.slot_bytes)
        assert offer.nonce != bytes(NONCE_BYTES)
        assert Mapping.open(wrong_nonce) is None
        wrong_size = Offer(offer.path, offer.nonce, offer.slots + 1, offer.slot_bytes)
        assert Mapping.open(wrong_size) is None
        assert Mapping.open(Offer(str(tmp_path / "missing"), offer.nonce, 1, SLOT)) is None
        assert Mapping.open(Offer(str(tmp_path), offer.nonce, 1, SLOT)) is None  # a directory
    finally:
        segment.close()


def test_a_segment_needs_page_aligned_slots(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        Segment(str(tmp_path), 1, 1000)
    with pytest.raises(InvalidArgument):
        Segment(str(tmp_path), 0, SLOT)
    assert list(tmp_path.iterdir()) == []


def test_a_mapping_is_reused_only_for_its_own_segment_and_once_every_batch_is_back(
    tmp_path: Path,
) -> None:
    segment = Segment(str(tmp_path), 2, SLOT)
    try:
        offer = segment.offer()
        mapping = Mapping.open(offer)
        assert mapping is not None
        assert mapping.segment_id == segment.segment_id
        assert mapping.matches(offer.reuse())
        assert not mapping.matches(offer)  # a new segment's offer is not a reuse
        assert not mapping.matches(Offer(None, offer.nonce, 2, SLOT, SEGMENT_ID, reused=True))
        assert not mapping.matches(
            Offer(None, bytes(NONCE_BYTES), 2, SLOT, segment.segment_id, reused=True)
        )
        assert mapping.all_returned()
        held = mapping.batch(Placed(1, segment.write(1, batch(5)), 0))
        assert not mapping.all_returned()  # a batch still uses slot 1: not to be offered again
        del held
        gc.collect()
        assert mapping.all_returned()
        assert mapping.take_freed() == []  # (taken by all_returned: a new read starts clean)
        mapping.close()
        mapping.close()  # idempotent
    finally:
        segment.close()


def test_released_slots_are_lent_back_in_groups(tmp_path: Path) -> None:
    """Half the slots at a time, or at once when every slot is the reader's (the server
    would otherwise wait for one)."""
    segment = Segment(str(tmp_path), 4, SLOT)
    try:
        mapping = Mapping.open(segment.offer())
        assert mapping is not None
        assert not mapping.lend_back_due()  # nothing released
        first = mapping.batch(Placed(0, segment.write(0, batch(1)), 0))
        del first
        gc.collect()
        assert not mapping.lend_back_due()  # one of four back: the server has three more
        second = mapping.batch(Placed(1, segment.write(1, batch(1)), 0))
        del second
        gc.collect()
        assert mapping.lend_back_due()  # half the slots
        assert sorted(mapping.take_freed()) == [0, 1]
        held = [mapping.batch(Placed(s, segment.write(s, batch(1)), 0)) for s in range(4)]
        assert not mapping.lend_back_due()  # all four held, none released
        del held[0]
        gc.collect()
        assert mapping.lend_back_due()  # the server has no slot left: one back is due now
        held.clear()
        mapping.close()
    finally:
        segment.close()


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        (("127.0.0.1", 5000), True),
        (("127.3.2.1", 5000), True),
        (("::1", 5000), True),
        (("::ffff:127.0.0.1", 5000), True),
        (("10.0.0.7", 5000), False),
        (("::ffff:10.0.0.7", 5000), False),
        (("2001:db8::1", 5000), False),
        (("fe80::1%eth0", 5000), False),
        (("not an address", 5000), False),
        (None, False),
    ],
)
def test_only_a_loopback_peer_is_offered_a_segment(
    peer: tuple[str, int] | None, local: bool
) -> None:
    assert is_loopback_peer(peer) is local


def test_a_batch_of_another_schema_is_sized_with_its_own_schema(tmp_path: Path) -> None:
    """`fits` remembers the schema message's size between batches of one schema, never
    across schemas: a wide schema alone can fill a slot."""
    segment = Segment(str(tmp_path), 1, HEADER_BYTES)
    try:
        assert segment.fits(batch(1))
        wide = pa.record_batch({f"column_{i:04d}_{'x' * 40}": [i] for i in range(60)})
        assert pa.ipc.get_record_batch_size(wide) < HEADER_BYTES  # the batch alone would fit
        assert not segment.fits(wide)
        assert segment.fits(batch(2))
    finally:
        segment.close()
