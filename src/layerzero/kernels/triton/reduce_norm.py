"""All-reduce + residual add + RMSNorm in one kernel over symmetric memory: a tensor-parallel layer's closing sum
and the next norm in one launch where there were two (the all-reduce, then the fused add + RMSNorm).

One program per row. It pushes its rank's partial row into every rank's symmetric buffer (its own slot there, so
no rank ever writes another's slot), raises its flag in every peer's signal pad, waits for every peer's flag in its
own, then sums the slots in rank order (every rank computes the same bits), rounds the sum to x's dtype as the
all-reduce would, adds the residual and normalizes exactly as `norm.py`'s fused add + RMSNorm does.

Flags follow the zero-reset protocol of torch's own symmetric-memory kernels: a sender swaps its flag in a peer's
pad from 0 to 1 (waiting while the previous one is still up), the receiver swaps it back from 1 to 0, so the pads
are all zero between calls and a CUDA graph replays the kernel with nothing fed from the host. The data slots come
in two phases: a program reads the phase from a per-row call counter (this rank's, not shared), uses it and counts
the call. Why two phases suffice without a closing barrier: a program on rank A in its call n has passed its call
n - 1, whose wait needed B's flag of call n - 1, which B raises only after it finished call n - 2 entirely; so the
phase A writes now (that of n - 2) is one B no longer reads. Rows of a call are independent: program p only meets
program p of the other ranks, and each rank's counter p counts the same calls.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from layerzero.kernels.reference.collectives import all_reduce, made_outside_capture
from layerzero.kernels.triton.launch import Launcher, await_inputs, next_pow2
from layerzero.kernels.triton.norm import fused_add_rms_norm
from layerzero.kernels.triton.specs import REDUCE_NORM_MAX_ROWS as MAX_ROWS
from layerzero.kernels.triton.specs import REDUCE_NORM_SLOT_BYTES as SLOT_BYTES


@triton.jit
def _thread_id():
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _meet_peers(pads_ptr, row, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Raise this program's flag in every rank's pad and take every rank's flag from its own, then make the peers'
    writes before their flags visible to all of this program's threads. Thread i pairs with rank i: a [WORLD]
    vector is held one element per thread by the first WORLD threads."""
    peers = tl.arange(0, WORLD)
    pads = tl.load(pads_ptr + peers).to(tl.pointer_type(tl.uint32))
    own = tl.load(pads_ptr + RANK).to(tl.pointer_type(tl.uint32))
    send = pads + row * WORLD + RANK
    recv = own + row * WORLD + peers
    tl.inline_asm_elementwise("bar.sync 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)  # our slots written
    if _thread_id() < WORLD:
        tl.inline_asm_elementwise(
            """
            {
                .reg .u32 %old;
                .reg .pred %p;
            raise_flag:
                atom.global.release.sys.cas.b32 %old, [$1], 0, 1;
                setp.eq.u32 %p, %old, 0;
                @!%p bra raise_flag;
            take_flag:
                atom.global.acquire.sys.cas.b32 %old, [$2], 1, 0;
                setp.eq.u32 %p, %old, 1;
                @!%p bra take_flag;
                mov.u32 $0, 0;
            }
            """,
            "=r, l, l", [send, recv], dtype=tl.int32, is_pure=False, pack=1)
    tl.inline_asm_elementwise("bar.sync 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    for peer in tl.static_range(WORLD):  # every thread acquires what the peers released
        tl.inline_asm_elementwise("ld.acquire.sys.global.u32 $0, [$1];", "=r, l", [own + row * WORLD + peer],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _reduce_add_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, bufs_ptr, pads_ptr, calls_ptr, n_cols, row_cap,
                            eps, w_offset, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                            PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    calls = tl.load(calls_ptr + row)  # read by every thread before the flags' barrier, counted after it
    phase = calls & 1
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=0.0)
    mine = ((phase * WORLD + RANK) * row_cap + row).to(tl.int64) * n_cols
    for peer in tl.static_range(WORLD):
        buf = tl.load(bufs_ptr + peer).to(tl.pointer_type(dtype))
        tl.store(buf + mine + cols, x, mask=mask)
    _meet_peers(pads_ptr, row, RANK, WORLD)
    own = tl.load(bufs_ptr + RANK).to(tl.pointer_type(dtype))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for src in tl.static_range(WORLD):
        theirs = ((phase * WORLD + src) * row_cap + row).to(tl.int64) * n_cols
        acc += tl.load(own + theirs + cols, mask=mask, other=0.0, volatile=True).to(tl.float32)
    reduced = acc.to(dtype).to(tl.float32)  # the all-reduce's result in x's dtype
    r = tl.load(r_ptr + row.to(tl.int64) * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    s = (reduced + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row.to(tl.int64) * n_cols + cols, s, mask=mask)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + w_offset
    tl.store(out_ptr + row.to(tl.int64) * n_cols + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(calls_ptr + row, calls + 1)


_REDUCE_ADD_NORM = Launcher(_reduce_add_norm_kernel)
log = logging.getLogger(__name__)


class SymmetricRows:
    """One group's symmetric buffer (2 phases x ranks x SLOT_BYTES, every rank's mapped by all), the device tables
    of the ranks' buffer and signal-pad addresses, and this rank's per-row call counters. Made without a host
    synchronization (it may be first needed inside a step under INFER_STRICT_SYNC=1): the tables are copied from
    pinned memory, and the fence between zeroing this rank's pad and any peer's first flag is a collective in stream
    order, not a host barrier."""

    def __init__(self, group: Any, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if symm_mem.get_signal_pad_size() < MAX_ROWS * self.world * 4:
            raise RuntimeError("the signal pads are too small for a flag per row and rank")
        self.buffer = symm_mem.empty(2 * self.world * SLOT_BYTES, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(self.buffer, group.group_name)
        handle.get_signal_pad(handle.rank, [MAX_ROWS * self.world], dtype=torch.int32).zero_()
        self.tables = torch.tensor([handle.buffer_ptrs, handle.signal_pad_ptrs], dtype=torch.int64).pin_memory()
        self.ptrs, self.pads = self.tables.to(device, non_blocking=True)  # the pinned source kept alive with them
        self.calls = torch.zeros(MAX_ROWS, dtype=torch.int32, device=device)
        # Every rank's first kernel comes after this all-reduce, which comes after every rank's pad was zeroed: no
        # flag a peer raises here can be wiped by that zeroing.
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


def reduce_then_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, eps: float,
                             weight_offset: float, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-op form: the all-reduce (one-shot or NCCL), then the fused add + RMSNorm kernel."""
    return fused_add_rms_norm(all_reduce(x, group=group), residual, weight, eps=eps, weight_offset=weight_offset)


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, eps: float,
                            weight_offset: float, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum_ranks(x) + residual), sum_ranks(x) + residual) in one kernel for x [..., H] within the spec's
    limits (specs._reduce_norm_fits); the two-op form where the group has no symmetric rows (`_symmetric_rows`)."""
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape")
    rows = _symmetric_rows(group, x.device)
    if rows is None:
        return reduce_then_add_rms_norm(x, residual, weight, eps=eps, weight_offset=weight_offset, group=group)
    n_cols = x.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    summed = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    n_rows = x.numel() // n_cols if n_cols else 0
    if n_rows == 0:
        return out, summed
    block = next_pow2(n_cols)
    _REDUCE_ADD_NORM((n_rows,), x.contiguous(), residual.contiguous(), weight.contiguous(), out, summed, rows.ptrs,
                     rows.pads, rows.calls, n_cols, SLOT_BYTES // (n_cols * x.element_size()), eps, weight_offset,
                     RANK=rows.rank, WORLD=rows.world, BLOCK=block, num_warps=min(max(block // 256, 1), 16))
    return out, summed
