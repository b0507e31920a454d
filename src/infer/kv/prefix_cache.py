"""Prefix cache: a radix tree of full KV blocks keyed by their token ids, with reference counts and LRU eviction.

A node is one full block: the path from the root spells the tokens of every position before it, so
two requests share a block exactly when their first (k + 1) * block_size tokens agree. Requests hold
references to the nodes they read; a node nobody references stays cached (its block allocated to the
cache) until the allocator needs blocks, then unreferenced leaves go first, least recently used first.
Invariant: a referenced node's ancestors are referenced too (requests hold whole chains), so evicting
unreferenced leaves never orphans a referenced block.

Each namespace (a LoRA adapter's id; 0 the base model) has its own root: blocks computed under one adapter are never
matched by another's requests, since the same tokens give other KV there.

Eviction order is an ordered dict of the evictable leaves, least recently used first: each update is O(1),
so a full cache costs the host a few dict operations per block it hands out again (docs/engine.md).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)  # slots: no per-node __dict__ for the garbage collector to walk
class BlockNode:
    """One cached full block."""

    tokens: tuple[int, ...]
    block: int
    parent: BlockNode | None
    children: dict[tuple[int, ...], BlockNode] = field(default_factory=dict)
    refs: int = 0


class PrefixCache:
    """The tree, its references and its eviction order; block ids come from and go back to the caller."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._roots: dict[int, BlockNode] = {0: BlockNode((), -1, None)}  # namespace -> its root
        self._leaves: OrderedDict[BlockNode, None] = OrderedDict()  # unreferenced childless nodes, LRU first
        self.num_cached = 0  # nodes in the tree
        self.num_unreferenced = 0  # of which evictable (refs == 0)

    def _root(self, namespace: int) -> BlockNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = BlockNode((), -1, None)
        return root

    def match(self, tokens: list[int], max_tokens: int, namespace: int = 0) -> list[BlockNode]:
        """The longest chain of cached full blocks in `namespace` that prefixes tokens[:max_tokens]."""
        bs, node, chain = self.block_size, self._roots.get(namespace), []
        if node is None:
            return chain
        for start in range(0, max_tokens - bs + 1, bs):
            child = node.children.get(tuple(tokens[start : start + bs]))
            if child is None:
                break
            chain.append(child)
            node = child
        return chain

    def acquire(self, chain: list[BlockNode]) -> None:
        for node in chain:
            if node.refs == 0:
                self.num_unreferenced -= 1
                self._leaves.pop(node, None)
            node.refs += 1

    def release(self, chain: list[BlockNode]) -> None:
        """Drop one reference to each node of a chain; its unreferenced leaf becomes the most recently used."""
        for node in reversed(chain):
            node.refs -= 1
            if node.refs < 0:
                raise RuntimeError(f"prefix-cache block {node.block} released more often than acquired")
            if node.refs == 0:
                self.num_unreferenced += 1
                if not node.children:
                    self._leaves[node] = None

    def insert(self, parent: BlockNode | None, keys: list[tuple[int, ...]], blocks: list[int],
               namespace: int = 0) -> list[BlockNode]:
        """Cache a writer's consecutive full blocks (`blocks[i]` holding `keys[i]`) under `parent` (None: the root of
        `namespace`),
        each referenced once by the writer: their nodes, in order. Where a prefix is cached already under another
        block, the writer references that node instead (its block differs from the one given; the caller keeps
        its own block) and the blocks after it go beneath it."""
        node = parent or self._root(namespace)
        nodes = []
        for key, block in zip(keys, blocks):
            existing = node.children.get(key)
            if existing is None:
                child = node.children[key] = BlockNode(key, block, node, refs=1)
                self.num_cached += 1
            else:
                child = existing
                if child.refs == 0:
                    self.num_unreferenced -= 1
                    self._leaves.pop(child, None)
                child.refs += 1
            nodes.append(child)
            node = child
        return nodes

    def nodes(self) -> list[BlockNode]:
        """Every cached node (audits and tests)."""
        out, stack = [], [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, count: int) -> list[int]:
        """Drop up to `count` least recently used unreferenced leaves; their block ids (fewer when fewer are
        evictable). A parent left childless and unreferenced goes first in line: chains are acquired and released
        whole, so it was last used when the leaf just dropped was, before every other leaf."""
        blocks: list[int] = []
        while len(blocks) < count and self._leaves:
            node, _ = self._leaves.popitem(last=False)
            parent = node.parent
            assert parent is not None
            del parent.children[node.tokens]
            node.parent = None
            blocks.append(node.block)
            if parent.parent is not None and parent.refs == 0 and not parent.children:  # not a root
                self._leaves[parent] = None
                self._leaves.move_to_end(parent, last=False)
        self.num_cached -= len(blocks)
        self.num_unreferenced -= len(blocks)
        return blocks
