"""Rotary position embedding in Triton (neox half-split or GPT-J interleaved pairs), float32 rotation.

Grid: one program per (token, block of heads); the token's cos/sin row is loaded once and applied
to every head of the block. x may be a strided [T, H, D] view (e.g. sliced from a fused QKV output).
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
def rope_angles(cos_ptr, sin_ptr, t, cos_st, sin_st, half, INTERLEAVED: tl.constexpr, BLOCK_D: tl.constexpr):
    """Token t's rotation: (cos, sin) as float32 [1, BLOCK_D], the pair's element indices (i1, i2) in a head (halves,
    or interleaved pairs) and the mask of the half-dim lanes in use."""
    j = tl.arange(0, BLOCK_D)
    jm = j < half
    c = tl.load(cos_ptr + t * cos_st + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * sin_st + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    if INTERLEAVED:
        i1 = 2 * j
        i2 = 2 * j + 1
    else:
        i1 = j
        i2 = j + half
    return c, s, i1, i2, jm


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    n_heads,
    half,
    x_st,
    x_sh,
    cos_st,
    sin_st,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    c, s, i1, i2, jm = rope_angles(cos_ptr, sin_ptr, t, cos_st, sin_st, half, INTERLEAVED, BLOCK_D)
    mask = (heads < n_heads)[:, None] & jm[None, :]
    x_base = x_ptr + t * x_st + heads[:, None].to(tl.int64) * x_sh
    x1 = tl.load(x_base + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    o_base = out_ptr + (t * n_heads + heads[:, None]) * (2 * half)
    tl.store(o_base + i1[None, :], (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_base + i2[None, :], (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)


_ROPE = Launcher(_rope_kernel)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate x [T, H, D] by per-token angles (cos/sin [T, D/2]); returns a new contiguous tensor in x.dtype."""
    if x.dim() != 3:
        raise ValueError(f"rope expects x [T, H, D], got shape {tuple(x.shape)}")
    n_tokens, n_heads, head_dim = x.shape
    half = head_dim // 2
    if head_dim % 2 or cos.shape != (n_tokens, half) or sin.shape != (n_tokens, half):
        raise ValueError(f"cos/sin must be [T, D/2] = [{n_tokens}, {half}] for x {tuple(x.shape)}")
    x, cos, sin = last_dim_contiguous(x), last_dim_contiguous(cos), last_dim_contiguous(sin)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    block_d = next_pow2(half)
    block_h = min(next_pow2(n_heads), max(1, 2048 // block_d))
    _ROPE((n_tokens, triton.cdiv(n_heads, block_h)),
        x,
        cos,
        sin,
        out,
        n_heads,
        half,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        sin.stride(0),
        INTERLEAVED=interleaved,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out
