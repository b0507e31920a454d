"""All-reduce + residual add + RMSNorm in one kernel over symmetric memory: a tensor-parallel layer's closing sum
and the next norm in one launch where there were two (the all-reduce, then the fused add + RMSNorm).

One program per row. It pushes its rank's partial row into every peer's symmetric buffer (its own slot there, so no
rank ever writes another's slot), waits until every peer's row has arrived in its own buffer, sums the rows in rank
order (every rank computes the same bits), rounds the sum to x's dtype as the all-reduce would, adds the residual
and normalizes exactly as `norm.py`'s fused add + RMSNorm does.

Arrival needs no flag: a slot's elements hold an empty mark (every bit set, a NaN no sender writes: a sent NaN with
that pattern is sent as another NaN) until the peer's row lands, so the receiver polls the data itself and each
element is final once it is not the mark; after reading, the receiver sets its slot back to the mark. Against a flag
raised after the data this saves the sender's system-scope release (a wait for its NVLink writes to be acknowledged)
and the receiver's second read; the same idea as TensorRT-LLM's "Lamport" all-reduce.

The slots come in two phases: a program reads the phase from a per-row call counter (this rank's, not shared), uses
it and counts the call. Why two suffice: a program on rank A in its call n writes the phase of call n - 2 into B's
buffer. A has passed its call n - 1, which needed B's row of call n - 1; B wrote that in a kernel that started after
B's call n - 2 had completed, marks set back included. Rows of a call are independent: program p only meets program
p of the other ranks, and each rank's counter p counts the same calls. Every buffer starts as marks, so a CUDA graph
replays the kernel with nothing fed from the host.

`all_reduce_add_rms_norm_splitk` is the op with the layer's last projection before it (`proj`: the O or down shard):
the split-K GEMV writes float32 slices and the kernel reads its row as their slice-order sum rounded to x's dtype,
the bits the sum kernel would have written, so no sum kernel runs between and the protocol above is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from layerzero.kernels.reference.collectives import all_reduce, made_outside_capture
from layerzero.kernels.triton.gemv import projected_at, splitk_partials
from layerzero.kernels.triton.launch import Launcher, await_inputs, next_pow2
from layerzero.kernels.triton.norm import fused_add_rms_norm
from layerzero.kernels.triton.specs import FUSED_SPLITK_TILE
from layerzero.kernels.triton.specs import REDUCE_NORM_MAX_ROWS as MAX_ROWS
from layerzero.kernels.triton.specs import REDUCE_NORM_SLOT_BYTES as SLOT_BYTES


@triton.jit
def _reduce_add_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, bufs_ptr, calls_ptr, n_cols, row_cap, x_slice,
                            eps, w_offset, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                            BITS: tl.constexpr, SLICES: tl.constexpr, PDL: tl.constexpr):
    """SLICES > 0: x_ptr holds a projection's float32 split-K partials [SLICES, rows, n_cols] (slice stride
    x_slice), summed here as the sum kernel would have (gemv.projected_at)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # the weight and the buffer table are never written by a step: read before the wait (launch.py). The call
    # counter and the residual are not: the previous kernel may be this one's previous call, or write the residual.
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + w_offset
    dtype = out_ptr.dtype.element_ty  # x's (the projection's output dtype when x holds partials)
    own = tl.load(bufs_ptr + RANK).to(tl.pointer_type(dtype))
    await_inputs(PDL)
    calls = tl.load(calls_ptr + row)
    phase = calls & 1
    x = projected_at(x_ptr, row.to(tl.int64) * n_cols + cols, mask, x_slice, SLICES, dtype)
    r = tl.load(r_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    bits = x.to(BITS, bitcast=True)  # every bit set is the empty mark: such a NaN goes as another NaN
    x = tl.where(bits == -1, bits - 1, bits).to(BITS).to(dtype, bitcast=True)
    mine = ((phase * WORLD + RANK) * row_cap + row).to(tl.int64) * n_cols
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            buf = tl.load(bufs_ptr + peer).to(tl.pointer_type(dtype))
            tl.store(buf + mine + cols, x, mask=mask)
    empty = tl.full([BLOCK], -1, BITS).to(dtype, bitcast=True)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for src in tl.static_range(WORLD):  # rank order: every rank sums the same bits
        if src == RANK:
            acc += x.to(tl.float32)
        else:
            slot = own + ((phase * WORLD + src) * row_cap + row).to(tl.int64) * n_cols + cols
            theirs = tl.load(slot, mask=mask, other=0.0, volatile=True)
            while tl.sum(((theirs.to(BITS, bitcast=True) == -1) & mask).to(tl.int32), axis=0) > 0:
                theirs = tl.load(slot, mask=mask, other=0.0, volatile=True)
            acc += theirs.to(tl.float32)
            tl.store(slot, empty, mask=mask)  # the mark back for this phase's next call
    reduced = acc.to(dtype).to(tl.float32)  # the all-reduce's result in x's dtype
    s = (reduced + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row.to(tl.int64) * n_cols + cols, s, mask=mask)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / n_cols + eps)
    tl.store(out_ptr + row.to(tl.int64) * n_cols + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(calls_ptr + row, calls + 1)


_REDUCE_ADD_NORM = Launcher(_reduce_add_norm_kernel)
_BITS = {2: tl.int16, 4: tl.int32}  # a row element's bits by its size (bf16 / fp16, fp32)
log = logging.getLogger(__name__)


class SymmetricRows:
    """One group's symmetric buffer (2 phases x ranks x SLOT_BYTES, every rank's mapped by all; all bits set: the
    empty mark), the device table of the ranks' buffer addresses, and this rank's per-row call counters. Made
    without a host synchronization (it may be first needed inside a step under INFER_STRICT_SYNC=1): the table is
    copied from pinned memory, and the fence between marking this rank's buffer and any peer's first row is a
    collective in stream order, not a host barrier."""

    def __init__(self, group: Any, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.buffer = symm_mem.empty(2 * self.world * SLOT_BYTES, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(self.buffer, group.group_name)
        self.buffer.fill_(255)
        self.table = torch.tensor(handle.buffer_ptrs, dtype=torch.int64).pin_memory()
        self.ptrs = self.table.to(device, non_blocking=True)  # the pinned source kept alive with it
        self.calls = torch.zeros(MAX_ROWS, dtype=torch.int32, device=device)
        # Every rank's first kernel comes after this all-reduce, which comes after every rank's buffer was marked:
        # no row a peer sends can be overwritten by the marking.
        dist.all_reduce(torch.zeros(1, device=device), group=group)


_groups: dict[str, SymmetricRows | None] = {}  # group name -> its rows; None: symmetric memory unavailable


def _symmetric_rows(group: Any, device: torch.device) -> SymmetricRows | None:
    """The group's SymmetricRows, made on the first call outside a capture (a collective step every rank reaches
    at the same call, as the all-reduce's own buffer is); None inside a capture before that, or where symmetric
    memory is unavailable (every rank then composes the two ops alike)."""
    return made_outside_capture(_groups, group.group_name, _make_rows, group, device)


def _make_rows(group: Any, device: torch.device) -> SymmetricRows | None:
    try:
        return SymmetricRows(group, device)
    except (RuntimeError, NotImplementedError, ImportError, AttributeError, TypeError) as exc:
        log.warning("all_reduce_add_rms_norm: no symmetric memory for group %s (%r); the all-reduce and the add + "
                    "norm run as two kernels", group.group_name, exc)
        return None


def _projected(x: torch.Tensor, proj: torch.Tensor | None) -> torch.Tensor:
    """x, or its projection by `proj` through lz.linear (the kernels that do not fold it project first)."""
    if proj is None:
        return x
    import layerzero.api as lz  # late: the api's dispatch loads this module

    return lz.linear(x, proj)


def reduce_then_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             proj: torch.Tensor | None = None, *, eps: float, weight_offset: float,
                             group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-op form: the all-reduce (one-shot or NCCL), then the fused add + RMSNorm kernel (with `proj`, x is
    projected first)."""
    return fused_add_rms_norm(all_reduce(_projected(x, proj), group=group), residual, weight, eps=eps,
                              weight_offset=weight_offset)


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            proj: torch.Tensor | None = None, *, eps: float, weight_offset: float,
                            group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum_ranks(x) + residual), sum_ranks(x) + residual) in one kernel for x [..., H] within the spec's
    limits (specs._reduce_norm_fits); the two-op form where the group has no symmetric rows (`_symmetric_rows`).
    With `proj`, x is projected first by lz.linear."""
    x = _projected(x, proj)
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape")
    sym = _symmetric_rows(group, x.device)
    if sym is None:
        return reduce_then_add_rms_norm(x, residual, weight, eps=eps, weight_offset=weight_offset, group=group)
    return _reduce_add_norm(x, x.dtype, 0, residual, weight, eps, weight_offset, sym)


def all_reduce_add_rms_norm_splitk(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                   proj: torch.Tensor, *, eps: float, weight_offset: float,
                                   group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`all_reduce_add_rms_norm` with its projection: x [T, K] through the split-K GEMV (FUSED_SPLITK_TILE), whose
    float32 slices the reduce kernel sums where it reads them (no sum kernel between)."""
    if x.dim() != 2 or proj.dim() != 2 or proj.shape[1] != x.shape[1] or residual.shape != (x.shape[0], proj.shape[0]):
        raise ValueError(f"x {tuple(x.shape)}, proj {tuple(proj.shape)} and residual {tuple(residual.shape)} do "
                         "not fit")
    sym = _symmetric_rows(group, x.device)
    if sym is None:
        return reduce_then_add_rms_norm(x, residual, weight, proj, eps=eps, weight_offset=weight_offset, group=group)
    partials = splitk_partials(x, proj, FUSED_SPLITK_TILE)  # [SPLITS, T, H] float32
    return _reduce_add_norm(partials, x.dtype, partials.shape[0], residual, weight, eps, weight_offset, sym)


def _reduce_add_norm(rows: torch.Tensor, dtype: torch.dtype, slices: int, residual: torch.Tensor,
                     weight: torch.Tensor, eps: float, weight_offset: float,
                     sym: SymmetricRows) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduce kernel over `rows`: x [..., H] in `dtype` (slices 0), or a projection's split-K partials
    [slices, T, H], through the group's symmetric rows."""
    n_cols = residual.shape[-1]
    out = torch.empty(residual.shape, dtype=dtype, device=rows.device)
    summed = torch.empty(residual.shape, dtype=torch.promote_types(dtype, residual.dtype), device=rows.device)
    n_rows = residual.numel() // n_cols if n_cols else 0
    if n_rows == 0:
        return out, summed
    block = next_pow2(n_cols)
    _REDUCE_ADD_NORM((n_rows,), rows.contiguous(), residual.contiguous(), weight.contiguous(), out, summed,
                     sym.ptrs, sym.calls, n_cols, SLOT_BYTES // (n_cols * out.element_size()),
                     rows.stride(0) if slices else 0, eps, weight_offset, RANK=sym.rank, WORLD=sym.world,
                     BLOCK=block, BITS=_BITS[out.element_size()], SLICES=slices,
                     num_warps=min(max(block // 256, 1), 16))
    return out, summed
