"""O(1) block allocator with owner tracking, double-free detection and leak auditing."""

from __future__ import annotations


class BlockAllocatorError(RuntimeError):
    """Misuse of the allocator: double free, foreign free, or allocation from an empty pool."""


class BlockAllocator:
    """A LIFO free list of block ids plus an owner map: allocate and free are O(1)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, owner: str) -> int:
        if not self._free:
            raise BlockAllocatorError(f"out of KV blocks ({self.num_blocks} in use) allocating for {owner!r}")
        block = self._free.pop()
        self._owner[block] = owner
        return block

    def allocate_many(self, owner: str, count: int) -> list[int]:
        """`count` blocks in the order single allocations would give them (all or nothing)."""
        if count > len(self._free):
            raise BlockAllocatorError(f"out of KV blocks ({len(self._free)} free) allocating {count} for {owner!r}")
        if count <= 0:
            return []
        blocks = self._free[-count:]
        del self._free[-count:]
        blocks.reverse()
        self._owner.update(dict.fromkeys(blocks, owner))
        return blocks

    def free_many(self, blocks: list[int], owner: str) -> None:
        for block in blocks:
            self.free(block, owner)

    def free(self, block: int, owner: str) -> None:
        held_by = self._owner.get(block)
        if held_by is None:
            if not 0 <= block < self.num_blocks:
                raise BlockAllocatorError(f"block {block} is out of range [0, {self.num_blocks})")
            raise BlockAllocatorError(f"double free of block {block} by {owner!r}")
        if held_by != owner:
            raise BlockAllocatorError(f"block {block} is owned by {held_by!r}, not {owner!r}")
        del self._owner[block]
        self._free.append(block)

    def reassign_many(self, blocks: list[int], owner: str, new_owner: str) -> None:
        """Hand allocated blocks to another owner (a request's full blocks to the prefix cache, evicted ones back to
        a request), all or nothing."""
        owners = self._owner
        for block in blocks:  # plain loops: most calls hand over one block
            if owners.get(block) != owner:
                raise BlockAllocatorError(f"block {block} is owned by {owners.get(block)!r}, not {owner!r}")
        for block in blocks:
            owners[block] = new_owner

    def audit_blocks(self) -> dict[int, str]:
        """Blocks currently allocated, with their owners: empty when every request has released its blocks."""
        return dict(self._owner)
