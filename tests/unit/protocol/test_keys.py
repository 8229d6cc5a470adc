"""Task keys from the network are validated; their identity is hashable."""

from __future__ import annotations

import pytest

from flightfeed.errors import ErrorOrigin, InvalidArgument
from flightfeed.protocol import TaskId, TaskKey, task_id


def test_identity_round_trip_and_origin() -> None:
    key = TaskKey(query_id=b"\xab\xcd", stage_id=1, task_number=2, attempt=3)
    found = task_id(key)
    assert found == TaskId(b"\xab\xcd", 1, 2, 3)
    assert {found: 1}[TaskId.of(key)] == 1
    assert found.to_proto() == key
    assert str(found) == "abcd/1/2#3"
    assert found.origin("grpc://w:1", "plan decode") == ErrorOrigin(
        "grpc://w:1", b"\xab\xcd", 1, 2, 3, "plan decode"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "task_key is missing"),
        (TaskKey(query_id=b""), "query_id is empty"),
        (TaskKey(query_id=b"x" * 257), "longer than 256 bytes"),
    ],
)
def test_bad_keys_are_refused(key: TaskKey | None, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        task_id(key)
