"""KV-cache store in Triton: scatter key/value [T, Hkv, D] into paged caches at flat slots.

One program per (token, block of heads) writes that token's K and V rows. Tokens whose slot is
negative (padding in a captured CUDA graph) write nothing; no host round trip is needed to skip them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, last_dim_contiguous, next_pow2

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    n_heads,
    head_dim,
    block_size,
    k_st,
    k_sh,
    v_st,
    v_sh,
    kc_sb,
    kc_ss,
    kc_sh,
    vc_sb,
    vc_ss,
    vc_sh,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    mask = (slot >= 0) & (heads < n_heads)[:, None] & (d < head_dim)[None, :]
    block = slot // block_size
    offset = slot % block_size
    k = tl.load(k_ptr + t * k_st + heads[:, None] * k_sh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * v_st + heads[:, None] * v_sh + d[None, :], mask=mask)
    kc = kc_ptr + block * kc_sb + offset * kc_ss + heads[:, None] * kc_sh + d[None, :]
    vc = vc_ptr + block * vc_sb + offset * vc_ss + heads[:, None] * vc_sh + d[None, :]
    tl.store(kc, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(vc_ptr.dtype.element_ty), mask=mask)


_STORE_KV = Launcher(_store_kv_kernel)


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into caches [NB, BS, Hkv, D] at slot = block * BS + offset; slots < 0 are skipped."""
    n_tokens, n_heads, head_dim = key.shape
    if value.shape != key.shape or key_cache.shape[2:] != (n_heads, head_dim) or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"key/value {tuple(key.shape)} do not fit caches {tuple(key_cache.shape)} / {tuple(value_cache.shape)}"
        )
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("KV caches must be contiguous in their last dimension (they are written in place)")
    if n_tokens == 0:
        return
    key, value = last_dim_contiguous(key), last_dim_contiguous(value)
    block_d = next_pow2(head_dim)
    block_h = min(next_pow2(n_heads), max(1, 2048 // block_d))
    _STORE_KV((n_tokens, triton.cdiv(n_heads, block_h)),
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        n_heads,
        head_dim,
        key_cache.shape[1],
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=4,
    )
