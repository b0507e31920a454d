"""Block allocator and KV manager: O(1) free list, double-free detection, owner checks, leak audit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.kv.block_allocator import BlockAllocator, BlockAllocatorError
from infer.kv.kv_manager import KVCacheManager, blocks_needed


def test_allocate_free_roundtrip_and_audit():
    alloc = BlockAllocator(4)
    blocks = [alloc.allocate("a"), alloc.allocate("b")]
    assert len(set(blocks)) == 2 and alloc.num_free == 2
    assert alloc.audit_blocks() == {blocks[0]: "a", blocks[1]: "b"}
    alloc.free(blocks[0], "a")
    alloc.free(blocks[1], "b")
    assert alloc.audit_blocks() == {} and alloc.num_free == 4


def test_double_free_foreign_free_out_of_range_and_exhaustion():
    alloc = BlockAllocator(2)
    block = alloc.allocate("a")
    with pytest.raises(BlockAllocatorError, match="owned by 'a'"):
        alloc.free(block, "b")
    alloc.free(block, "a")
    with pytest.raises(BlockAllocatorError, match="double free"):
        alloc.free(block, "a")
    with pytest.raises(BlockAllocatorError, match="out of range"):
        alloc.free(7, "a")
    alloc.allocate("a"), alloc.allocate("a")
    with pytest.raises(BlockAllocatorError, match="out of KV blocks"):
        alloc.allocate("a")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=80))
def test_allocator_invariants_under_random_ops(ops):
    """Model check: allocated + free always partition the pool; no block is handed out twice."""
    alloc = BlockAllocator(8)
    held: dict[int, str] = {}
    for do_alloc, who in ops:
        owner = f"r{who}"
        if do_alloc and alloc.num_free:
            block = alloc.allocate(owner)
            assert block not in held
            held[block] = owner
        elif held:
            block = next(iter(held))
            alloc.free(block, held.pop(block))
        assert alloc.audit_blocks() == held
        assert alloc.num_free + len(held) == 8


def test_kv_manager_slots_follow_block_table():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    kv.allocate("a", 6)  # 2 blocks
    table = kv.block_table("a")
    assert len(table) == 2
    assert kv.slots("a", 3, 3).tolist() == [table[0] * 4 + 3, table[1] * 4 + 0, table[1] * 4 + 1]
    kv.allocate("a", 9)  # grows to 3 blocks, keeps the first two
    assert kv.block_table("a")[:2] == table and len(kv.block_table("a")) == 3
    assert not kv.can_allocate("b", 13)  # needs 4 blocks, 3 free
    with pytest.raises(MemoryError):
        kv.allocate("b", 13)
    assert kv.block_table("b") == []
    kv.free("a")
    assert kv.audit_blocks() == {} and kv.num_free_blocks == 6


def test_contiguous_mode_is_one_block_per_sequence():
    kv = KVCacheManager(num_blocks=2, block_size=128)
    kv.allocate("a", 100)
    kv.allocate("b", 128)
    assert len(kv.block_table("a")) == len(kv.block_table("b")) == 1
    assert not kv.can_allocate("c", 1)
    assert blocks_needed(129, 128) == 2
