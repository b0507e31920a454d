"""Paged decode attention in Triton: one query token per sequence against a block-paged KV cache.

Grid (Hkv, B, splits): a program owns one KV head of one sequence and one slice of the visible keys; a sequence's
KV heads are launched side by side, as they sit side by side in each cache block.
All query heads of the GQA group form the rows of one `tl.dot` tile, so each K/V row is read once
per group. Physical rows are resolved token by token from the block table inside the kernel (no
gathered copy of the cache). Softmax is online in float32 (base 2). With several splits, each writes
an unnormalized partial (acc, max, sum) and a second kernel merges them; the split count comes from
host ints only (batch, heads, max_context_len, SM count), so launches never read device memory.
"""

from __future__ import annotations

import math

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
    sm_count,
)

_INTERPRETED = interpreting()
if _INTERPRETED:
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

_MIN_TOKENS_PER_SPLIT = 64  # at batch 1 on short capacities: Qwen3-30B-A3B +2.1%, Llama-3.1-8B +0.8% over 128 (H200)
_MAX_SPLITS = 64
_MANY_PROGRAMS_PER_SM = 12  # 256 sequences x 8 KV heads on 132 SMs: 15.5
_SOME_PROGRAMS_PER_SM = 6  # 128 x 8: 7.8; 64 x 8 (3.9) keeps the larger tile


@triton.jit
def _kv_rows(bt_row, kc_head, vc_head, pos, p_mask, d, block_size, kc_sb, kc_ss, vc_sb, vc_ss):
    """Pointers [BLOCK_N, BLOCK_D] to the key and value rows of positions `pos` of one sequence and KV head, their
    physical blocks read from its block-table row (positions outside p_mask point at block 0)."""
    page = tl.load(bt_row + pos // block_size, mask=p_mask, other=0).to(tl.int64)
    in_page = (pos % block_size).to(tl.int64)
    return (kc_head + (page * kc_sb + in_page * kc_ss)[:, None] + d[None, :],
            vc_head + (page * vc_sb + in_page * vc_ss)[:, None] + d[None, :])


@triton.jit
def _online_softmax_step(q, k, v, p_mask, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr):
    """One tile of keys and values [BLOCK_N, BLOCK_D] (rows outside p_mask ignored) folded into the running max,
    sum and unnormalized output of the query rows q [BLOCK_G, BLOCK_D], base 2."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * qk_scale
    s = tl.where(p_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _split_span(ctx, window, num_splits, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """(first visible key, keys a split takes, splits that hold keys) of a sequence of `ctx` keys: the visible keys
    cut into num_splits chunks of whole BLOCK_N tiles, so only the first `used` hold any. The split count follows
    the step's capacity (a graph's is its bucket's), so at a short context most splits are empty: their programs
    return at once and the merge skips them."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    chunk = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    used = tl.cdiv(ctx - lo, tl.maximum(chunk, 1))
    return lo, chunk, used


# the block-table row length and the split count follow the batch: one binary for all of them (a new
# specialization would compile in the middle of serving). The tile (`_tile`) follows the batch too, in three
# variants: graph capture compiles them, and without graphs the warm-up's large decode groups do
@triton.jit(do_not_specialize=["bt_sb", "num_splits"])
def _paged_decode_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    ctx_ptr,
    out_ptr,
    acc_ptr,
    max_ptr,
    sum_ptr,
    qk_scale,
    window,
    group,
    head_dim,
    block_size,
    q_sb,
    q_sh,
    kc_sb,
    kc_ss,
    kc_sh,
    vc_sb,
    vc_ss,
    vc_sh,
    bt_sb,
    o_sb,
    o_sh,
    num_splits,
    HAS_WINDOW: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    # before the wait: the step's context lengths and block tables, and the first tile of keys and values, except the
    # newest key, which the kernel before (the K/V store) writes: earlier steps wrote the rest (launch.py)
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    lo, chunk, used = _split_span(ctx, window, num_splits, HAS_WINDOW, BLOCK_N)
    if (split > 0) & (split >= used):
        return  # past the keys: the merge reads `used` splits only (split 0 always runs and waits, launch.py)
    start = lo + split * chunk
    end = tl.minimum(start + chunk, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * group + g
    g_mask = g < group
    d_mask = d < head_dim
    kc_head = kc_ptr + kvh.to(tl.int64) * kc_sh
    vc_head = vc_ptr + kvh.to(tl.int64) * vc_sh
    bt_row = bt_ptr + b.to(tl.int64) * bt_sb
    pos = start + tl.arange(0, BLOCK_N)
    p_mask = pos < end
    k_rows, v_rows = _kv_rows(bt_row, kc_head, vc_head, pos, p_mask, d, block_size, kc_sb, kc_ss, vc_sb, vc_ss)
    older = (p_mask & (pos < ctx - 1))[:, None] & d_mask[None, :]
    k = tl.load(k_rows, mask=older, other=0.0)
    v = tl.load(v_rows, mask=older, other=0.0)
    await_inputs(PDL)
    q = tl.load(
        q_ptr + b.to(tl.int64) * q_sb + heads[:, None] * q_sh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    newest = (p_mask & (pos == ctx - 1))[:, None] & d_mask[None, :]
    k = tl.where(newest, tl.load(k_rows, mask=newest, other=0.0), k)
    v = tl.where(newest, tl.load(v_rows, mask=newest, other=0.0), v)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    if start < end:
        m_i, l_i, acc = _online_softmax_step(q, k, v, p_mask, m_i, l_i, acc, qk_scale, PRECISION)
    for n0 in range(start + BLOCK_N, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        k_rows, v_rows = _kv_rows(bt_row, kc_head, vc_head, pos, p_mask, d, block_size, kc_sb, kc_ss, vc_sb, vc_ss)
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(k_rows, mask=kv_mask, other=0.0)
        v = tl.load(v_rows, mask=kv_mask, other=0.0)
        m_i, l_i, acc = _online_softmax_step(q, k, v, p_mask, m_i, l_i, acc, qk_scale, PRECISION)

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        n_heads = tl.num_programs(0) * group
        part = (b.to(tl.int64) * n_heads + heads) * num_splits + split
        tl.store(max_ptr + part, m_i, mask=g_mask)
        tl.store(sum_ptr + part, l_i, mask=g_mask)
        tl.store(acc_ptr + part[:, None] * head_dim + d[None, :], acc, mask=out_mask)
    else:
        # A sequence with no visible key (context_len 0, batch padding) yields zeros, not NaN.
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptrs = out_ptr + b.to(tl.int64) * o_sb + heads[:, None] * o_sh + d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=out_mask)


_PAGED_DECODE = Launcher(_paged_decode_kernel)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(
    acc_ptr,
    max_ptr,
    sum_ptr,
    out_ptr,
    ctx_ptr,
    window,
    head_dim,
    o_sb,
    o_sh,
    num_splits,
    HAS_WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    # the context length (written at the step's start) before the wait; the splits that hold keys, as the kernel
    # before cut them (BLOCK_N: its tile)
    _, _, used = _split_span(tl.load(ctx_ptr + b), window, num_splits, HAS_WINDOW, BLOCK_N)
    await_inputs(PDL)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    first = (b * tl.num_programs(1) + h) * num_splits
    held = sp < used
    m = tl.load(max_ptr + first + sp, mask=held, other=float("-inf"))
    m_all = tl.max(m, axis=0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)  # every split empty: keep exp2 finite
    w = tl.exp2(m - m_all)  # 0 for an empty split or past the last
    total = tl.sum(w * tl.load(sum_ptr + first + sp, mask=held, other=0.0), axis=0)
    # every split's partial in one load (a loop over splits waits for each one's round trip)
    acc = tl.load(acc_ptr + (first + sp)[:, None] * head_dim + d[None, :], mask=held[:, None] & d_mask[None, :],
                  other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0)
    o = o / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + b * o_sb + h * o_sh + d, o.to(out_ptr.dtype.element_ty), mask=d_mask)


_MERGE_SPLITS = Launcher(_merge_splits_kernel)


def _tile(head_dim: int, dtype: torch.dtype, programs_per_sm: float) -> tuple[int, int]:
    """(BLOCK_N keys per step, num_warps): checked spill-free for sm_90 with ptxas. With many programs per SM (a
    large decode batch) small ones read the cache faster: one 16-key block per step on one warp reads it at 0.83
    of copy bandwidth where 64 keys on 4 warps read it at 0.74 (256 sequences of 195 keys, head_dim 64, H100;
    0.88 against 0.69 for 64 keys on 8 warps at head_dim 128; benchmarks/reports/decode_attention_tiles_h100.md)."""
    if _INTERPRETED:
        return 16, 1
    if dtype == torch.float32:
        return (32, 4) if head_dim <= 64 else (16, 4)
    if head_dim <= 128 and programs_per_sm >= _MANY_PROGRAMS_PER_SM:
        return 16, 1
    if head_dim <= 64:
        return (32, 2) if programs_per_sm >= _SOME_PROGRAMS_PER_SM else (64, 4)
    if head_dim <= 128:
        return (16, 1) if programs_per_sm >= _SOME_PROGRAMS_PER_SM else (64, 8)
    return 32, 8


def choose_splits(batch: int, kv_heads: int, max_len: int, sms: int) -> int:
    """Partitions of the keys per (sequence, KV head): about two programs per SM, a capacity of at least
    _MIN_TOKENS_PER_SPLIT keys each (the kernel cuts the actual context into that many chunks)."""
    programs = batch * kv_heads
    target = 2 * sms
    if programs >= target or max_len <= _MIN_TOKENS_PER_SPLIT:
        return 1
    return max(1, min(triton.cdiv(target, programs), triton.cdiv(max_len, _MIN_TOKENS_PER_SPLIT), _MAX_SPLITS))


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    max_context_len: int,
    num_splits: int | None = None,
) -> torch.Tensor:
    """query [B, H, D] against caches [NB, BS, Hkv, D] -> [B, H, D] in query.dtype.

    context_lens [B] counts each sequence's cached tokens (the current one included); a window w
    keeps keys j with ctx - w <= j < ctx. num_splits=None picks the split count from host ints.
    """
    batch, n_heads, head_dim = query.shape
    n_kv_heads = key_cache.shape[2]
    check_paged_caches(query, key_cache, value_cache)
    query = last_dim_contiguous(query)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    group = n_heads // n_kv_heads
    visible = max_context_len if sliding_window is None else min(max_context_len, sliding_window)
    splits = num_splits or choose_splits(batch, n_kv_heads, visible, sm_count(query.device))
    block_d = max(16, next_pow2(head_dim))  # tl.dot needs K >= 16
    block_n, num_warps = _tile(head_dim, query.dtype, batch * n_kv_heads * splits / sm_count(query.device))
    if splits > 1:
        acc = torch.empty((batch, n_heads, splits, head_dim), dtype=torch.float32, device=query.device)
        row_max = torch.empty((batch, n_heads, splits), dtype=torch.float32, device=query.device)
        row_sum = torch.empty((batch, n_heads, splits), dtype=torch.float32, device=query.device)
    else:
        acc = row_max = row_sum = out
    _PAGED_DECODE((n_kv_heads, batch, splits),
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        out,
        acc,
        row_max,
        row_sum,
        scale * math.log2(math.e),
        sliding_window or 0,
        group,
        head_dim,
        key_cache.shape[1],
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        splits,
        HAS_WINDOW=sliding_window is not None,
        SPLIT=splits > 1,
        BLOCK_G=max(16, next_pow2(group)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        PRECISION=dot_precision(query.dtype),
        num_warps=num_warps,
        num_stages=2,
    )
    if splits > 1:
        _MERGE_SPLITS((batch, n_heads),
            acc,
            row_max,
            row_sum,
            out,
            context_lens,
            sliding_window or 0,
            head_dim,
            out.stride(0),
            out.stride(1),
            splits,
            HAS_WINDOW=sliding_window is not None,
            BLOCK_N=block_n,
            BLOCK_S=next_pow2(splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
