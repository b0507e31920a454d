"""Thread-safe bounded LRU used for the selection caches (keys are built by their users)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LRUCache(Generic[V]):
    """Bounded mapping evicting the least recently used entry; safe across threads (writers take a lock)."""

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        # Lock-free read: OrderedDict.get and move_to_end are each atomic, and a concurrent eviction of
        # this key only costs the recency update. hits/misses are therefore approximate counters.
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        try:
            self._data.move_to_end(key)
        except KeyError:
            pass
        self.hits += 1
        return value

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def add(self, key: Hashable, value: V) -> bool:
        """Insert key only if absent (atomically); True when this call inserted it."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return False
            self._data[key] = value
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
            return True

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> dict[str, int]:
        return {"size": len(self._data), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses}
