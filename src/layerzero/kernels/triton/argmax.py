"""argmax over the last dim of x [rows, V] in Triton: the logits read once, two launches.

Stage 1, grid (rows, cdiv(V, BLOCK)): a program loads one block of a row, converts it to float32 and writes the
block's maximum and the smallest index attaining it. Stage 2, grid (rows,): the same reduction over a row's
partials, which are in block order, so the smallest index among equal maxima wins as in torch.argmax. A NaN counts
as greater than everything, so the first NaN of a row wins, also as torch.argmax. When V fits one block, stage 1
writes the answer and stage 2 is skipped. Launch parameters are fixed (no autotune): the first call may come inside
a CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, next_pow2, sm_count

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

BLOCK = 4096  # ids per stage-1 program
MIN_BLOCK = 1024  # the smallest block taken to give few rows enough programs


# sizes unspecialized: a batch size that changes the block count must not compile again in the middle of serving
@triton.jit(do_not_specialize=["V", "x_stride", "NBLOCKS"])
def _argmax_blocks_kernel(x_ptr, val_ptr, idx_ptr, V, x_stride, NBLOCKS, BLOCK: tl.constexpr,
                          WRITE_VALUE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0)
    block = tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    is_nan = x != x
    first_nan = tl.min(tl.where(is_nan, offs, V), axis=0)
    x = tl.where(is_nan, float("-inf"), x)
    best = tl.max(x, axis=0)
    first_best = tl.min(tl.where(x == best, offs, V), axis=0)  # masked lanes are >= V: a valid lane always wins
    has_nan = first_nan < V
    out = row.to(tl.int64) * NBLOCKS + block
    tl.store(idx_ptr + out, tl.where(has_nan, first_nan, first_best).to(idx_ptr.dtype.element_ty))
    if WRITE_VALUE:
        tl.store(val_ptr + out, tl.where(has_nan, float("nan"), best))


@triton.jit(do_not_specialize=["V", "NBLOCKS"])
def _argmax_partials_kernel(val_ptr, idx_ptr, out_ptr, V, NBLOCKS, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < NBLOCKS
    base = row.to(tl.int64) * NBLOCKS
    val = tl.load(val_ptr + base + offs, mask=mask, other=float("-inf"))
    idx = tl.load(idx_ptr + base + offs, mask=mask, other=V)
    is_nan = val != val
    first_nan = tl.min(tl.where(is_nan, idx, V), axis=0)
    val = tl.where(is_nan, float("-inf"), val)
    best = tl.max(val, axis=0)
    first_best = tl.min(tl.where(val == best, idx, V), axis=0)
    tl.store(out_ptr + row, tl.where(first_nan < V, first_nan, first_best).to(tl.int64))


_BLOCKS = Launcher(_argmax_blocks_kernel)
_PARTIALS = Launcher(_argmax_partials_kernel)


def block_size(rows: int, vocab: int, sms: int) -> int:
    """BLOCK, halved (down to MIN_BLOCK) while rows x blocks would not give every SM two programs; a power of two
    >= V when the row fits one block."""
    block = BLOCK
    while block > MIN_BLOCK and rows * triton.cdiv(vocab, block) < 2 * sms:
        block //= 2
    return min(block, next_pow2(vocab))


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of x [rows, V] (float32/bfloat16/float16, last dim contiguous): int64 [rows]."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax expects x [rows, V] with V >= 1, got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError("argmax: x must be contiguous in its last dimension")
    rows, vocab = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    block = block_size(rows, vocab, sm_count(x.device))
    nblocks = triton.cdiv(vocab, block)
    warps = 8 if block >= 4096 else 4
    if nblocks == 1:
        _BLOCKS((rows, 1), x, out, out, vocab, x.stride(0), 1, BLOCK=block, WRITE_VALUE=False, num_warps=warps)
        return out
    values = torch.empty((rows, nblocks), dtype=torch.float32, device=x.device)
    index = torch.empty((rows, nblocks), dtype=torch.int32, device=x.device)
    _BLOCKS((rows, nblocks), x, values, index, vocab, x.stride(0), nblocks, BLOCK=block, WRITE_VALUE=True,
            num_warps=warps)
    partials = next_pow2(nblocks)
    _PARTIALS((rows,), values, index, out, vocab, nblocks, BLOCK=partials, num_warps=4 if partials >= 512 else 1)
    return out
