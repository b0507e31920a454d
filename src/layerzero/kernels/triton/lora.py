"""LoRA adapters batched over rows whose adapters differ, in Triton (graph safe: slot ids are device data, the grids
come from shapes).

Few rows (decode): one program per (row, rank) for the shrink and per (row, 64 outputs) for the expand, each reading
only its row's adapter, so the reduction over K spreads over many programs. Many rows (prefill): one program per
(adapter slot, tile of rows, tile of outputs). It reads its tile's slot ids first and returns at once
when no row of the tile uses its slot, so an adapter's weights are read only by the tiles of rows that use it and a
row without an adapter (-1) costs one id load per program. Each output row is written by the one program of its
slot: no atomics, and the sum over the rank is one `tl.dot` per tile (rows padded to 16, the smallest tile a dot
takes). `lora_shrink` writes h = x @ a[slot].T in float32 (and zeros for rows without an adapter, from slot 0's
programs); `lora_expand` adds h @ b[slot].T into y in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision, interpreting, next_pow2

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, ids_ptr, h_ptr, rows, rank, k_dim, k_chunk, stride_x, stride_as, stride_ar,
                   BT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                   PRECISION: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    slot, tile, r_part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r_tile, part = r_part // SPLIT, r_part % SPLIT
    t = tile * BT + tl.arange(0, BT)
    ids = tl.load(ids_ptr + t, mask=t < rows, other=-2).to(tl.int32)
    mine = ids == slot
    # rows without an adapter get zeros, written by slot 0's programs (with SPLIT > 1, h starts at zero)
    blank = (ids == -1) & (slot == 0) & (SPLIT == 1)
    if tl.max((mine | blank).to(tl.int32), 0) == 0:
        return
    r = r_tile * BR + tl.arange(0, BR)
    acc = tl.zeros((BT, BR), dtype=tl.float32)
    if tl.max(mine.to(tl.int32), 0) > 0:
        t64 = t.to(tl.int64)
        a_base = a_ptr + slot.to(tl.int64) * stride_as
        end = tl.minimum(k_dim, (part + 1) * k_chunk)
        for k0 in range(part * k_chunk, end, BK):
            k = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + t64[:, None] * stride_x + k[None, :], mask=mine[:, None] & (k[None, :] < end),
                        other=0.0)
            a = tl.load(a_base + r[:, None] * stride_ar + k[None, :], mask=(r[:, None] < rank) & (k[None, :] < end),
                        other=0.0)
            acc = tl.dot(x, tl.trans(a), acc, input_precision=PRECISION)
    out = h_ptr + t.to(tl.int64)[:, None] * rank + r[None, :]
    if SPLIT > 1:
        tl.atomic_add(out, acc, mask=mine[:, None] & (r[None, :] < rank), sem="relaxed")
    else:
        tl.store(out, acc, mask=(mine | blank)[:, None] & (r[None, :] < rank))


@triton.jit
def _expand_kernel(y_ptr, h_ptr, b_ptr, ids_ptr, rows, n_dim, rank, stride_y, stride_bs, stride_bn,
                   BT: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    slot, tile, n_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = tile * BT + tl.arange(0, BT)
    ids = tl.load(ids_ptr + t, mask=t < rows, other=-2).to(tl.int32)
    mine = ids == slot
    if tl.max(mine.to(tl.int32), 0) == 0:
        return
    t64 = t.to(tl.int64)
    n = n_tile * BN + tl.arange(0, BN)
    r = tl.arange(0, BR)
    b_tile = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + n[:, None] * stride_bn + r[None, :],
                     mask=(n[:, None] < n_dim) & (r[None, :] < rank), other=0.0)
    h = tl.load(h_ptr + t64[:, None] * rank + r[None, :], mask=mine[:, None] & (r[None, :] < rank), other=0.0)
    delta = tl.dot(h.to(b_tile.dtype), tl.trans(b_tile), input_precision=PRECISION)
    where = y_ptr + t64[:, None] * stride_y + n[None, :]
    keep = mine[:, None] & (n[None, :] < n_dim)
    y = tl.load(where, mask=keep, other=0.0)
    tl.store(where, (y.to(tl.float32) + delta).to(y.dtype), mask=keep)


@triton.jit
def _shrink_rows_kernel(x_ptr, a_ptr, ids_ptr, h_ptr, rank, k_dim, k_chunk, stride_x, stride_as, stride_ar,
                        BK: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
    """h[t, r] of one row and one rank over one chunk of K (a GEMV with the row's own slot: decode); with SPLIT > 1
    the chunks' sums are added into h, which starts at zero."""
    await_inputs(PDL)
    t, r, part = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    slot = tl.load(ids_ptr + t).to(tl.int64)
    acc = tl.zeros((BK,), dtype=tl.float32)
    if slot >= 0:
        x_row, a_row = x_ptr + t * stride_x, a_ptr + slot * stride_as + r * stride_ar
        end = tl.minimum(k_dim, (part + 1) * k_chunk)
        for k0 in range(part * k_chunk, end, BK):
            k = k0 + tl.arange(0, BK)
            keep = k < end
            acc += tl.load(x_row + k, mask=keep, other=0.0).to(tl.float32) * \
                tl.load(a_row + k, mask=keep, other=0.0).to(tl.float32)
        if SPLIT > 1:
            tl.atomic_add(h_ptr + t * rank + r, tl.sum(acc, 0), sem="relaxed")
    if SPLIT == 1:
        tl.store(h_ptr + t * rank + r, tl.sum(acc, 0))


@triton.jit
def _expand_rows_kernel(y_ptr, h_ptr, b_ptr, ids_ptr, n_dim, rank, stride_y, stride_bs, stride_bn,
                        BN: tl.constexpr, BR: tl.constexpr, PDL: tl.constexpr):
    """y[t, n-tile] += b[slot] @ h[t] for one row (few rows: decode)."""
    await_inputs(PDL)
    t, n_tile = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(ids_ptr + t).to(tl.int64)
    if slot >= 0:
        n = n_tile * BN + tl.arange(0, BN)
        r = tl.arange(0, BR)
        h = tl.load(h_ptr + t * rank + r, mask=r < rank, other=0.0)
        b = tl.load(b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
                    mask=(n[:, None] < n_dim) & (r[None, :] < rank), other=0.0).to(tl.float32)
        where = y_ptr + t * stride_y + n
        y = tl.load(where, mask=n < n_dim, other=0.0)
        tl.store(where, (y.to(tl.float32) + tl.sum(b * h[None, :], 1)).to(y.dtype), mask=n < n_dim)


_SHRINK = Launcher(_shrink_kernel)
_EXPAND = Launcher(_expand_kernel)
_SHRINK_ROWS = Launcher(_shrink_rows_kernel)
_EXPAND_ROWS = Launcher(_expand_rows_kernel)


ROWS_TILE = (1024, 4096, 4)  # BK, the K of one shrink program (several split K over programs), warps


def lora_shrink_rows(x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor, tile: tuple[int, int, int] | None = None
                     ) -> torch.Tensor:
    """lz.lora_shrink for few rows: one program per (row, rank, chunk of K), each reading its row's adapter only."""
    rows, k_dim = x.shape
    rank = a.shape[1]
    bk, chunk, warps = tile or ROWS_TILE
    split = triton.cdiv(k_dim, chunk)
    x, a = x.contiguous(), a.contiguous()
    h = (torch.zeros if split > 1 else torch.empty)(rows, rank, dtype=torch.float32, device=x.device)
    if rows:
        _SHRINK_ROWS((rows, rank, split), x, a, ids, h, rank, k_dim, chunk, x.stride(0), a.stride(0), a.stride(1),
                     BK=bk, SPLIT=split, num_warps=warps)
    return h


def lora_expand_rows(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, ids: torch.Tensor,
                     tile: tuple[int, int] | None = None) -> torch.Tensor:
    """lz.lora_expand for few rows: one program per (row, BN outputs)."""
    rows, n_dim = y.shape
    rank = b.shape[2]
    bn, warps = tile or ((64, 4) if rows <= 4 else (256, 8))
    if rows:
        _check_y(y)
        b, h = b.contiguous(), h.contiguous()
        _EXPAND_ROWS((rows, triton.cdiv(n_dim, bn)), y, h, b, ids, n_dim, rank, y.stride(0), b.stride(0),
                     b.stride(1), BN=bn, BR=max(16, next_pow2(rank)), num_warps=warps)
    return y



def _check_y(y: torch.Tensor) -> None:
    if y.stride(-1) != 1:
        raise ValueError("lora_expand adds into y in place: its last dimension must be contiguous")


def lora_shrink(x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor, tile: tuple[int, int, int, int] | None = None
                ) -> torch.Tensor:
    """lz.lora_shrink: h = x @ a[ids].T per row, float32 [T, R] (zero rows where ids < 0). `tile`: (rows, K per
    step, K per program, warps) of a program; K split over programs adds into a zeroed h."""
    rows, k_dim = x.shape
    slots, rank, _ = a.shape
    x, a = x.contiguous(), a.contiguous()
    bt, bk, chunk, warps = tile or _slot_shrink_tile(rows)
    split = triton.cdiv(k_dim, chunk)
    h = (torch.zeros if split > 1 else torch.empty)(rows, rank, dtype=torch.float32, device=x.device)
    if rows:
        br = min(max(16, next_pow2(rank)), 64)
        grid = (slots, triton.cdiv(rows, bt), triton.cdiv(rank, br) * split)
        _SHRINK(grid, x, a.to(x.dtype), ids, h, rows, rank, k_dim, chunk, x.stride(0), a.stride(0), a.stride(1),
                BT=bt, BR=br, BK=bk, SPLIT=split, PRECISION=dot_precision(x.dtype), num_warps=warps)
    return h


def _slot_shrink_tile(rows: int) -> tuple[int, int, int, int]:
    """(rows, K per step, K per program, warps): K split fine for a decode batch (the reduction spread over many
    programs), coarser for a prefill's many rows (fewer atomics; benchmarks/reports/lora_tiles_h200.md)."""
    return (64, 64, 256, 4) if rows <= 256 else (64, 64, 1024, 4)


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, ids: torch.Tensor,
                tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """lz.lora_expand: y[t] += b[ids[t]] @ h[t] in place for rows with an adapter; returns y. `tile`: (rows, outputs,
    warps) of a program (default: by the row count)."""
    rows, n_dim = y.shape
    slots, _, rank = b.shape
    if not rows:
        return y
    _check_y(y)
    b, h = b.contiguous(), h.contiguous()
    bt, bn, warps = tile or (64, 128, 4)
    grid = (slots, triton.cdiv(rows, bt), triton.cdiv(n_dim, bn))
    _EXPAND(grid, y, h, b, ids, rows, n_dim, rank, y.stride(0), b.stride(0), b.stride(1), BT=bt, BN=bn,
            BR=max(16, next_pow2(rank)), PRECISION=dot_precision(b.dtype), num_warps=warps)
    return y
