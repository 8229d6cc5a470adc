"""Task keys: a hashable identity, validation of keys from the network, error origins."""

from __future__ import annotations

from typing import NamedTuple

from .._generated.flightfeed.v1 import TaskKey
from ..errors import ErrorOrigin, InvalidArgument

MAX_QUERY_ID_BYTES = 256


class TaskId(NamedTuple):
    """A TaskKey as a dict key (betterproto2 messages are not hashable)."""

    query_id: bytes
    stage_id: int
    task_number: int
    attempt: int

    @classmethod
    def of(cls, key: TaskKey) -> TaskId:
        """The identity of a key as it is (use `task_id` for keys from the network)."""
        return cls(bytes(key.query_id), key.stage_id, key.task_number, key.attempt)

    def __str__(self) -> str:
        return f"{self.query_id.hex()}/{self.stage_id}/{self.task_number}#{self.attempt}"

    def origin(self, worker_url: str = "", component: str = "") -> ErrorOrigin:
        """Where an error of this task happened (an empty `worker_url`: the coordinator)."""
        return ErrorOrigin(
            worker_url,
            self.query_id,
            self.stage_id,
            self.task_number,
            self.attempt,
            component,
        )

    def to_proto(self) -> TaskKey:
        return TaskKey(
            query_id=self.query_id,
            stage_id=self.stage_id,
            task_number=self.task_number,
            attempt=self.attempt,
        )


def task_id(key: TaskKey | None) -> TaskId:
    """Validate a TaskKey from the network and return its identity."""
    if key is None:
        raise InvalidArgument("task_key is missing")
    if not key.query_id:
        raise InvalidArgument("task_key.query_id is empty")
    if len(key.query_id) > MAX_QUERY_ID_BYTES:
        raise InvalidArgument(f"task_key.query_id is longer than {MAX_QUERY_ID_BYTES} bytes")
    return TaskId.of(key)


def origin_key(origin: ErrorOrigin) -> TaskKey | None:
    """The TaskKey an error origin names, if it names a task."""
    if not origin.query_id:
        return None
    return TaskId(origin.query_id, origin.stage_id, origin.task_number, origin.attempt).to_proto()
