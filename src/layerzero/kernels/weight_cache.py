"""Per-weight derived copies (a kernel's packed layout) kept while the weight lives, keyed by identity.

A copy is remade when the weight changes in place (its version counter; inference tensors keep none) or gets a
new storage, and dropped when the weight is collected. The oneDNN dense linear and the CPU 4-bit linear use it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry(Generic[T]):
    weight: weakref.ref[torch.Tensor]
    data_ptr: int
    version: int
    value: T


class WeightCache(Generic[T]):
    def __init__(self) -> None:
        self._entries: dict[int, _Entry[T]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, weight: torch.Tensor, make: Callable[[], T]) -> T:
        """The copy derived from `weight`, made by `make()` on first use or after the weight changed."""
        version = -1 if torch.is_inference(weight) else weight._version
        entry = self._entries.get(id(weight))
        if entry is not None and entry.weight() is weight and entry.data_ptr == weight.data_ptr() \
                and entry.version == version:
            return entry.value
        value = make()
        key = id(weight)
        ref = weakref.ref(weight, lambda _: self._entries.pop(key, None))
        with self._lock:
            self._entries[key] = _Entry(ref, weight.data_ptr(), version, value)
        return value
