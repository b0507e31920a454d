"""The engine core's adapters: which are registered (by name) and which sit in the runner's device slots.

`LoRARegistry` checks an adapter when it is registered (`read_adapter`), so a bad one is refused before any request
names it. `AdapterSlots` is the scheduler's: a request takes its adapter's slot when it is admitted and gives it back
when it leaves the running set; an adapter no running request uses may be replaced, least recently used first. A
slot that gets a new adapter becomes a `LoRALoad` on the next step, which the runner carries out before that step's
forward (device work is stream ordered, so steps still in flight read the old adapter until they end).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import NamedTuple

from infer.families.config import ModelConfig
from infer.lora.adapter import LoRAError, read_adapter


class AdapterRef(NamedTuple):
    """A registered adapter: `adapter_id` is unique for the engine's life (the prefix cache's namespace, the
    runner's host-cache key), so an adapter registered again under the same name never reads the old one's KV."""

    name: str
    adapter_id: int
    path: str
    rank: int
    targets: tuple[str, ...]


class LoRALoad(NamedTuple):
    """Put `adapter` into device slot `slot` before the step runs."""

    slot: int
    adapter: AdapterRef


class LoRARegistry:
    def __init__(self, model: ModelConfig, max_rank: int) -> None:
        self.model, self.max_rank = model, max_rank
        self._by_name: dict[str, AdapterRef] = {}
        self._ids = itertools.count(1)  # 0 is the base model's namespace

    def add(self, name: str, path: str) -> AdapterRef:
        """Register the adapter at `path` as `name` (LoRAError: a bad adapter, or the name is taken by another)."""
        if not name:
            raise LoRAError("an adapter needs a non-empty name")
        known = self._by_name.get(name)
        if known is not None:
            if known.path == str(path):
                return known
            raise LoRAError(f"an adapter named {name!r} is already loaded (from {known.path}); unload it first")
        adapter = read_adapter(name, path, self.model, self.max_rank, load=False)
        ref = AdapterRef(name, next(self._ids), str(path), adapter.rank, adapter.targets)
        self._by_name[name] = ref
        return ref

    def remove(self, name: str) -> AdapterRef:
        """Unregister `name`: new requests cannot name it; requests already queued with it still run."""
        ref = self._by_name.pop(name, None)
        if ref is None:
            raise LoRAError(f"no adapter named {name!r} is loaded")
        return ref

    def get(self, name: str) -> AdapterRef:
        ref = self._by_name.get(name)
        if ref is None:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise LoRAError(f"no LoRA adapter named {name!r} is loaded (loaded: {known})")
        return ref

    def adapters(self) -> list[AdapterRef]:
        return list(self._by_name.values())


class AdapterSlots:
    """Which adapter each device slot holds and how many running requests use it."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._held: list[AdapterRef | None] = [None] * num_slots
        self._users = [0] * num_slots
        self._slot_of: dict[int, int] = {}  # adapter_id -> slot
        self._recent: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))  # least recent first
        self._loads: list[LoRALoad] = []

    def acquire(self, adapter: AdapterRef) -> int | None:
        """The slot holding `adapter` for one more running request, loading it into a free slot if needed; None when
        every slot is in use by other adapters (the request waits)."""
        slot = self._slot_of.get(adapter.adapter_id)
        if slot is None:
            slot = next((s for s in self._recent if self._users[s] == 0), None)
            if slot is None:
                return None
            old = self._held[slot]
            if old is not None:
                del self._slot_of[old.adapter_id]
            self._held[slot] = adapter
            self._slot_of[adapter.adapter_id] = slot
            self._loads.append(LoRALoad(slot, adapter))
        self._users[slot] += 1
        self._recent.move_to_end(slot)
        return slot

    def release(self, slot: int) -> None:
        if self._users[slot] <= 0:
            raise RuntimeError(f"LoRA slot {slot} released more often than acquired")
        self._users[slot] -= 1

    def take_loads(self) -> list[LoRALoad]:
        """The loads owed to the runner since the last call (the next step carries them)."""
        loads, self._loads = self._loads, []
        return loads

    def held(self) -> dict[str, int]:
        """Adapter name -> running requests using it (metrics)."""
        return {ref.name: self._users[s] for s, ref in enumerate(self._held) if ref is not None}
