"""The native RoPE and KV-cache store for float32 on the CPU: one C call each instead of the dozen aten ops (casts,
chunks, products, a boolean index) the references take for a decode step's few rows; and the fused attention
prologue (QK-norm, RoPE, store) composed of those calls and the native RMSNorm."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native import norm
from layerzero.kernels.native.attention import check_caches, rows_of_heads
from layerzero.kernels.native.build import kernel
from layerzero.kernels.reference.rope_store_kv import projected, split_heads

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
ROPE_ARGS = (_P, _I64, _I64, _P, _P, _I64, _I64, _I64, ctypes.c_int, _P)
STORE_ARGS = (_P, _I64, _P, _I64, _P, _P, _P, _I64, _I64, _I64)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """x [T, H, D] (a strided view is fine); cos/sin [T, D/2] float32. Returns a new contiguous tensor."""
    if x.stride(2) != 1:
        x = x.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    tokens, heads, dim = x.shape
    out = torch.empty(tokens, heads, dim, dtype=x.dtype)
    kernel("rope", "rope", ROPE_ARGS)(x.data_ptr(), x.stride(0), x.stride(1), cos.data_ptr(), sin.data_ptr(), tokens,
                                      heads, dim, int(interleaved), out.data_ptr())
    return out


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """float32 key/value [T, Hkv, D] into float32 or bf16 caches [blocks, block_size, Hkv, D] at flat slots
    (negative: skipped)."""
    check_caches(key_cache, value_cache)
    key, value = rows_of_heads(key), rows_of_heads(value)
    slots = slot_mapping.to(torch.int64).contiguous()
    width = key_cache.shape[2] * key_cache.shape[3]
    name = "store_kv_cache_bf16" if key_cache.dtype == torch.bfloat16 else "store_kv_cache"
    status = kernel("kv_cache", name, STORE_ARGS, ctypes.c_int)(
        key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), key_cache.data_ptr(), value_cache.data_ptr(),
        slots.data_ptr(), slots.shape[0], width, key_cache.shape[0] * key_cache.shape[1])
    if status:
        slots_total = key_cache.shape[0] * key_cache.shape[1]
        raise ValueError(f"store_kv_cache: a slot lies past the cache's {slots_total} slots")


def rope_store_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                  value_cache: torch.Tensor, slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None,
                  k_norm_weight: torch.Tensor | None = None, proj: torch.Tensor | None = None, *, num_heads: int,
                  eps: float, weight_offset: float, interleaved: bool) -> torch.Tensor:
    """qkv [T, H + 2*Hkv, D] (or with `proj`, x [T, K] projected first by lz.linear): optional QK-norm, RoPE of q
    and k, k and v stored at their slots; returns q [T, H, D]."""
    qkv = projected(qkv, proj, key_cache)
    q, k, v = split_heads(qkv, key_cache, num_heads)
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("rope_store_kv takes both QK-norm weights or neither")
    if q_norm_weight is not None and k_norm_weight is not None:
        q = norm.rms_norm(q, q_norm_weight, eps=eps, weight_offset=weight_offset)
        k = norm.rms_norm(k, k_norm_weight, eps=eps, weight_offset=weight_offset)
        q, k = rope(q, cos, sin, interleaved=interleaved), rope(k, cos, sin, interleaved=interleaved)
    else:  # q and k heads are adjacent in qkv: one call rotates both (q is then a copy only for several tokens)
        qk = rope(qkv[:, : num_heads + key_cache.shape[2]], cos, sin, interleaved=interleaved)
        q, k = qk[:, :num_heads].contiguous(), qk[:, num_heads:]
    store_kv_cache(k, v, key_cache, value_cache, slot_mapping)
    return q
