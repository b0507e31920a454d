"""One mixture-of-experts layer of the Qwen3-30B-A3B shape on the GPU: lz.fused_moe (the kernel layerzero picks) at
batch 1 to 256 against the bytes it must read (the routed experts' weights, each once) at the device's copy
bandwidth; beside it both Triton paths (the grouped GEMM and the sort-free decode path, which sets where
layerzero's MOE_DECODE_PAIRS switches), the gathered batched-matmul path and a per-expert loop over the same weights;
the kernels replayed from a CUDA graph.

    python benchmarks/moe_gpu.py [--batches 1,2,4,8,16,64,256]

Random bf16 weights: hidden 2048, 128 experts, top 8, expert intermediate 768 (routing from a random router).
Median of 50 CUDA-event-timed calls after warm-up. Writes moe_gpu_<gpu>.{json,md} under OUT_DIR (default
benchmarks/reports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import layerzero as lz
from layerzero.kernels.reference.moe import fused_moe_gathered
from layerzero.kernels.triton import moe as triton_moe, moe_decode as triton_moe_decode

HIDDEN, EXPERTS, TOP_K, INNER = 2048, 128, 8, 768


def timed(fn, repeats: int = 50, graph: bool = False) -> float:
    """Median seconds of `fn` on the device; with `graph`, replays of it captured in a CUDA graph (as a decode step
    runs it: no host launch cost)."""
    for _ in range(5):
        fn()
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def loop_hit(x, w13, w2, weights, ids):
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in ids.unique().tolist():
        rows, slot = torch.where(ids == e)
        gate, up = F.linear(x[rows], w13[e]).chunk(2, dim=-1)
        out.index_add_(0, rows, F.linear(F.silu(gate) * up, w2[e]).float() * weights[rows, slot, None])
    return out.to(x.dtype)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / timed(lambda: b.copy_(a), 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,2,4,8,16,64,256")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    w13 = torch.randn(EXPERTS, 2 * INNER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INNER, device="cuda", dtype=torch.bfloat16) * 0.02
    router = torch.randn(EXPERTS, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    expert_bytes = 3 * INNER * HIDDEN * 2
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        weights, ids = lz.moe_route(x @ router.T, TOP_K, renormalize=True)
        kernel = lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"]
        t = timed(lambda: lz.fused_moe(x, w13, w2, weights, ids), graph=True)
        t_eager = timed(lambda: lz.fused_moe(x, w13, w2, weights, ids))
        t_grouped = timed(lambda: triton_moe.fused_moe(x, w13, w2, weights, ids), graph=True)
        t_decode = timed(lambda: triton_moe_decode.fused_moe_decode(x, w13, w2, weights, ids), graph=True)
        t_loop = timed(lambda: loop_hit(x, w13, w2, weights, ids))
        t_gather = timed(lambda: fused_moe_gathered(x, w13, w2, weights, ids)) if batch * TOP_K <= 128 else float("nan")
        routed = ids.unique().numel()
        bound = routed * expert_bytes / bw
        rows.append({"batch": batch, "kernel": kernel, "experts_routed": routed, "fused_us": t * 1e6,
                     "fused_eager_us": t_eager * 1e6, "grouped_us": t_grouped * 1e6, "decode_path_us": t_decode * 1e6,
                     "bound_us": bound * 1e6, "fraction_of_bound": bound / t, "loop_us": t_loop * 1e6,
                     "gathered_us": t_gather * 1e6})
        print(rows[-1])
    gpu = torch.cuda.get_device_name()
    report = {"gpu": gpu, "torch": torch.__version__, "copy_bandwidth_gb_s": bw / 1e9, "rows": rows,
              "shape": {"hidden": HIDDEN, "experts": EXPERTS, "top_k": TOP_K, "inner": INNER}}
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    slug = gpu.lower().replace("nvidia", "").split()[0]
    (out / f"moe_gpu_{slug}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# One MoE layer (Qwen3-30B-A3B shape) on {gpu}", "",
             f"hidden {HIDDEN}, {EXPERTS} experts, top {TOP_K}, expert intermediate {INNER}, bf16 random weights; "
             f"copy bandwidth {bw / 1e9:.0f} GB/s; bound = the routed experts' weights read once at copy bandwidth; "
             f"median of 50 CUDA-event-timed calls; lz.fused_moe replayed from a CUDA graph as a decode step runs it (eager: "
             f"with the host's launches). torch {torch.__version__}.", "",
             "| batch | kernel | experts routed | lz.fused_moe µs (graph) | eager µs | bound µs | fraction of bound | "
             "grouped GEMM µs | decode path µs | per-expert loop µs | gathered bmm µs |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | `{r['kernel']}` | {r['experts_routed']} | {r['fused_us']:.1f} | "
                     f"{r['fused_eager_us']:.1f} | "
                     f"{r['bound_us']:.1f} | {r['fraction_of_bound']:.2f} | {r['grouped_us']:.1f} | "
                     f"{r['decode_path_us']:.1f} | {r['loop_us']:.1f} | {r['gathered_us']:.1f} |")
    lines += ["", "Reproduce: `bash scripts/gpu_moe.sh` (device tool), or `python benchmarks/moe_gpu.py`."]
    (out / f"moe_gpu_{slug}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
