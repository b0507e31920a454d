"""Attention over the engine-owned paged KV cache in MLX.

The cache is one array pair per layer, [num_blocks, block_size, kv_heads, head_dim], the only copy there is. A step
writes its new keys and values through the slot mapping (a scatter MLX does in place: the runner holds the only
reference to the cache array) and reads each sequence's context through its block table (a gather of the step's
blocks, transient, for `mx.fast.scaled_dot_product_attention`). Queries are laid out [seqs, longest query] so one
call serves prefill chunks, cached prefixes, decode rows and mixed steps; the mask keeps each query's causal window
(and Gemma's sliding window) inside its own sequence's context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from infer.runners.step import StepInput, block_table_array


class BlockRangeError(ValueError):
    """A step names a KV block or slot outside the cache."""


@dataclass
class StepLayout:
    """One step's attention metadata, made on the host once per step and shared by every layer."""

    positions: mx.array  # [T] int32
    slot_blocks: mx.array  # [T] int32: the block of each new token's slot
    slot_offsets: mx.array  # [T] int32: its offset in the block
    tables: mx.array  # [B, blocks] int32: each sequence's physical blocks, as many as its longest context needs
    query_pos: mx.array  # [B, Q] int32: each query's position (0 for padding)
    context_lens: mx.array  # [B] int32
    num_seqs: int
    max_query: int  # Q
    max_context: int  # L
    query_index: mx.array | None = None  # [B, Q] rows of the packed tokens (None: one token per sequence)
    output_index: mx.array | None = None  # [T] rows of the [B * Q] outputs holding the packed tokens
    last_rows: list[int] = field(default_factory=list)  # each sequence's last new token in the packed order
    _masks: dict[int | None, mx.array] = field(default_factory=dict)

    def mask(self, window: int | None) -> mx.array:
        """[B, 1, Q, L] bool: key j is visible to a query at position p when j <= p, j < its context and, in a
        sliding layer, p - j < window."""
        if window not in self._masks:
            keys = mx.arange(self.max_context, dtype=mx.int32)[None, None, :]
            pos = self.query_pos[:, :, None]
            visible = (keys <= pos) & (keys < self.context_lens[:, None, None])
            if window is not None:
                visible = visible & (pos - keys < window)
            self._masks[window] = visible[:, None]
        return self._masks[window]


def step_layout(step: StepInput, num_blocks: int, block_size: int) -> StepLayout:
    """The layout of a step, its block ids and slots range-checked here, once, on the host."""
    lens = [int(n) for n in step.query_lens]
    n, longest = len(lens), max(lens)
    contexts = np.asarray(step.context_lens, dtype=np.int64)
    widest = int(contexts.max())
    need = -(-widest // block_size)
    tables = block_table_array(step.block_tables).astype(np.int64)[:, :need]
    slots = np.asarray(step.slot_mapping, dtype=np.int64)
    if tables.shape[1] < need:
        raise BlockRangeError(f"block tables have {tables.shape[1]} columns; a context of {widest} needs {need}")
    if tables.size and (tables.min() < 0 or tables.max() >= num_blocks):
        raise BlockRangeError(f"a block table names a block outside 0..{num_blocks - 1}")
    if slots.size and (slots.min() < 0 or slots.max() >= num_blocks * block_size):
        raise BlockRangeError(f"the slot mapping names a slot outside 0..{num_blocks * block_size - 1}")
    positions = np.asarray(step.positions, dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    layout = StepLayout(
        positions=mx.array(positions), slot_blocks=mx.array((slots // block_size).astype(np.int32)),
        slot_offsets=mx.array((slots % block_size).astype(np.int32)), tables=mx.array(tables.astype(np.int32)),
        query_pos=mx.array(positions[:n].reshape(n, 1)), context_lens=mx.array(contexts.astype(np.int32)),
        num_seqs=n, max_query=longest, max_context=widest, last_rows=(starts[1:] - 1).tolist(),
    )
    if longest > 1:  # pad each sequence's queries to the longest; padding repeats row 0 at position 0
        j = np.arange(longest)[None, :]
        inside = j < np.asarray(lens)[:, None]
        index = np.where(inside, starts[:-1, None] + j, 0)
        layout.query_index = mx.array(index.astype(np.int32))
        layout.query_pos = mx.array(np.where(inside, positions[index], 0).astype(np.int32))
        seq = np.repeat(np.arange(n), lens)
        layout.output_index = mx.array((seq * longest + np.arange(len(seq)) - starts[seq]).astype(np.int32))
    return layout


def paged_attention(q: mx.array, k: mx.array, v: mx.array, cache: list[mx.array], layout: StepLayout, scale: float,
                    window: int | None) -> mx.array:
    """q [T, H, D], k and v [T, KV, D] of the step's new tokens -> [T, H * D]. `cache` is the layer's [K, V] pair,
    updated in place (the list keeps the new arrays)."""
    for i, new in enumerate((k, v)):
        cache[i][layout.slot_blocks, layout.slot_offsets] = new
    b, qn, h, d = layout.num_seqs, layout.max_query, q.shape[1], q.shape[2]

    def context(c: mx.array) -> mx.array:  # [B, KV, L, D]
        blocks = c[layout.tables]
        return blocks.reshape(b, -1, c.shape[2], c.shape[3])[:, : layout.max_context].transpose(0, 2, 1, 3)

    queries = q.reshape(b, 1, h, d) if layout.query_index is None else q[layout.query_index]
    out = mx.fast.scaled_dot_product_attention(queries.transpose(0, 2, 1, 3), context(cache[0]), context(cache[1]),
                                               scale=scale, mask=layout.mask(window))
    out = out.transpose(0, 2, 1, 3).reshape(b * qn, h * d)
    return out if layout.output_index is None else out[layout.output_index]
