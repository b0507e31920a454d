"""The native RoPE and KV-cache store for float32 on the CPU: one C call each instead of the dozen aten ops (casts,
chunks, products, a boolean index) the references take for a decode step's few rows."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.attention import check_caches, rows_of_heads
from layerzero.kernels.native.build import kernel

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
    """key/value [T, Hkv, D] into caches [blocks, block_size, Hkv, D] at flat slots (negative: skipped)."""
    check_caches(key_cache, value_cache)
    key, value = rows_of_heads(key), rows_of_heads(value)
    slots = slot_mapping.to(torch.int64).contiguous()
    width = key_cache.shape[2] * key_cache.shape[3]
    status = kernel("kv_cache", "store_kv_cache", STORE_ARGS, ctypes.c_int)(
        key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), key_cache.data_ptr(), value_cache.data_ptr(),
        slots.data_ptr(), slots.shape[0], width, key_cache.shape[0] * key_cache.shape[1])
    if status:
        slots_total = key_cache.shape[0] * key_cache.shape[1]
        raise ValueError(f"store_kv_cache: a slot lies past the cache's {slots_total} slots")
