"""Per-request block tables over one allocator, optionally sharing full blocks through the prefix cache."""

from __future__ import annotations

import numpy as np

from infer.kv.block_allocator import BlockAllocator
from infer.kv.prefix_cache import BlockNode, PrefixCache

CACHE_OWNER = "<prefix-cache>"  # the allocator's owner of every block the prefix cache holds


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Owns block accounting for every live request. Contiguous mode is block_size = max_seq_len.

    With prefix caching, a request's table starts with the cached blocks it matched at admission;
    its own full blocks join the cache once computed (`publish`), and unreferenced cached blocks count
    as free: allocation evicts them, least recently used first, when the free list is empty.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.prefix = PrefixCache(block_size) if prefix_caching else None
        self._tables: dict[str, list[int]] = {}
        self._chains: dict[str, list[BlockNode]] = {}  # cached blocks a request references, from the start
        self.prefix_queries = 0  # prompt tokens looked up at admission
        self.prefix_hits = 0  # of which found in the cache
        self._lookups: dict[str, tuple[int, int]] = {}  # (queried, hit) of an admission not yet given blocks
        self._namespaces: dict[str, int] = {}  # a request's prefix-cache namespace (its LoRA adapter), when not 0

    @property
    def num_free_blocks(self) -> int:
        evictable = self.prefix.num_unreferenced if self.prefix is not None else 0
        return self.allocator.num_free + evictable

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def blocks_for(self, request_id: str, num_tokens: int) -> int:
        """How many more blocks the request needs to hold num_tokens tokens."""
        have = len(self._tables.get(request_id, ()))
        return max(0, blocks_needed(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request can grow to num_tokens cached tokens with the blocks free now."""
        return self.blocks_for(request_id, num_tokens) <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Grow the request's table to hold num_tokens tokens (all or nothing)."""
        if not self.can_allocate(request_id, num_tokens):
            raise MemoryError(f"not enough free KV blocks for {request_id!r} to hold {num_tokens} tokens")
        queried, hit = self._lookups.pop(request_id, (0, 0))  # a lookup counts once the request gets its blocks
        self.prefix_queries += queried
        self.prefix_hits += hit
        table = self._tables.setdefault(request_id, [])
        need = blocks_needed(num_tokens, self.block_size) - len(table)
        short = need - self.allocator.num_free
        if short > 0 and self.prefix is not None:  # can_allocate vouched that enough are evictable
            evicted = self.prefix.evict(short)
            self.allocator.reassign_many(evicted, CACHE_OWNER, request_id)
            table.extend(self.allocator.allocate_many(request_id, need - len(evicted)))
            table.extend(evicted)
        else:
            table.extend(self.allocator.allocate_many(request_id, need))

    def admit(self, request_id: str, tokens: list[int], max_tokens: int, namespace: int = 0) -> int:
        """Start the request's table with the longest cached prefix of tokens[:max_tokens] in `namespace` (a LoRA
        adapter's id: the KV an adapter computed serves only that adapter; 0 the base model); tokens matched."""
        if self.prefix is None:
            return 0
        if namespace:
            self._namespaces[request_id] = namespace
        chain = self.prefix.match(tokens, max_tokens, namespace)
        self.prefix.acquire(chain)
        self._chains[request_id] = chain
        self._tables[request_id] = [node.block for node in chain]
        self._lookups[request_id] = (len(tokens), len(chain) * self.block_size)
        return len(chain) * self.block_size

    def publishable(self, request_id: str, num_computed: int) -> bool:
        """Whether `publish` would cache a block: a full block past the ones the request already references."""
        return self.prefix is not None and num_computed // self.block_size > len(self._chains.get(request_id, ()))

    def publish(self, request_id: str, tokens: list[int], num_computed: int) -> None:
        """Cache the request's full blocks among its first num_computed positions (tokens known on the host).

        A block whose prefix is cached already under another block stays the request's own; the request
        references the cached node instead, so the blocks after it can still be published beneath it.
        """
        if self.prefix is None:
            return
        chain, table, bs = self._chains.setdefault(request_id, []), self._tables[request_id], self.block_size
        first, end = len(chain), num_computed // bs
        if first >= end:
            return
        keys = [tuple(tokens[i : i + bs]) for i in range(first * bs, end * bs, bs)]
        written = table[first:end]
        nodes = self.prefix.insert(chain[-1] if chain else None, keys, written, self._namespaces.get(request_id, 0))
        chain.extend(nodes)
        if nodes[0].block != written[0]:  # a prefix was cached already (a new node has no children: the rest are new)
            written = [b for node, b in zip(nodes, written) if node.block == b]
        self.allocator.reassign_many(written, request_id, CACHE_OWNER)

    def slots(self, request_id: str, start: int, count: int) -> np.ndarray:
        """Flat cache slots (block * block_size + offset) of positions [start, start + count), int64."""
        bs = self.block_size
        positions = np.arange(start, start + count)
        blocks = np.array(self._tables[request_id][start // bs : -(-(start + count) // bs)], dtype=np.int64)
        return blocks[positions // bs - start // bs] * bs + positions % bs

    def shrink(self, request_id: str, num_tokens: int) -> None:
        """Give back the request's blocks past those holding its first num_tokens positions (rolled-back drafts).
        Only blocks it owns are past them: cached blocks hold known tokens, which come first."""
        table = self._tables[request_id]
        keep = max(blocks_needed(num_tokens, self.block_size), len(self._chains.get(request_id, ())))
        while len(table) > keep:
            self.allocator.free(table.pop(), request_id)

    def free(self, request_id: str) -> None:
        """Release the request's references and free the blocks it owns."""
        self._lookups.pop(request_id, None)
        self._namespaces.pop(request_id, None)
        chain = self._chains.pop(request_id, [])
        if self.prefix is not None:
            self.prefix.release(chain)
        for i, block in enumerate(self._tables.pop(request_id, [])):
            if i >= len(chain) or chain[i].block != block:
                self.allocator.free(block, request_id)

    def reset_prefix_cache(self) -> None:
        """Drop every unreferenced cached block and zero the hit counters (after the start-up warm-up)."""
        if self.prefix is not None:
            self.allocator.free_many(self.prefix.evict(self.prefix.num_cached), CACHE_OWNER)
        self.prefix_queries = self.prefix_hits = 0

    def audit_blocks(self) -> dict[int, str]:
        """Blocks held by requests or still referenced in the prefix cache: empty once every request is gone."""
        held = {b: o for b, o in self.allocator.audit_blocks().items() if o != CACHE_OWNER}
        if self.prefix is not None:
            held |= {n.block: f"{CACHE_OWNER} ({n.refs} refs)" for n in self.prefix.nodes() if n.refs}
        return held
