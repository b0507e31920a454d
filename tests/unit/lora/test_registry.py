"""The core's adapters: registration (names, re-registration, refusal) and the scheduler's device slots under random
acquire / release sequences (hypothesis): an adapter is in at most one slot, a slot in use is never given to another
adapter, every newly placed adapter is loaded exactly once before it is used, and nothing leaks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from infer.lora.adapter import LoRAError
from infer.lora.registry import AdapterRef, AdapterSlots, LoRARegistry
from lora_adapters import write_random_adapter
from test_adapter import CFG, SHAPES


def _ref(i: int) -> AdapterRef:
    return AdapterRef(f"a{i}", i + 1, f"/a{i}", 8, ("q_proj",))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=60))
def test_random_acquires_and_releases_keep_the_slot_invariants(num_slots, ops):
    slots = AdapterSlots(num_slots)
    held: list[tuple[AdapterRef, int]] = []  # (adapter, slot) of the running requests
    device: dict[int, int] = {}  # slot -> adapter id loaded there, as the runner would hold it
    for acquire, i in ops:
        if acquire:
            ref = _ref(i)
            slot = slots.acquire(ref)
            for load in slots.take_loads():
                device[load.slot] = load.adapter.adapter_id
            in_use = {s for _, s in held}
            if slot is None:  # refused only when every slot is used by another adapter
                assert in_use == set(range(num_slots)) and all(r != ref for r, _ in held)
                continue
            assert device[slot] == ref.adapter_id  # loaded before it is used
            assert all(s != slot or r == ref for r, s in held)  # never another running adapter's slot
            held.append((ref, slot))
        elif held:
            _, slot = held.pop(i % len(held))
            slots.release(slot)
        users = {}
        for ref, slot in held:
            users.setdefault(ref.name, set()).add(slot)
        assert all(len(s) == 1 for s in users.values())  # an adapter sits in one slot
        assert {name: len([1 for r, _ in held if r.name == name]) for name in users} == \
            {name: n for name, n in slots.held().items() if n}
    for _, slot in held:
        slots.release(slot)
    assert all(n == 0 for n in slots.held().values())
    with pytest.raises(RuntimeError, match="released more often"):
        slots.release(0)


def test_the_least_recently_used_free_slot_is_replaced_first():
    slots = AdapterSlots(2)
    a, b, c = _ref(0), _ref(1), _ref(2)
    sa, sb = slots.acquire(a), slots.acquire(b)
    slots.release(sa)
    slots.release(sb)
    slots.take_loads()
    assert slots.acquire(a) == sa and slots.take_loads() == []  # still there: no load
    slots.release(sa)
    assert slots.acquire(c) == sb  # b was used least recently
    assert [load.adapter for load in slots.take_loads()] == [c]


def test_the_registry_checks_names_and_adapters(tmp_path):
    path = write_random_adapter(tmp_path / "ad", 2, SHAPES, rank=4, dtype=torch.float32)
    registry = LoRARegistry(CFG, max_rank=8)
    ref = registry.add("x", str(path))
    assert registry.add("x", str(path)) == ref  # the same adapter again: nothing changes
    with pytest.raises(LoRAError, match="already loaded"):
        registry.add("x", str(tmp_path))
    with pytest.raises(LoRAError, match="adapter_config.json is missing"):
        registry.add("y", str(tmp_path))
    assert registry.get("x") == ref and [r.name for r in registry.adapters()] == ["x"]
    assert registry.remove("x") == ref
    with pytest.raises(LoRAError, match=r"no LoRA adapter named 'x' is loaded \(loaded: none\)"):
        registry.get("x")
    with pytest.raises(LoRAError, match="no adapter named 'x'"):
        registry.remove("x")
    again = registry.add("x", str(path))
    assert again.adapter_id != ref.adapter_id  # registered anew: its own prefix-cache namespace
