"""The layerzero op surface: one explicit function per op.

Every call dispatches to the PyTorch reference today; kernel selection (which backend, and why)
plugs in behind these signatures without changing callers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from layerzero.reference import activation, attention as attn_ref, kv_cache, norm, rope as rope_ref

LAYOUTS = ("BSHD", "BHSD")


def _scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else scale


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    layout: str = "BSHD",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Dense attention over [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD); output keeps the input layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "BSHD":
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    out = attn_ref.attention_bhsd(query, key, value, causal, _scale(scale, query.shape[-1]), sliding_window)
    return out.transpose(1, 2) if layout == "BSHD" else out


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = True,
    scale: float | None = None,
    sliding_window: int | None = None,
    cu_seqlens_host: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """Packed variable-length attention: q [Tq, H, D], k/v [Tk, Hkv, D], sequences delimited by cu_seqlens.

    max_seqlen_* and cu_seqlens_host (host copies of cu_seqlens_q and cu_seqlens_k) are hints the
    caller already has on the host; with them no implementation needs to read the device tensors back.
    """
    del max_seqlen_q, max_seqlen_k  # launch-size hints for kernels; the reference does not need them
    if cu_seqlens_host is None:
        cu_seqlens_host = (cu_seqlens_q.tolist(), cu_seqlens_k.tolist())
    return attn_ref.varlen_attention(
        query, key, value, cu_seqlens_host[0], cu_seqlens_host[1], causal, _scale(scale, query.shape[-1]), sliding_window
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    max_context_len: int | None = None,
) -> torch.Tensor:
    """Decode attention over a paged cache: query [B, H, D] or [B, 1, H, D], one new token per sequence.

    block_tables [B, max_blocks] maps logical to physical blocks; context_lens [B] counts the tokens
    in cache including the current one; max_context_len (a host int) bounds the work.
    """
    squeeze = query.dim() == 4
    q = query.squeeze(1) if squeeze else query
    limit = block_tables.shape[1] * key_cache.shape[1]
    if max_context_len is not None and max_context_len > limit:
        raise ValueError(f"max_context_len={max_context_len} exceeds the block tables' capacity ({limit} tokens)")
    max_len = limit if max_context_len is None else max_context_len
    out = attn_ref.paged_attention(
        q, key_cache, value_cache, block_tables, context_lens, _scale(scale, q.shape[-1]), sliding_window, max_len
    )
    return out.unsqueeze(1) if squeeze else out


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into paged caches at flat slots (block * block_size + offset)."""
    kv_cache.store_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_offset: float = 0.0) -> torch.Tensor:
    """RMSNorm over the last dim; weight_offset=1.0 gives Gemma's x * (1 + w)."""
    return norm.rms_norm(x, weight, eps, weight_offset)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual): the residual update and the next norm in one op."""
    return norm.fused_add_rms_norm(x, residual, weight, eps, weight_offset)


def layer_norm(
    x: torch.Tensor,
    normalized_shape: tuple[int, ...],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm computed in float32."""
    return norm.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of x [T, H, D] with per-token tables cos/sin [T, D/2]."""
    return rope_ref.rope(x, cos, sin, interleaved)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: silu(x[..., :I]) * x[..., I:]."""
    return activation.silu_and_mul(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GeGLU gate: gelu(x[..., :I]) * x[..., I:]."""
    return activation.gelu_and_mul(x, approximate)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias)."""
    return F.linear(x, weight, bias)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row lookup of token ids in an embedding table."""
    return F.embedding(ids, weight)
