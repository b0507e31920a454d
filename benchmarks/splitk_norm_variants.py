"""Forms of the split-K GEMV at batch 1 (the decode path of layerzero's projection folds): the plain kernel
(gemv._splitk_kernel) on Qwen3-30B-A3B's QKV (5120 x 2048) and O (2048 x 4096) weights over stages, warps and tiles,
and forms that take the block's input add-and-norm in their reads (the rows (x + r) * g, the stream and its squares
written by the first column block; the reverted fold of commit b50e3ea). Each form's µs a call with the weight read
from DRAM (eight copies rotated, 160 MiB against the 50 MiB L2; the launches captured in a CUDA graph, no PDL), its
registers and spills.

    python benchmarks/splitk_norm_variants.py --out benchmarks/reports/splitk_norm_variants_h200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton import gemv
from layerzero.kernels.triton.specs import FUSED_SPLITK_TILE


@triton.jit
def _stream_pass(x_ptr, r_ptr, s_ptr, sq_ptr, M, K, split, SLICE: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """The first column block's second pass over its slice: the stream x + r and the slice's sum of its squares."""
    rows = tl.arange(0, BLOCK_M)
    r_mask = rows < M
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        at = rows[:, None].to(tl.int64) * K + k[None, :]
        s = (tl.load(x_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)
             + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(s_ptr + at, s, mask=r_mask[:, None])
        sf = s.to(tl.float32)
        squares += tl.sum(sf * sf, 1)
    tl.store(sq_ptr + split * M + rows, squares, mask=r_mask)


@triton.jit
def _stores_in_loop(x_ptr, w_ptr, p_ptr, r_ptr, g_ptr, s_ptr, sq_ptr, M, N, K, x_sm, w_sn, w_offset,
                    SLICE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    STREAM: tl.constexpr):
    """The first build (commit b50e3ea, reverted): the rows' transform, the stream's store and the squares all in the
    loop the compiler pipelines."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    writes = r_mask & (tl.program_id(0) == 0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_sm + k[None, :], mask=r_mask[:, None], other=0.0)
        at = rows[:, None].to(tl.int64) * K + k[None, :]
        s = (x.to(tl.float32) + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32))
        s = s.to(x_ptr.dtype.element_ty)
        tl.store(s_ptr + at, s, mask=writes[:, None])
        sf = s.to(tl.float32)
        squares += tl.sum(sf * sf, 1)
        g = tl.load(g_ptr + k).to(tl.float32) + w_offset
        x = (sf * g[None, :]).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])
    if STREAM:
        tl.store(sq_ptr + split * M + rows, squares, mask=writes)


@triton.jit
def _after_loop(x_ptr, w_ptr, p_ptr, r_ptr, g_ptr, s_ptr, sq_ptr, M, N, K, x_sm, w_sn, w_offset, SLICE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STREAM: tl.constexpr):
    """The rows' transform in the loop, no store there; the first column block writes the sum and the squares in a
    second pass over its slice (STREAM)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        at = rows[:, None].to(tl.int64) * K + k[None, :]
        x = tl.load(x_ptr + at, mask=r_mask[:, None], other=0.0)
        s = (x.to(tl.float32) + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32))
        g = tl.load(g_ptr + k).to(tl.float32) + w_offset
        x = (s.to(x_ptr.dtype.element_ty).to(tl.float32) * g[None, :]).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])
    if STREAM and tl.program_id(0) == 0:
        _stream_pass(x_ptr, r_ptr, s_ptr, sq_ptr, M, K, split, SLICE, BLOCK_M, BLOCK_K)


@triton.jit
def _weight_side(x_ptr, w_ptr, p_ptr, r_ptr, g_ptr, s_ptr, sq_ptr, M, N, K, x_sm, w_sn, w_offset,
                 SLICE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STREAM: tl.constexpr):
    """x + r loaded as the dot's rows as they are, the norm's weight applied to the weight tile instead."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        at = rows[:, None].to(tl.int64) * K + k[None, :]
        s = (tl.load(x_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)
             + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
        g = tl.load(g_ptr + k).to(tl.float32) + w_offset
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
        w = (w.to(tl.float32) * g[:, None]).to(w_ptr.dtype.element_ty)
        acc = tl.dot(s, w, acc)
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])


@triton.jit
def _prefetched(x_ptr, w_ptr, p_ptr, r_ptr, g_ptr, s_ptr, sq_ptr, M, N, K, x_sm, w_sn, w_offset,
                SLICE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                STREAM: tl.constexpr):
    """`_after_loop` without the compiler's pipelining (one stage): the next weight tile loaded by hand before the
    current tile's product, as the MoE decode kernels do."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_cols = w_ptr + cols[None, :].to(tl.int64) * w_sn
    k = split * SLICE + tl.arange(0, BLOCK_K)
    w = tl.load(w_cols + k[:, None], mask=c_mask[None, :], other=0.0)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        at = rows[:, None].to(tl.int64) * K + k[None, :]
        x = tl.load(x_ptr + at, mask=r_mask[:, None], other=0.0)
        s = (x.to(tl.float32) + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32))
        g = tl.load(g_ptr + k).to(tl.float32) + w_offset
        x = (s.to(x_ptr.dtype.element_ty).to(tl.float32) * g[None, :]).to(x_ptr.dtype.element_ty)
        following = k + BLOCK_K
        w_next = tl.load(w_cols + following[:, None], mask=c_mask[None, :] & (following < split * SLICE + SLICE)[:, None],
                         other=0.0)
        acc = tl.dot(x, w, acc)
        w = w_next
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])
    if STREAM and tl.program_id(0) == 0:
        _stream_pass(x_ptr, r_ptr, s_ptr, sq_ptr, M, K, split, SLICE, BLOCK_M, BLOCK_K)


@triton.jit
def _one_shot(x_ptr, w_ptr, p_ptr, r_ptr, g_ptr, s_ptr, sq_ptr, M, N, K, x_sm, w_sn, w_offset, SLICE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STREAM: tl.constexpr):
    """No loop: the program's whole K slice as one tile (BLOCK_K = SLICE), the rows transformed once, one dot; the
    first column block stores the sum and the squares from the same tile."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    k = split * SLICE + tl.arange(0, SLICE)
    w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
    at = rows[:, None].to(tl.int64) * K + k[None, :]
    s = (tl.load(x_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)
         + tl.load(r_ptr + at, mask=r_mask[:, None], other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
    g = tl.load(g_ptr + k).to(tl.float32) + w_offset
    sf = s.to(tl.float32)
    acc = tl.dot((sf * g[None, :]).to(x_ptr.dtype.element_ty), w)
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])
    if STREAM:
        writes = r_mask & (tl.program_id(0) == 0)
        tl.store(s_ptr + at, s, mask=writes[:, None])
        tl.store(sq_ptr + split * M + rows, tl.sum(sf * sf, 1), mask=writes)


def _time(launch, calls: int) -> float:
    """µs a call: `calls` launches captured in a CUDA graph (Python's launch cost would otherwise be what is timed),
    the graph replayed five times."""
    for _ in range(3):
        launch(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            launch(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dev, dtype, copies = "cuda", torch.bfloat16, 8
    rows = []

    def measure(name: str, n: int, k: int, kernel, tile: tuple[int, int, int], stages: int, warps: int,
                normed: bool) -> None:
        splits, block_n, block_k = tile
        weights = [torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5 for _ in range(copies)]
        x, r = torch.randn(1, k, device=dev, dtype=dtype), torch.randn(1, k, device=dev, dtype=dtype)
        g = torch.rand(k, device=dev, dtype=dtype) + 0.5
        partials = torch.empty(splits, 1, n, device=dev)
        summed, squares = torch.empty(1, k, device=dev, dtype=dtype), torch.empty(splits, 1, device=dev)
        grid = (triton.cdiv(n, block_n), splits)
        tiles = dict(SLICE=k // splits, BLOCK_M=gemv.ROWS, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                     num_stages=stages)

        def launch(i: int):
            if not normed:
                return kernel[grid](x, weights[i % copies], partials, 1, n, k, k, k, PRECISION="tf32", PDL=False,
                                    **tiles)
            return kernel[grid](x, weights[i % copies], partials, r, g, summed, squares, 1, n, k, k, k, 0.0,
                                STREAM=True, **tiles)

        compiled = launch(0)
        us = _time(launch, args.calls)
        rows.append(dict(form=name, shape=f"{n} x {k}", tile=list(tile), stages=stages, warps=warps, us=us,
                         gb_s=n * k * 2 / (us * 1e-6) / 1e9, regs=compiled.n_regs, spills=compiled.n_spills))
        del weights

    qkv, o, tile = (5120, 2048), (2048, 4096), FUSED_SPLITK_TILE
    plain = gemv._splitk_kernel
    measure("plain split-K (the tree)", *qkv, plain, tile, 3, 4, False)
    for stages, warps in ((1, 4), (2, 4), (4, 4), (5, 4), (3, 2), (4, 2), (3, 8)):
        measure("plain split-K", *qkv, plain, tile, stages, warps, False)
    for t in ((8, 32, 128), (4, 64, 128), (4, 32, 256)):
        measure("plain split-K", *qkv, plain, t, 3, 4, False)
    measure("plain split-K (the tree)", *o, plain, tile, 3, 4, False)
    for stages, warps in ((4, 4), (5, 4), (3, 2), (4, 2), (3, 8)):
        measure("plain split-K", *o, plain, tile, stages, warps, False)
    for stages in (3, 2, 1):
        measure("normed: transform, store and squares in the loop (the first build)", *qkv, _stores_in_loop, tile,
                stages, 4, True)
    for stages, warps in ((3, 4), (2, 4), (4, 4), (3, 8), (1, 4)):
        measure("normed: transform in the loop, stream in a second pass", *qkv, _after_loop, tile, stages, warps,
                True)
    for t in ((8, 32, 128), (4, 64, 128), (4, 32, 256)):
        measure("normed: transform in the loop, stream in a second pass", *qkv, _after_loop, t, 1, 4, True)
    for stages, warps in ((1, 4), (1, 2)):
        measure("normed: next weight tile loaded by hand", *qkv, _prefetched, tile, stages, warps, True)
    measure("normed: next weight tile loaded by hand", *qkv, _prefetched, (4, 64, 128), 1, 4, True)
    for stages in (3, 2):
        measure("normed: the norm's weight on the weight tile", *qkv, _weight_side, tile, stages, 4, True)
    for warps in (4, 2):
        measure("normed: one tile a program, no loop", *qkv, _one_shot, (4, 32, 512), 1, warps, True)
    lines = ["| form | weight | tile (slices, N, K) | stages | warps | µs a call | GB/s | registers | spills |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['form']} | {r['shape']} | {tuple(r['tile'])} | {r['stages']} | {r['warps']} | {r['us']:.2f} | "
              f"{r['gb_s']:.0f} | {r['regs']} | {r['spills']} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1))
    args.out.with_suffix(".md").write_text(f"# Split-K GEMV forms at batch 1 ({torch.cuda.get_device_name()})\n\n"
                                           f"`python benchmarks/splitk_norm_variants.py`\n\n{text}\n")


if __name__ == "__main__":
    main()
