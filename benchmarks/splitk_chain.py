"""The attention's output projection at batch 1, cuBLAS against a split-K GEMV whose partial sums the next kernel
(the residual add + RMSNorm) adds up, inside a chain of layers replayed from a CUDA graph.

    python benchmarks/splitk_chain.py --out STEM

Per layer, as a decode step runs it at batch 1: the QKV projection (cuBLAS) of the normed stream, then the O
projection of the first q columns, then the residual add + RMSNorm whose output the next layer's QKV reads; every
layer has its own weights (past L2). Variants of the O projection and the add + norm:
  cublas   F.linear (cuBLAS picks split-K and its reduce kernel at these shapes), then layerzero's Triton fused add +
           RMSNorm (a PDL kernel);
  splitK   a Triton GEMV over S slices of K writing float32 partials [S, N] (a PDL kernel: no counter, no atomics),
           then an add + RMSNorm that sums the S partials in order, rounds to the stream's dtype as the projection's
           output would be, adds the residual and normalizes (a PDL kernel);
  splitK + sum kernel  the same partials summed by a PDL kernel of their own (layerzero's `triton.linear_splitk`
           second kernel), then the fused add + RMSNorm: the form that stays inside `lz.linear`.
The synchronization between the split programs is the kernel boundary PDL already pays, where a last-program merge
pays a counter and its fence (benchmarks/reports/moe_split_merge_h200.md). Shapes: the Qwen3-30B-A3B attention
(hidden 2048, 32 x 128 queries, 4 KV heads) and the Llama-3.1-8B one at TP=2 (a rank's 16 query heads, 4 KV heads;
no all-reduce here). µs a layer: the median replay over the layers.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from device_rates import copy_bandwidth, graph_us
from report_files import write_report

from layerzero.kernels.triton import gemv
from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision
from layerzero.kernels.triton.norm import fused_add_rms_norm

SHAPES = {  # hidden, query width, QKV width (a rank's), O input width (a rank's)
    "qwen3-30b-a3b": (2048, 4096, 5120, 4096),
    "llama-3.1-8b-tp2": (4096, 2048, 3072, 2048),
}
LAYERS = 48
# (S, BLOCK_N, BLOCK_K, warps, early): early loads a program's whole weight slice before its PDL wait (the weights
# are never written by a step), where the slice is at most 64 KiB
CONFIGS = [(s, bn, bk, w, e) for s in (2, 4, 8) for bn in (16, 32, 64) for bk in (128, 256, 512) for w in (4, 8)
           for e in (False, True)]
EARLY_MAX_BYTES = 64 * 1024


@triton.jit
def _early_splitk_kernel(x_ptr, w_ptr, p_ptr, N, K, w_sn, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """layerzero's split-K kernel (gemv._splitk_kernel) for one row, but its whole weight slice loaded before the
    PDL wait."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    c_mask = cols < N
    k = s * SPLIT + tl.arange(0, SPLIT)
    w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
    await_inputs(PDL)
    x = tl.load(x_ptr + rows[:, None] * 0 + k[None, :], mask=(rows[:, None] < 1) & (k[None, :] < K), other=0.0)
    acc = tl.dot(x, w)
    tl.store(p_ptr + s * N + rows[:, None] * 0 + cols[None, :], acc, mask=(rows[:, None] < 1) & c_mask[None, :])


@triton.jit
def _partials_add_norm_kernel(p_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, N, eps, S: tl.constexpr, BLOCK: tl.constexpr,
                              PDL: tl.constexpr):
    await_inputs(PDL)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(S):
        x += tl.load(p_ptr + s * N + cols, mask=mask, other=0.0)
    x = x.to(sum_ptr.dtype.element_ty).to(tl.float32)  # the projection's output dtype
    total = (x + tl.load(r_ptr + cols, mask=mask, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + cols, total, mask=mask)
    t = total.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(t * t, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, (t * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


_EARLY_SPLITK = Launcher(_early_splitk_kernel)
_PARTIALS_ADD_NORM = Launcher(_partials_add_norm_kernel)


def splitk_partials(x: torch.Tensor, w: torch.Tensor, parts: torch.Tensor, config: tuple) -> None:
    """parts [S, N] float32 = the S slices of K of x [1, K] @ w [N, K]^T."""
    splits, block_n, block_k, warps, early = config
    n, k = w.shape
    grid = (triton.cdiv(n, block_n), splits)
    if early:
        _EARLY_SPLITK(grid, x, w, parts, n, k, w.stride(0), SPLIT=k // splits, BLOCK_M=16, BLOCK_N=block_n,
                      num_warps=warps, num_stages=3)
    else:  # the shipped kernel at this tiling
        gemv._SPLITK(grid, x, w, parts, 1, n, k, x.stride(0), w.stride(0), SLICE=k // splits, BLOCK_M=gemv.ROWS,
                     BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(x.dtype), num_warps=warps,
                     num_stages=3)


def partials_add_norm(parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                      summed: torch.Tensor) -> None:
    n = residual.shape[-1]
    _PARTIALS_ADD_NORM((1,), parts, residual, weight, out, summed, n, 1e-6, S=parts.shape[0],
                       BLOCK=triton.next_power_of_2(n), num_warps=8)


def sum_partials(parts: torch.Tensor, y: torch.Tensor) -> None:
    """y [1, N] = the partials [S, N] summed in order: layerzero's split-K linear's second kernel."""
    n = parts.shape[-1]
    gemv._SUM_SLICES((triton.cdiv(n, gemv.SUM_BLOCK),), parts, y, y, n, n, SPLITS=parts.shape[0], HAS_BIAS=False,
                     BLOCK=gemv.SUM_BLOCK, num_warps=4)


def chain(shape: str, variant: tuple | None, separate: bool = False) -> float:
    """µs a layer of the QKV -> O -> add + norm chain over LAYERS layers' weights."""
    hidden, q_width, qkv_width, o_in = SHAPES[shape]
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    qkv_w = [torch.randn(qkv_width, hidden, device=dev, dtype=dt, generator=gen) * 0.02 for _ in range(LAYERS)]
    o_w = [torch.randn(hidden, o_in, device=dev, dtype=dt, generator=gen) * 0.02 for _ in range(LAYERS)]
    norm_w = torch.ones(hidden, device=dev, dtype=dt)
    state = {"h": torch.randn(1, hidden, device=dev, dtype=dt, generator=gen),
             "residual": torch.randn(1, hidden, device=dev, dtype=dt, generator=gen)}
    parts = torch.empty(variant[0] if variant else 1, hidden, device=dev, dtype=torch.float32)

    def layer(i: int):
        def run() -> None:  # the graph records each layer's outputs where the next layer reads them
            qkv = F.linear(state["h"], qkv_w[i])
            attn = qkv[:, :o_in]  # stands for the attention's output (the same bytes)
            if variant is None:
                state["h"], state["residual"] = fused_add_rms_norm(F.linear(attn, o_w[i]), state["residual"],
                                                                   norm_w, eps=1e-6, weight_offset=0.0)
            elif separate:  # the split-K linear on its own: partials, a PDL kernel summing them, then the add + norm
                splitk_partials(attn, o_w[i], parts, variant)
                y = torch.empty_like(state["h"])
                sum_partials(parts, y)
                state["h"], state["residual"] = fused_add_rms_norm(y, state["residual"], norm_w, eps=1e-6,
                                                                   weight_offset=0.0)
            else:
                splitk_partials(attn, o_w[i], parts, variant)
                out, total = torch.empty_like(state["h"]), torch.empty_like(state["residual"])
                partials_add_norm(parts, state["residual"], norm_w, out, total)
                state["h"], state["residual"] = out, total
        return run

    us = graph_us([layer(i) for i in range(LAYERS)], calls=LAYERS, replays=20)
    del qkv_w, o_w
    torch.cuda.empty_cache()
    return us


def check(shape: str, config: tuple) -> float:
    """Max abs difference of the split-K partials' sum against F.linear (float32 products of bf16)."""
    hidden, _, _, o_in = SHAPES[shape]
    x = torch.randn(1, o_in, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, o_in, device="cuda", dtype=torch.bfloat16) * 0.02
    parts = torch.empty(config[0], hidden, device="cuda", dtype=torch.float32)
    splitk_partials(x, w, parts, config)
    return float((parts.sum(0) - (x.float() @ w.float().t())[0]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for shape in args.shapes:
        base = chain(shape, None)
        print(f"{shape} cublas: {base:.2f} us a layer", flush=True)
        rows.append({"shape": shape, "variant": "cublas", "us": base})
        for config in CONFIGS:
            splits, block_n, block_k, _, early = config
            k = SHAPES[shape][3]
            if k % (splits * block_k) or (early and (block_k != 128 or block_n * k // splits * 2 > EARLY_MAX_BYTES)):
                continue  # early configs ignore BLOCK_K: one of them per (S, BLOCK_N, warps)
            err = check(shape, config)
            us = chain(shape, config)
            print(f"{shape} splitK {config}: {us:.2f} us a layer (max abs err {err:.2e})", flush=True)
            rows.append({"shape": shape, "variant": "splitK", "config": config, "us": us, "max_abs_err": err})
            if not early and config[3] == 4:
                us = chain(shape, config, separate=True)
                print(f"{shape} splitK + sum kernel {config}: {us:.2f} us a layer", flush=True)
                rows.append({"shape": shape, "variant": "splitK + sum kernel", "config": config, "us": us})
    bw = copy_bandwidth()
    lines = [f"# O projection + add + RMSNorm at batch 1: cuBLAS against split-K partials ({torch.cuda.get_device_name()})",
             "", f"`python benchmarks/splitk_chain.py`; {LAYERS} layers in a CUDA graph; copy bandwidth "
             f"{bw / 1e12:.2f} TB/s.", "", "| shape | variant | S, BLOCK_N, BLOCK_K, warps, early | µs a layer |",
             "|---|---|---|---:|"]
    for shape, group in itertools.groupby(rows, key=lambda r: r["shape"]):
        group = list(group)
        best = sorted(group, key=lambda r: r["us"])[:6]
        separate = sorted([g for g in group if g["variant"] == "splitK + sum kernel"], key=lambda r: r["us"])[:3]
        for r in [g for g in group if g["variant"] == "cublas"] + [b for b in best if b["variant"] == "splitK"] \
                + separate:
            lines.append(f"| {shape} | {r['variant']} | {r.get('config', '')} | {r['us']:.2f} |")
    write_report(args.out, {"rows": rows, "copy_bandwidth": bw}, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
