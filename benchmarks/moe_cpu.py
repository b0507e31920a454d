"""One mixture-of-experts layer on the CPU: layerzero's fused_moe (the path it selects) against per-expert Python loops
over the same stacked weights, batch 1 (decode) to 64, and the bytes each reads; the same in bfloat16; then the same
weights stored as a GGUF stores them (Q4_0, Q8_0) and kept so (lz.fused_moe_int4 / fused_moe_w8, the native kernel),
against per-expert loops over those weights dequantized to float32 (what a loader that dequantizes GGUF experts runs)
and over the kept weights one expert at a time (lz.linear_int4 / linear_w8 per routed expert).

    python benchmarks/moe_cpu.py [--experts 128] [--top-k 8] [--hidden 1024] [--inner 384] [--repeats 20]

The loops are what a model without a fused path runs: `all experts` visits every expert and checks its mask
(Mixtral's and Qwen 3 MoE's original transformers code), `hit experts` visits only the experts some token picked
(transformers 5). Shapes default to a Qwen3-30B-A3B layer (128 experts, top 8) scaled down to fit the CPU's memory in
float32. Writes moe_cpu.{json,md} under OUT_DIR (default benchmarks/reports).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize

import layerzero as lz
from infer.loader.gguf_quant import read_int4, read_q8_0
from infer.models.quant import Int4Experts, Int4Weight, W8Experts

Q8_BLOCK = (1, 32)


def loop_all(x, w13, w2, weights, ids) -> torch.Tensor:
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        rows, slot = torch.where(ids == e)
        if rows.numel():
            gate, up = F.linear(x[rows], w13[e]).chunk(2, dim=-1)
            out.index_add_(0, rows, F.linear(F.silu(gate) * up, w2[e]) * weights[rows, slot, None])
    return out


def loop_hit(x, w13, w2, weights, ids) -> torch.Tensor:
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        rows, slot = torch.where(ids == e)
        gate, up = F.linear(x[rows], w13[e]).chunk(2, dim=-1)
        out.index_add_(0, rows, F.linear(F.silu(gate) * up, w2[e]) * weights[rows, slot, None])
    return out


def stored(w: torch.Tensor, kind: GGMLQuantizationType) -> tuple[Int4Experts | W8Experts, list[Int4Weight | tuple]]:
    """A float32 stack [E, N, K] as a GGUF stores it in `kind`, read back as infer keeps it (the stack the fused op
    takes, and one weight per expert for the per-expert loop)."""
    raw = [quantize(w[e].numpy(), kind) for e in range(w.shape[0])]
    if kind == GGMLQuantizationType.Q8_0:
        parts = [read_q8_0(r) for r in raw]
        q = torch.from_numpy(np.stack([p[0] for p in parts]))
        scale = torch.from_numpy(np.stack([p[1] for p in parts]))
        return W8Experts(q, scale, Q8_BLOCK), [(q[e], scale[e]) for e in range(w.shape[0])]
    groups = [read_int4(r, kind) for r in raw]
    return (Int4Experts.from_groups([tuple(g) for g in groups], 32, torch.device("cpu")),
            [Int4Weight.from_groups(*g, 32, torch.device("cpu")) for g in groups])


def quant_linear(x: torch.Tensor, w: Int4Weight | tuple) -> torch.Tensor:
    if isinstance(w, Int4Weight):
        return lz.linear_int4(x, w.qweight, w.scales_zeros, 32)
    return lz.linear_w8(x, w[0], w[1], Q8_BLOCK)


def loop_hit_quantized(x, w13: list, w2: list, weights, ids) -> torch.Tensor:
    """`loop_hit` with each routed expert's kept weights through the dense-layer quantized linears."""
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        rows, slot = torch.where(ids == e)
        gate, up = quant_linear(x[rows], w13[e]).chunk(2, dim=-1)
        out.index_add_(0, rows, quant_linear(F.silu(gate) * up, w2[e]) * weights[rows, slot, None])
    return out


def fused_quantized(x, w13: Int4Experts | W8Experts, w2: Int4Experts | W8Experts, weights, ids) -> torch.Tensor:
    if isinstance(w13, Int4Experts):
        return lz.fused_moe_int4(x, w13.qweight, w13.scales, w2.qweight, w2.scales, weights, ids, group_size=32)
    return lz.fused_moe_w8(x, w13.weight, w13.scale, w2.weight, w2.scale, weights, ids, block_size=Q8_BLOCK)


def kernel_of(x, w13: Int4Experts | W8Experts, w2: Int4Experts | W8Experts, weights, ids) -> str:
    if isinstance(w13, Int4Experts):
        return lz.which("fused_moe_int4", x, w13.qweight, w13.scales, w2.qweight, w2.scales, weights, ids,
                        group_size=32)["kernel_id"]
    return lz.which("fused_moe_w8", x, w13.weight, w13.scale, w2.weight, w2.scale, weights, ids,
                    block_size=Q8_BLOCK)["kernel_id"]


def quantized_rows(args: argparse.Namespace, w13: torch.Tensor, w2: torch.Tensor, router: torch.Tensor,
                   batches: list[int]) -> list[dict]:
    rows = []
    e, i, h = w13.shape[0], w2.shape[2], w2.shape[1]
    for kind, bits in ((GGMLQuantizationType.Q4_0, 4.5), (GGMLQuantizationType.Q8_0, 8.5)):
        s13, per13 = stored(w13, kind)
        s2, per2 = stored(w2, kind)
        d13, d2 = s13.dequantize(), s2.dequantize()  # the same weights in float32
        for batch in batches:
            x = torch.randn(batch, h)
            weights, ids = lz.moe_route(x @ router.T, args.top_k, renormalize=True)
            fused = fused_quantized(x, s13, s2, weights, ids)
            torch.testing.assert_close(fused, loop_hit(x, d13, d2, weights, ids), atol=1e-4, rtol=1e-4)
            t_fused = timed(lambda: fused_quantized(x, s13, s2, weights, ids), args.repeats)
            t_dense = timed(lambda: loop_hit(x, d13, d2, weights, ids), args.repeats)
            t_all = timed(lambda: loop_all(x, d13, d2, weights, ids), args.repeats)
            t_kept = timed(lambda: loop_hit_quantized(x, per13, per2, weights, ids), args.repeats)
            routed = ids.unique().numel()
            read_gb = routed * 3 * i * h * bits / 8 / 1e9
            rows.append({"format": kind.name, "batch": batch, "kernel": kernel_of(x, s13, s2, weights, ids),
                         "experts_routed": routed, "fused_ms": t_fused * 1e3, "loop_all_f32_ms": t_all * 1e3,
                         "loop_hit_f32_ms": t_dense * 1e3, "loop_hit_kept_ms": t_kept * 1e3,
                         "routed_weights_gb": read_gb, "fused_gb_s": read_gb / t_fused})
            print(f"{kind.name} batch {batch:3d}: fused {t_fused * 1e3:.2f} ms, loop over dequantized experts "
                  f"{t_dense * 1e3:.2f} ms ({t_dense / t_fused:.1f}x), over all {t_all * 1e3:.2f} ms "
                  f"({t_all / t_fused:.1f}x), over kept experts one by one {t_kept * 1e3:.2f} ms "
                  f"({t_kept / t_fused:.1f}x)")
    return rows


def bf16_rows(args: argparse.Namespace, w13: torch.Tensor, w2: torch.Tensor, router: torch.Tensor,
              batches: list[int]) -> list[dict]:
    """The experts stored in bfloat16 (a bf16 checkpoint's): lz.fused_moe on the stacks as they are (float32 rows)
    against the per-expert loop over the same bf16 weights in torch's bf16 matmuls."""
    rows = []
    b13, b2 = w13.bfloat16(), w2.bfloat16()
    i, h = w2.shape[2], w2.shape[1]
    for batch in batches:
        x = torch.randn(batch, h)
        weights, ids = lz.moe_route(x @ router.T, args.top_k, renormalize=True)
        fused = lz.fused_moe(x, b13, b2, weights, ids)
        torch.testing.assert_close(fused, loop_hit(x, b13.float(), b2.float(), weights, ids), atol=1e-4, rtol=1e-4)
        xb, wb = x.bfloat16(), weights.bfloat16()
        t_fused = timed(lambda: lz.fused_moe(x, b13, b2, weights, ids), args.repeats)
        t_hit = timed(lambda: loop_hit(xb, b13, b2, wb, ids), args.repeats)
        routed = ids.unique().numel()
        read_gb = routed * 3 * i * h * 2 / 1e9
        rows.append({"batch": batch, "kernel": lz.which("fused_moe", x, b13, b2, weights, ids)["kernel_id"],
                     "experts_routed": routed, "fused_ms": t_fused * 1e3, "loop_hit_bf16_ms": t_hit * 1e3,
                     "routed_weights_gb": read_gb, "fused_gb_s": read_gb / t_fused})
        print(f"bf16 batch {batch:3d}: fused {t_fused * 1e3:.2f} ms, loop over the hit experts in bf16 "
              f"{t_hit * 1e3:.2f} ms ({t_hit / t_fused:.1f}x)")
    return rows


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_ceiling(megabytes: int = 512) -> float:
    """GB/s of one torch sum over a float32 tensor far larger than the caches, on all threads: the memory read rate
    the kernels' GB/s are to be read against (a streaming C loop of 64-byte loads reads about 1.7x this)."""
    x = torch.ones(megabytes * 2**20 // 4)
    return x.numel() * 4 / timed(lambda: x.sum(), 5) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inner", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", default="1,4,16,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    e, k, h, i = args.experts, args.top_k, args.hidden, args.inner
    w13, w2 = torch.randn(e, 2 * i, h) * 0.02, torch.randn(e, h, i) * 0.02
    router = torch.randn(e, h) * 0.02
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    for batch in batches:
        x = torch.randn(batch, h)
        weights, ids = lz.moe_route(x @ router.T, k, renormalize=True)
        kernel = lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"]
        fused = lz.fused_moe(x, w13, w2, weights, ids)
        torch.testing.assert_close(fused, loop_hit(x, w13, w2, weights, ids), atol=1e-4, rtol=1e-4)
        t_fused = timed(lambda: lz.fused_moe(x, w13, w2, weights, ids), args.repeats)
        t_all = timed(lambda: loop_all(x, w13, w2, weights, ids), args.repeats)
        t_hit = timed(lambda: loop_hit(x, w13, w2, weights, ids), args.repeats)
        routed = ids.unique().numel()
        read_gb = routed * 3 * i * h * 4 / 1e9  # the routed experts' weights, float32
        rows.append({"batch": batch, "kernel": kernel, "experts_routed": routed, "fused_ms": t_fused * 1e3,
                     "loop_all_ms": t_all * 1e3, "loop_hit_ms": t_hit * 1e3, "routed_weights_gb": read_gb,
                     "fused_gb_s": read_gb / t_fused})
        print(f"batch {batch:3d} ({kernel}): fused {t_fused * 1e3:.2f} ms, loop over all experts {t_all * 1e3:.2f} ms "
              f"({t_all / t_fused:.1f}x), over the hit ones {t_hit * 1e3:.2f} ms ({t_hit / t_fused:.1f}x)")
    half = bf16_rows(args, w13, w2, router, batches)
    kept = quantized_rows(args, w13, w2, router, batches)
    ceiling = read_ceiling()
    report = {"machine": platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average": os.getloadavg(), "read_ceiling_gb_s": ceiling, "shape": {"experts": e, "top_k": k, "hidden": h, "inner": i},
              "repeats": args.repeats, "rows": rows, "bf16": half, "kept_quantized": kept}
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    (out / "moe_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# One MoE layer on the CPU: lz.fused_moe against per-expert loops ({platform.machine()}, "
             f"{torch.get_num_threads()} threads, torch {torch.__version__})", "",
             f"{e} experts, top {k}, hidden {h}, expert intermediate {i}, float32 (a Qwen3-30B-A3B layer scaled down); "
             f"median of {args.repeats} after one warm-up; outputs checked equal first.", "",
             "| batch | lz.fused_moe kernel | experts routed | fused ms | loop over all experts ms | ÷ fused | "
             "loop over hit experts ms | ÷ fused | routed weights GB/s (fused) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | `{r['kernel']}` | {r['experts_routed']} | {r['fused_ms']:.2f} | "
                     f"{r['loop_all_ms']:.2f} | {r['loop_all_ms'] / r['fused_ms']:.1f} | {r['loop_hit_ms']:.2f} | "
                     f"{r['loop_hit_ms'] / r['fused_ms']:.1f} | {r['fused_gb_s']:.1f} |")
    lines += ["", "## Experts in bfloat16", "",
              "The same experts stored in bfloat16: lz.fused_moe over the bf16 stacks (float32 rows) against the "
              "per-expert loop over the hit experts in torch's bf16 matmuls (rows and routing weights cast to bf16). "
              "GB/s: the routed experts' bf16 bytes per second.", "",
              "| batch | kernel | experts routed | fused ms | loop over hit experts, bf16 ms | ÷ fused | "
              "routed GB/s (fused) |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in half:
        lines.append(f"| {r['batch']} | `{r['kernel']}` | {r['experts_routed']} | {r['fused_ms']:.2f} | "
                     f"{r['loop_hit_bf16_ms']:.2f} | {r['loop_hit_bf16_ms'] / r['fused_ms']:.1f} | "
                     f"{r['fused_gb_s']:.1f} |")
    lines += ["", "## Experts kept as a GGUF stores them", "",
              "The same float32 experts quantized by gguf-py to Q4_0 and Q8_0 and read back as infer keeps them. "
              "`fused`: lz.fused_moe_int4 / fused_moe_w8 over the kept stacks (one native call a layer). Against it: "
              "the per-expert loops over the same weights dequantized to float32 (what a loader that dequantizes a "
              "GGUF's experts runs), and over the kept weights one routed expert at a time (lz.linear_int4 / "
              "linear_w8 per expert). GB/s: the routed experts' stored bytes (4.5 / 8.5 bits a weight) per second.",
              "", "| format | batch | kernel | experts routed | fused ms | loop over hit experts, float32 ms | "
              "÷ fused | loop over all experts, float32 ms | ÷ fused | loop over hit experts, kept ms | ÷ fused | "
              "routed GB/s (fused) |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in kept:
        lines.append(f"| {r['format']} | {r['batch']} | `{r['kernel']}` | {r['experts_routed']} | {r['fused_ms']:.2f} | "
                     f"{r['loop_hit_f32_ms']:.2f} | {r['loop_hit_f32_ms'] / r['fused_ms']:.1f} | "
                     f"{r['loop_all_f32_ms']:.2f} | {r['loop_all_f32_ms'] / r['fused_ms']:.1f} | "
                     f"{r['loop_hit_kept_ms']:.2f} | {r['loop_hit_kept_ms'] / r['fused_ms']:.1f} | "
                     f"{r['fused_gb_s']:.1f} |")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    lines += ["", f"Memory read rate, a torch sum over 512 MB of float32: {ceiling:.1f} GB/s. At batch 1 the routed "
              "experts (7 MB in Q4_0, 11 MB in Q8_0, scales included) stay in the caches between calls, and the native "
              "kernel is bound by its arithmetic, about 15 G weights/s a core: 0.3 ms for batch 1's 9.4 M weights on "
              "2 quiet cores, timed in C; the rest of a fused ms is the Python call and the other processes on the "
              "cores.", "",
              f"Load average at the end: {load} (a 2-core machine: read the ratios, not the absolutes).", "",
              "Reproduce: `python benchmarks/moe_cpu.py`."]
    (out / "moe_cpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
