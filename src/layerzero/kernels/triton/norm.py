"""RMSNorm and fused residual-add + RMSNorm in Triton: one program per row, float32 accumulation.

Rows are addressed as (outer, inner) pairs with their own strides, so a [T, H, D] view sliced out of a
fused QKV projection (QK-norm) is normalized in place of a copy. Rows that fit one tile stay in
registers (one read of x); longer rows take two passes over the row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, last_dim_contiguous, next_pow2

_MAX_BLOCK = 8192
if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    n_cols,
    n_inner,
    x_so,
    x_si,
    r_so,
    r_si,
    eps,
    w_offset,
    HAS_RESIDUAL: tl.constexpr,
    ONE_PASS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    outer = (row // n_inner).to(tl.int64)
    inner = (row % n_inner).to(tl.int64)
    x_row = x_ptr + outer * x_so + inner * x_si
    r_row = r_ptr + outer * r_so + inner * r_si
    out_row = out_ptr + row.to(tl.int64) * n_cols
    sum_row = sum_ptr + row.to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = cols < n_cols
        # the weight before the wait (no step writes it) and so before the sum's store, which a load after it would
        # wait for
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + w_offset
        await_inputs(PDL)
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            # The sum is rounded to its storage dtype before the norm, exactly as `x + residual` is.
            s = (x + tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_row + cols, s, mask=mask)
            x = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        await_inputs(PDL)
        sq = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                s = (x + tl.load(r_row + c, mask=mask, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
                tl.store(sum_row + c, s, mask=mask)
                x = s.to(tl.float32)
            sq += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                # Recomputed from the inputs rather than read back: no cross-thread ordering to rely on.
                r = tl.load(r_row + c, mask=mask, other=0.0).to(tl.float32)
                x = (x + r).to(sum_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32) + w_offset
            tl.store(out_row + c, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


_RMS_NORM = Launcher(_rms_norm_kernel)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """t [..., N] as rows (outer, inner): (tensor, n_inner, outer_stride, inner_stride), copying only if needed."""
    t = last_dim_contiguous(t)
    t3 = t.reshape(-1, t.shape[-2], t.shape[-1]) if t.dim() >= 2 else t.reshape(1, 1, t.shape[-1])
    return t3, t3.shape[1], t3.stride(0), t3.stride(1)


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    summed: torch.Tensor | None,
    eps: float,
    weight_offset: float,
) -> None:
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match hidden size {n_cols}")
    n_rows = x.numel() // n_cols if n_cols else 0
    if n_rows == 0:
        return
    x3, n_inner, x_so, x_si = _rows(x)
    r3, _, r_so, r_si = _rows(residual) if residual is not None else (x3, n_inner, x_so, x_si)
    block = min(next_pow2(n_cols), _MAX_BLOCK)
    _RMS_NORM((n_rows,),
        x3,
        r3,
        weight.contiguous(),
        out,
        summed if summed is not None else out,
        n_cols,
        n_inner,
        x_so,
        x_si,
        r_so,
        r_si,
        eps,
        weight_offset,
        HAS_RESIDUAL=residual is not None,
        ONE_PASS=n_cols <= block,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 16),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float, weight_offset: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * (weight + weight_offset) over the last dim; float32 math, output in x.dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, None, weight, out, None, eps, weight_offset)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) in x's dtype, x + residual in the wider dtype) in one pass (lz.fused_add_rms_norm);
    x and residual are left untouched."""
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    _launch(x, residual, weight, out, summed, eps, weight_offset)
    return out, summed
