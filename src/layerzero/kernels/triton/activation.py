"""Gated activations in Triton: act(x[..., :I]) * x[..., I:] for SiLU and GeLU (tanh or erf), float32 math.

Grid: one program per (row, block of I columns); gate and up halves are read once, the product
written once (the reference materializes act(gate) in between).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, last_dim_contiguous, next_pow2

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

_MAX_BLOCK = 1024


@triton.jit
def _gated_kernel(x_ptr, out_ptr, n_inner, x_stride, ACT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_inner
    x_row = x_ptr + row * x_stride
    g = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_row + n_inner + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == "gelu":
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        # silu(g) = g * sigmoid(g); gelu_tanh(g) = g * sigmoid(2z) since 0.5 * (1 + tanh(z)) == sigmoid(2z),
        # z = sqrt(2/pi) * (g + 0.044715 g^3). exp only of -|arg|: no overflow to inf.
        arg = g if ACT == "silu" else 1.5957691216057308 * (g + 0.044715 * g * g * g)
        e = tl.exp(-tl.abs(arg))
        a = g * tl.where(arg >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    tl.store(out_ptr + row * n_inner + cols, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


_GATED = Launcher(_gated_kernel)


def _gated(x: torch.Tensor, act: str) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"the last dim of a gated activation's input must be even, got {x.shape[-1]}")
    n_inner = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], n_inner), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = last_dim_contiguous(x).reshape(-1, x.shape[-1])
    block = min(next_pow2(n_inner), _MAX_BLOCK)
    _GATED((x2.shape[0], triton.cdiv(n_inner, block)),
        x2, out, n_inner, x2.stride(0), ACT=act, BLOCK=block, num_warps=4
    )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] -> [..., I] in x.dtype."""
    return _gated(x, "silu")


def gelu_and_mul(x: torch.Tensor, *, approximate: str) -> torch.Tensor:
    """gelu(x[..., :I], approximate) * x[..., I:] with approximate "tanh" or "none"."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return _gated(x, "gelu_tanh" if approximate == "tanh" else "gelu")
