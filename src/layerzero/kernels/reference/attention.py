"""Attention references: dense (BSHD/BHSD), packed variable-length prefill, paged decode and paged prefill.

Semantics shared by all three: GQA (query heads grouped over KV heads), causal masking aligned
to the end of the keys, and an optional sliding window where a query at position i sees keys
j with i - window < j <= i.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _mask(q_len: int, k_len: int, causal: bool, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Boolean [q_len, k_len] mask (True = attend); None when everything is visible."""
    if not causal and window is None:
        return None
    q_pos = torch.arange(k_len - q_len, k_len, device=device).unsqueeze(1)
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        allowed &= k_pos <= q_pos
    if window is not None:
        allowed &= q_pos - k_pos < window
    return allowed


def attention_bhsd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, window: int | None
) -> torch.Tensor:
    """q: [B, H, Sq, D], k/v: [B, Hkv, Sk, D] -> [B, H, Sq, D]."""
    gqa = q.shape[1] != k.shape[1]
    if causal and window is None and q.shape[-2] == k.shape[-2]:  # no mask to build: SDPA skips the future's blocks
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    mask = _mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds_q: Sequence[int],
    bounds_k: Sequence[int],
    causal: bool,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Packed q: [Tq, H, D], k/v: [Tk, Hkv, D]; one attention per sequence between host-side bounds."""
    out = torch.empty_like(q)
    for i in range(len(bounds_q) - 1):
        qs, qe, ks, ke = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        if qe == qs:
            continue
        o = attention_bhsd(
            q[qs:qe].transpose(0, 1).unsqueeze(0),
            k[ks:ke].transpose(0, 1).unsqueeze(0),
            v[ks:ke].transpose(0, 1).unsqueeze(0),
            causal,
            scale,
            window,
        )
        out[qs:qe] = o.squeeze(0).transpose(0, 1)
    return out


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None,
    max_context_len: int,
) -> torch.Tensor:
    """One query token per sequence. q: [B, H, D]; caches [num_blocks, block_size, Hkv, D] -> [B, H, D].

    Whole blocks are gathered (up to the block holding position max_context_len - 1), so the work
    follows the longest real context of the batch, never the block tables' capacity.
    """
    block_size = key_cache.shape[1]
    tables = block_tables[:, : -(-max_context_len // block_size)].long()
    shape = (tables.shape[0], -1, *key_cache.shape[2:])  # [B, L, Hkv, D], L = blocks * block_size >= max_context_len
    k = key_cache.index_select(0, tables.flatten()).view(shape)
    v = value_cache.index_select(0, tables.flatten()).view(shape)
    pos = torch.arange(k.shape[1], device=q.device)
    ctx = context_lens.long().unsqueeze(1)
    visible = pos.unsqueeze(0) < ctx
    if window is not None:
        visible &= pos.unsqueeze(0) > ctx - 1 - window
    mask = visible[:, None, None, :]  # [B, 1, 1, L]
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k.transpose(1, 2).to(q.dtype),
        v.transpose(1, 2).to(q.dtype),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[2],
    )
    return o.squeeze(2)


def paged_prefill_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    bounds_q: Sequence[int],
    context_lens: Sequence[int],
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Packed q [T, H, D] over a paged cache: sequence i's queries are the last q_len of its context_lens[i]
    cached keys (earlier chunks and cached prefixes included), causal. Only each sequence's own blocks are read."""
    out = torch.empty_like(q)
    block_size = key_cache.shape[1]
    for i in range(len(bounds_q) - 1):
        qs, qe, ctx = bounds_q[i], bounds_q[i + 1], context_lens[i]
        if qe == qs:
            continue
        table = block_tables[i, : -(-ctx // block_size)].long()
        k = key_cache.index_select(0, table).flatten(0, 1)[:ctx].to(q.dtype)
        v = value_cache.index_select(0, table).flatten(0, 1)[:ctx].to(q.dtype)
        o = attention_bhsd(
            q[qs:qe].transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            True, scale, window,
        )
        out[qs:qe] = o.squeeze(0).transpose(0, 1)
    return out
