"""Variable-length (packed) prefill attention in Triton, flash-attention style, over packed K/V or a paged cache.

Grid (query heads, query tiles): a program loads a BLOCK_M x D query tile once and streams the
sequence's keys in BLOCK_N tiles with an online float32 softmax (base 2), skipping key tiles that the
causal limit or the sliding window hide. Key tiles every row of the query tile sees whole take a loop
without masks; only the tiles on the causal diagonal, at the end of the keys or under a window are masked.
Each sequence's queries are the last q_len positions of its k_len keys (decode-after-prefix and chunked
prefill). GQA reads the query head's KV head directly. Tiles run last-first with the heads innermost: the
longest causal tiles start first, and the heads sharing a KV head read it side by side.

The query tiles are flat over the packed tokens: sequence s owns the tiles from cu_q[s] // BLOCK_M + s,
at least the cdiv(q_len, BLOCK_M) it needs, so T // BLOCK_M + N programs cover N sequences of T tokens
in all, and a program finds its sequence by a binary search of cu_seqlens on the device. The grid thus
depends only on the tensors' shapes, never on a host copy of the lengths: one launch serves every
step of a padded shape, which is what a captured prefill graph replays (runners/prefill_buffers.py);
tiles past a sequence's queries do no work, and the tiles of sequences of length 0 (padding) return after two
loads, before the search.

Paged (`paged_prefill_attention`): the keys are the sequence's context_lens[seq] cached tokens, each
row resolved through its block table inside the kernel, so a prefill chunk attends to earlier chunks
and cached prefixes without a gathered copy of the cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import (
    Launcher,
    await_inputs,
    check_paged_caches,
    dot_precision,
    interpreting,
    last_dim_contiguous,
    next_pow2,
)

_INTERPRETED = interpreting()
if _INTERPRETED:
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes and launch parameters for one (head_dim, dtype) class."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@triton.jit
def _attend_tile(q, acc, m_i, l_i, n0, q_pos, k_base, v_base, bt_ptr, seq, bt_sb, block_size, k_sb, v_sb, k_st, v_st,
                 k_start, k_len, window, qk_scale, d, d_mask, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_WINDOW: tl.constexpr, PAGED: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of the online softmax: the updated (acc, m_i, l_i). Unmasked, every column is a real key
    that every row sees."""
    cols = n0 + tl.arange(0, BLOCK_N)
    c_mask = cols < k_len
    if PAGED:
        if MASKED:
            page = tl.load(bt_ptr + seq.to(tl.int64) * bt_sb + cols // block_size, mask=c_mask, other=0)
        else:
            page = tl.load(bt_ptr + seq.to(tl.int64) * bt_sb + cols // block_size)
        in_page = (cols % block_size).to(tl.int64)
        k_off = page.to(tl.int64) * k_sb + in_page * k_st
        v_off = page.to(tl.int64) * v_sb + in_page * v_st
    else:
        k_rows = (k_start + cols).to(tl.int64)
        k_off = k_rows * k_st
        v_off = k_rows * v_st
    kv_mask = c_mask[:, None] & d_mask[None, :] if MASKED else d_mask[None, :]
    k = tl.load(k_base + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        visible = c_mask[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (q_pos[:, None] - cols[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # Rows with nothing visible yet keep m = -inf; shift them by 0 so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_base + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


# a block-table row's length follows the batch's longest context: one binary for all of them (a new
# specialization would compile for ~0.6 s in the middle of serving)
@triton.jit(do_not_specialize=["bt_sb"])
def _varlen_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    cu_q_ptr,
    cu_k_ptr,
    bt_ptr,
    ctx_ptr,
    n_seqs,
    block_size,
    k_sb,
    v_sb,
    bt_sb,
    qk_scale,
    window,
    group,
    head_dim,
    q_st,
    q_sh,
    k_st,
    k_sh,
    v_st,
    v_sh,
    o_st,
    o_sh,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    PAGED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    h = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)
    # Padding first, in two loads: past the last real sequence, tile t can only belong to sequence
    # t - total // BLOCK_M, which is padding (no tokens) exactly when its bound equals the total.
    total = tl.load(cu_q_ptr + n_seqs)
    beyond = tile - total // BLOCK_M
    if beyond >= n_seqs:
        return
    if beyond >= 0:
        if tl.load(cu_q_ptr + beyond) == total:
            return
    # the sequence owning this tile: the last s with cu_q[s] // BLOCK_M + s <= tile (s = 0 always qualifies)
    lo = tile * 0
    hi = lo + n_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        owns = tl.load(cu_q_ptr + mid) // BLOCK_M + mid <= tile
        lo = tl.where(owns, mid, lo)
        hi = tl.where(owns, hi, mid)
    seq = lo
    m_block = tile - (tl.load(cu_q_ptr + seq) // BLOCK_M + seq)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if PAGED:
        k_start = 0
        k_len = tl.load(ctx_ptr + seq)
    else:
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
    kvh = h // group

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    r_mask = rows < q_len
    d_mask = d < head_dim
    q_rows = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * q_st + h.to(tl.int64) * q_sh + d[None, :],
        mask=r_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = k_len - q_len + rows  # absolute key position of each query row

    first_pos = k_len - q_len + m_block * BLOCK_M
    hi = k_len
    if CAUSAL:
        hi = tl.minimum(hi, first_pos + BLOCK_M)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
    hi = tl.where(m_block * BLOCK_M < q_len, hi, lo)  # tiles past this sequence's queries do no work

    k_base = k_ptr + kvh.to(tl.int64) * k_sh
    v_base = v_ptr + kvh.to(tl.int64) * v_sh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # key tiles [lo, whole) are visible to every row: before the diagonal and the end of the keys, no window
    whole = lo
    if not HAS_WINDOW:
        whole = k_len // BLOCK_N * BLOCK_N
        if CAUSAL:
            whole = tl.minimum(whole, (first_pos + 1) // BLOCK_N * BLOCK_N)
        whole = tl.maximum(tl.minimum(whole, hi), lo)
    for n0 in range(lo, whole, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, n0, q_pos, k_base, v_base, bt_ptr, seq, bt_sb, block_size,
                                     k_sb, v_sb, k_st, v_st, k_start, k_len, window, qk_scale, d, d_mask, False,
                                     CAUSAL, HAS_WINDOW, PAGED, BLOCK_N, PRECISION)
    for n0 in range(whole, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, n0, q_pos, k_base, v_base, bt_ptr, seq, bt_sb, block_size,
                                     k_sb, v_sb, k_st, v_st, k_start, k_len, window, qk_scale, d, d_mask, True,
                                     CAUSAL, HAS_WINDOW, PAGED, BLOCK_N, PRECISION)

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * o_st + h.to(tl.int64) * o_sh + d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


_VARLEN_FWD = Launcher(_varlen_fwd_kernel)


def tile_config(head_dim: int, dtype: torch.dtype) -> TileConfig:
    """Fixed tiles per (head-dim class, dtype), checked spill-free for sm_90 with ptxas.

    No autotuning: its benchmarking would run on the first call, which may be inside a CUDA graph capture. The
    16-bit tiles are the fastest of eight on an H200 for a lone 1k prompt, a chunk after a cached prefix and 4 or
    16 prompts of 512, at head_dim 64 and 128 (`benchmarks/prefill_attention_tiles.py`): 64-row query tiles give a
    short prompt's few heads x tiles enough programs to fill the SMs.
    """
    if _INTERPRETED:
        return TileConfig(16, 16, 1, 1)
    if dtype == torch.float32:
        return TileConfig(64, 32, 8, 2) if head_dim <= 128 else TileConfig(32, 16, 8, 2)
    if head_dim <= 128:
        return TileConfig(64, 64, 4, 2)
    return TileConfig(64, 32, 8, 2)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    sliding_window: int | None,
    cu_seqlens_host: tuple[list[int], list[int]] | None = None,
) -> torch.Tensor:
    """Packed q [Tq, H, D], k/v [Tk, Hkv, D] with int32 cu_seqlens [N+1] -> [Tq, H, D] in query.dtype.

    No host bound is needed (the grid follows the shapes; bounds are read on the device).
    """
    del max_seqlen_q, max_seqlen_k, cu_seqlens_host
    n_tokens, n_heads, head_dim = query.shape
    n_kv_heads = key.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    if key.shape[2] != head_dim or value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit query {tuple(query.shape)}")
    query, key, value = (last_dim_contiguous(t) for t in (query, key, value))
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    n_seqs = cu_seqlens_q.shape[0] - 1
    if n_tokens == 0 or n_seqs == 0:
        return out
    _launch(query, key, value, out, cu_seqlens_q, n_kv_heads, scale, sliding_window, causal, cu_seqlens_k=cu_seqlens_k)
    return out


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_seqlen_q: int,
    max_context_len: int,
    scale: float,
    sliding_window: int | None,
    cu_seqlens_q_host: list[int] | None = None,
    context_lens_host: list[int] | None = None,
) -> torch.Tensor:
    """Packed q [T, H, D] against caches [NB, BS, Hkv, D] -> [T, H, D] in query.dtype; sequence i's queries are
    the last q_len of its context_lens[i] cached keys (causal). Host copies of the bounds are not needed."""
    del max_seqlen_q, max_context_len, cu_seqlens_q_host, context_lens_host
    n_tokens, n_heads, head_dim = query.shape
    n_kv_heads = key_cache.shape[2]
    check_paged_caches(query, key_cache, value_cache)
    query = last_dim_contiguous(query)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if n_tokens == 0 or cu_seqlens_q.shape[0] < 2:
        return out
    _launch(query, key_cache, value_cache, out, cu_seqlens_q, n_kv_heads, scale, sliding_window, True,
            block_tables=block_tables, context_lens=context_lens)
    return out


def _launch(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor, cu_seqlens_q: torch.Tensor,
    n_kv_heads: int, scale: float, sliding_window: int | None, causal: bool, *,
    cu_seqlens_k: torch.Tensor | None = None, block_tables: torch.Tensor | None = None,
    context_lens: torch.Tensor | None = None,
) -> None:
    """One launch of the kernel: packed K/V [Tk, Hkv, D] with cu_seqlens_k, or paged caches [NB, BS, Hkv, D]."""
    n_heads, head_dim = query.shape[1], query.shape[2]
    paged = block_tables is not None
    token_dim = 1 if paged else 0  # the per-token stride of K/V: inside a block, or along the packed rows
    cfg = tile_config(head_dim, query.dtype)
    n_seqs = cu_seqlens_q.shape[0] - 1
    grid = (n_heads, query.shape[0] // cfg.block_m + n_seqs)
    _VARLEN_FWD(grid,
        query,
        key,
        value,
        out,
        cu_seqlens_q,
        cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k,
        block_tables if paged else cu_seqlens_q,
        context_lens if paged else cu_seqlens_q,
        n_seqs,
        key.shape[1] if paged else 1,
        key.stride(0) if paged else 0,
        value.stride(0) if paged else 0,
        block_tables.stride(0) if paged else 0,
        scale * math.log2(math.e),
        sliding_window or 0,
        n_heads // n_kv_heads,
        head_dim,
        query.stride(0),
        query.stride(1),
        key.stride(token_dim),
        key.stride(token_dim + 1),
        value.stride(token_dim),
        value.stride(token_dim + 1),
        out.stride(0),
        out.stride(1),
        CAUSAL=causal,
        HAS_WINDOW=sliding_window is not None,
        PAGED=paged,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_D=max(16, next_pow2(head_dim)),  # tl.dot needs K >= 16
        PRECISION=dot_precision(query.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
