"""Per-request block tables over one allocator: slots for new tokens, release, capacity queries."""

from __future__ import annotations

from infer.kv.block_allocator import BlockAllocator


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Owns block accounting for every live request. Contiguous mode is block_size = max_seq_len."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def blocks_for(self, request_id: str, num_tokens: int) -> int:
        """How many more blocks the request needs to hold num_tokens tokens."""
        have = len(self._tables.get(request_id, ()))
        return max(0, blocks_needed(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request can grow to num_tokens cached tokens with the blocks free now."""
        return self.blocks_for(request_id, num_tokens) <= self.allocator.num_free

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Grow the request's table to hold num_tokens tokens (all or nothing)."""
        if not self.can_allocate(request_id, num_tokens):
            raise MemoryError(f"not enough free KV blocks for {request_id!r} to hold {num_tokens} tokens")
        table = self._tables.setdefault(request_id, [])
        while len(table) < blocks_needed(num_tokens, self.block_size):
            table.append(self.allocator.allocate(request_id))

    def slots(self, request_id: str, start: int, count: int) -> list[int]:
        """Flat cache slots (block * block_size + offset) of positions [start, start + count)."""
        table, bs = self._tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, start + count)]

    def free(self, request_id: str) -> None:
        for block in self._tables.pop(request_id, []):
            self.allocator.free(block, request_id)

    def audit_blocks(self) -> dict[int, str]:
        return self.allocator.audit_blocks()
