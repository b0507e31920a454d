"""The paged KV cache: block ids and slots range-checked on the host once per step, keys written through the slot
mapping into the one cache array pair, attention read through block tables equal to dense causal attention."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

from infer.runners.mlx.attention import BlockRangeError, paged_attention, step_layout
from infer.runners.step import StepInput, StepKind
from layerzero.kernels.reference.attention import _mask

BLOCKS, BS, KV, H, D = 12, 4, 2, 4, 8


def _step(query_lens: list[int], context_lens: list[int], tables: list[list[int]]) -> StepInput:
    positions = [p for q, c in zip(query_lens, context_lens) for p in range(c - q, c)]
    slots = [tables[i][p // BS] * BS + p % BS for i, (q, c) in enumerate(zip(query_lens, context_lens))
             for p in range(c - q, c)]
    return StepInput(StepKind.PREFILL, token_ids=[0] * len(positions), positions=positions, query_lens=query_lens,
                     context_lens=context_lens, slot_mapping=slots, block_tables=tables)


@pytest.mark.parametrize("bad", ["block", "slot", "short_table"])
def test_out_of_range_ids_are_refused_on_the_host(bad: str) -> None:
    step = _step([3], [3], [[1]])
    if bad == "block":
        step.block_tables = [[BLOCKS]]
    elif bad == "slot":
        step.slot_mapping = [0, 1, BLOCKS * BS]
    else:
        step.context_lens = [9]  # needs 3 blocks; the table has 1
    with pytest.raises(BlockRangeError):
        step_layout(step, BLOCKS, BS)


@pytest.mark.parametrize("window", [None, 3])
def test_paged_attention_equals_dense_causal_attention(window: int | None) -> None:
    """Two sequences in one step: a 5-token chunk after 6 cached tokens, and a 1-token decode after 8, their blocks
    scattered over the cache; each query sees exactly its own sequence's context (and window)."""
    rng = np.random.default_rng(0)
    tables = [[7, 2, 9], [4, 0, 11]]
    cache = [mx.zeros((BLOCKS, BS, KV, D)), mx.zeros((BLOCKS, BS, KV, D))]
    qs, ks, vs = ([], [], [])
    seqs = [(0, 6, 11), (1, 8, 9)]  # (sequence, cached, context)
    for s, cached, ctx in seqs:  # the cached part first, through its own step
        q = rng.normal(size=(ctx, H, D)).astype(np.float32)
        k, v = (rng.normal(size=(ctx, KV, D)).astype(np.float32) for _ in range(2))
        qs.append(q), ks.append(k), vs.append(v)
        if cached:
            pre = step_layout(_step([cached], [cached], [tables[s]]), BLOCKS, BS)
            paged_attention(mx.array(q[:cached]), mx.array(k[:cached]), mx.array(v[:cached]), cache, pre, 0.5, window)
    layout = step_layout(_step([5, 1], [11, 9], tables), BLOCKS, BS)
    new = [(5, 11), (1, 9)]
    cat = [np.concatenate([x[c - n: c] for x, (n, c) in zip(xs, new)]) for xs in (qs, ks, vs)]
    out = np.array(paged_attention(*(mx.array(x) for x in cat), cache, layout, 0.5, window))
    rows = 0
    for (n, c), q, k, v in zip(new, qs, ks, vs):
        tq, tk, tv = (torch.from_numpy(x).transpose(0, 1) for x in (q, k, v))
        tk, tv = tk.repeat_interleave(H // KV, 0), tv.repeat_interleave(H // KV, 0)
        scores = (tq @ tk.transpose(1, 2)) * 0.5
        scores = scores.masked_fill(~_mask(c, c, True, window, torch.device("cpu")), float("-inf"))
        ref = (scores.softmax(-1) @ tv).transpose(0, 1).reshape(c, H * D)[c - n:]
        assert np.abs(out[rows: rows + n] - ref.numpy()).max() < 1e-5
        rows += n


def test_the_cache_is_written_in_place() -> None:
    """A slot-mapping write updates the cache array the runner holds (no second copy made and kept)."""
    cache = [mx.zeros((BLOCKS, BS, KV, D)), mx.zeros((BLOCKS, BS, KV, D))]
    held = cache[0]
    layout = step_layout(_step([1], [1], [[5]]), BLOCKS, BS)
    paged_attention(mx.ones((1, H, D)), mx.ones((1, KV, D)), mx.ones((1, KV, D)), cache, layout, 1.0, None)
    assert held is cache[0] and float(held[5, 0].sum()) == KV * D and float(held.sum()) == KV * D
