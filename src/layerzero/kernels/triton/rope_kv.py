"""The attention prologue in one Triton kernel: optional QK-norm, RoPE of the q and k heads, K/V store.

Grid: one program per (token, block of q-and-k heads); the token's cos/sin row and slot are loaded once. A q head
is normalized (optionally), rotated and written to the new q; a k head is normalized, rotated and written to the
key cache at the token's slot together with its v head, copied to the value cache (slot < 0: nothing written).
qkv may be a strided [T, H + 2*Hkv, D] view of the QKV projection. Launch parameters are fixed (no autotune): the
first call may come inside a CUDA-graph capture.

`rope_store_kv_splitk` takes the QKV projection too (a decode step's few rows): the split-K GEMV writes its float32
slices (gemv.splitk_partials) and this kernel sums them where it reads qkv, rounded to x's dtype as the sum kernel
would, so no sum kernel runs between the projection and the prologue. Those reads are SPLITS x qkv's bytes, so its
programs take PARTIAL_HEADS heads each, not 2048 // D.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.reference.rope_store_kv import check_projection, projected, split_heads
from layerzero.kernels.triton.gemv import projected_at, splitk_partials
from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, last_dim_contiguous, next_pow2
from layerzero.kernels.triton.rope import rope_angles
from layerzero.kernels.triton.specs import FUSED_SPLITK_TILE

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

PARTIAL_HEADS = 4  # heads a program takes from a projection's split-K partials


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    out_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    n_heads,
    n_kv_heads,
    half,
    block_size,
    x_st,
    x_sh,
    x_slice,
    cos_st,
    sin_st,
    kc_sb,
    kc_ss,
    kc_sh,
    vc_sb,
    vc_ss,
    vc_sh,
    eps,
    w_offset,
    SLICES: tl.constexpr,
    HAS_NORM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    # before the wait: the step's rope rows and slots (gathered at the step's start) and the norm weights, which
    # no kernel of this layer writes (launch.py); qkv, the previous kernel's output, after it
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    c, s, i1, i2, jm = rope_angles(cos_ptr, sin_ptr, t, cos_st, sin_st, half, INTERLEAVED, BLOCK_D)
    is_q = heads < n_heads
    is_k = (heads >= n_heads) & (heads < n_heads + n_kv_heads)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if HAS_NORM:
        wq1 = tl.load(qw_ptr + i1, mask=jm, other=0.0).to(tl.float32)[None, :]
        wq2 = tl.load(qw_ptr + i2, mask=jm, other=0.0).to(tl.float32)[None, :]
        wk1 = tl.load(kw_ptr + i1, mask=jm, other=0.0).to(tl.float32)[None, :]
        wk2 = tl.load(kw_ptr + i2, mask=jm, other=0.0).to(tl.float32)[None, :]
    await_inputs(PDL)
    mask = (is_q | is_k)[:, None] & jm[None, :]
    k_mask = (slot >= 0) & is_k[:, None] & jm[None, :]
    dtype = out_ptr.dtype.element_ty  # qkv's, or with split-K partials the projection's
    x_at = t * x_st + heads[:, None] * x_sh
    v_at = x_at + n_kv_heads * x_sh  # v head h of the cache sits n_kv_heads heads after k head h in qkv
    x1 = projected_at(qkv_ptr, x_at + i1[None, :], mask, x_slice, SLICES, dtype).to(tl.float32)
    x2 = projected_at(qkv_ptr, x_at + i2[None, :], mask, x_slice, SLICES, dtype).to(tl.float32)
    # with q and k: loads after a store would wait for it
    v1 = projected_at(qkv_ptr, v_at + i1[None, :], k_mask, x_slice, SLICES, dtype)
    v2 = projected_at(qkv_ptr, v_at + i2[None, :], k_mask, x_slice, SLICES, dtype)
    if HAS_NORM:
        # rms_norm of each head row, rounded to the input dtype as the unfused norm's output is before rope
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)
        w1 = tl.where(is_q[:, None], wq1, wk1) + w_offset
        w2 = tl.where(is_q[:, None], wq2, wk2) + w_offset
        x1 = (x1 * rstd[:, None] * w1).to(dtype).to(tl.float32)
        x2 = (x2 * rstd[:, None] * w2).to(dtype).to(tl.float32)
    o1 = (x1 * c - x2 * s).to(dtype)
    o2 = (x2 * c + x1 * s).to(dtype)

    q_mask = is_q[:, None] & jm[None, :]
    q_base = out_ptr + (t * n_heads + heads[:, None]) * (2 * half)
    tl.store(q_base + i1[None, :], o1, mask=q_mask)
    tl.store(q_base + i2[None, :], o2, mask=q_mask)

    block = slot // block_size
    offset = slot % block_size
    kv_heads = heads[:, None] - n_heads
    kc = kc_ptr + block * kc_sb + offset * kc_ss + kv_heads * kc_sh
    tl.store(kc + i1[None, :], o1.to(kc_ptr.dtype.element_ty), mask=k_mask)
    tl.store(kc + i2[None, :], o2.to(kc_ptr.dtype.element_ty), mask=k_mask)
    vc = vc_ptr + block * vc_sb + offset * vc_ss + kv_heads * vc_sh
    tl.store(vc + i1[None, :], v1.to(vc_ptr.dtype.element_ty), mask=k_mask)
    tl.store(vc + i2[None, :], v2.to(vc_ptr.dtype.element_ty), mask=k_mask)


_ROPE_STORE_KV = Launcher(_rope_store_kv_kernel)


def rope_store_kv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
    proj: torch.Tensor | None = None, *, num_heads: int, eps: float, weight_offset: float, interleaved: bool,
) -> torch.Tensor:
    """Norm (optional) and rotate qkv's q and k heads, store k and v at their slots; returns q [T, H, D]. With `proj`,
    qkv is x [T, K], projected first by lz.linear."""
    qkv = last_dim_contiguous(projected(qkv, proj, key_cache))
    split_heads(qkv, key_cache, num_heads)
    return _launch(qkv, qkv.shape[0], qkv.dtype, (qkv.stride(0), qkv.stride(1), 0, 0), cos, sin, key_cache, value_cache,
                   slot_mapping, q_norm_weight, k_norm_weight, num_heads, eps, weight_offset, interleaved)


def rope_store_kv_splitk(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None,
    proj: torch.Tensor, *, num_heads: int, eps: float, weight_offset: float, interleaved: bool,
) -> torch.Tensor:
    """lz.rope_store_kv with its QKV projection for a decode step's few tokens: x [T, K] through the split-K GEMV
    (FUSED_SPLITK_TILE), whose float32 slices this prologue sums where it reads them (no sum kernel between)."""
    head_dim, heads = key_cache.shape[3], check_projection(x, proj, key_cache)
    partials = splitk_partials(x, proj, FUSED_SPLITK_TILE)  # [SPLITS, T, N] float32
    split_heads(partials[0].view(x.shape[0], heads, head_dim), key_cache, num_heads)
    slices, tokens, n = partials.shape
    return _launch(partials, tokens, x.dtype, (n, head_dim, tokens * n, slices), cos, sin, key_cache, value_cache,
                   slot_mapping, q_norm_weight, k_norm_weight, num_heads, eps, weight_offset, interleaved)


def _launch(rows: torch.Tensor, n_tokens: int, dtype: torch.dtype, layout: tuple[int, int, int, int], cos: torch.Tensor,
            sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
            q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None, num_heads: int, eps: float,
            weight_offset: float, interleaved: bool) -> torch.Tensor:
    """The prologue over `rows` of n_tokens: qkv in `dtype`, or a projection's split-K partials; `layout`: (token
    stride, head stride, slice stride, slices), slices 0 for qkv."""
    head_dim, (token_stride, head_stride, slice_stride, slices) = key_cache.shape[3], layout
    n_kv_heads, half = key_cache.shape[2], head_dim // 2
    if head_dim % 2 or cos.shape != (n_tokens, half) or sin.shape != (n_tokens, half):
        raise ValueError(f"cos/sin must be [T, D/2] = [{n_tokens}, {half}] for {n_tokens} tokens of head dim "
                         f"{head_dim}")
    if value_cache.shape != key_cache.shape or key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError(f"caches {tuple(key_cache.shape)} / {tuple(value_cache.shape)} must match and be contiguous "
                         "in their last dimension (they are written in place)")
    has_norm = q_norm_weight is not None and k_norm_weight is not None
    if (q_norm_weight is None) != (k_norm_weight is None) or (
            has_norm and (q_norm_weight.shape != (head_dim,) or k_norm_weight.shape != (head_dim,))):
        raise ValueError(f"QK-norm weights must both be [{head_dim}] or both None")
    cos, sin = last_dim_contiguous(cos), last_dim_contiguous(sin)
    out = torch.empty(n_tokens, num_heads, head_dim, dtype=dtype, device=rows.device)
    if n_tokens == 0:
        return out
    qw = q_norm_weight.contiguous() if has_norm else cos  # any tensor: unread without the norm
    kw = k_norm_weight.contiguous() if has_norm else cos
    block_d = next_pow2(half)
    # a projection's partials are SPLITS x the bytes of qkv: fewer heads a program, more programs to read them
    block_h = min(next_pow2(num_heads + n_kv_heads), PARTIAL_HEADS if slices else max(1, 2048 // block_d))
    _ROPE_STORE_KV((n_tokens, triton.cdiv(num_heads + n_kv_heads, block_h)),
        rows,
        cos,
        sin,
        qw,
        kw,
        out,
        key_cache,
        value_cache,
        slot_mapping,
        num_heads,
        n_kv_heads,
        half,
        key_cache.shape[1],
        token_stride,
        head_stride,
        slice_stride,
        cos.stride(0),
        sin.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        float(eps),
        float(weight_offset),
        SLICES=slices,
        HAS_NORM=has_norm,
        INTERLEAVED=interleaved,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=8,  # 0.2 µs a call faster than 4 at 1 and at 256 tokens (H100, a 64 x 32 tile of heads)
    )
    return out
