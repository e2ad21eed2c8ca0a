"""One worker per job at a time: the reconciler, the RayJob mirror and the resync pass each act on a
job only while holding its lock, so none acts on what another is changing (as controller-runtime's
work queue never hands one key to two workers).

Kopf already runs one handler at a time per object, but the job's handlers and its RayJob's run on
different objects, and the resync pass in its own thread. A lock lives only while someone holds or
waits for it, so the table stays as small as the number of jobs being worked on.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

V = TypeVar("V")


class JobLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.RLock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """The job `key` (namespace/name) to this thread alone until the block ends; re-entrant."""
        with self._guard:
            lock, users = self._locks.get(key) or (threading.RLock(), 0)
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


JOB_LOCKS = JobLocks()


class Recent(Generic[V]):
    """What this process remembers per job (by uid) across handler threads, for the most recent
    `capacity` jobs: the oldest is forgotten first, and forgetting one only costs it a request."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: collections.OrderedDict[str, V] = collections.OrderedDict()
        self._guard = threading.Lock()

    def put(self, key: str, value: V) -> bool:
        """Remember `value` for `key`, now the most recent; True if `key` was not remembered."""
        with self._guard:
            new = key not in self._items
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
            return new

    def get(self, key: str) -> V | None:
        with self._guard:
            return self._items.get(key)

    def forget(self, key: str) -> None:
        with self._guard:
            self._items.pop(key, None)

    def __len__(self) -> int:
        with self._guard:
            return len(self._items)
