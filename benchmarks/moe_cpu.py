"""One mixture-of-experts layer on the CPU: layerzero's fused_moe (the path it selects) against per-expert Python loops
over the same stacked weights, batch 1 (decode) to 64, and the bytes each reads.

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

import torch
import torch.nn.functional as F

import layerzero as lz


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


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    for batch in (int(b) for b in args.batches.split(",")):
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
    report = {"machine": platform.machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "shape": {"experts": e, "top_k": k, "hidden": h, "inner": i}, "repeats": args.repeats, "rows": rows}
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
    lines += ["", "Reproduce: `python benchmarks/moe_cpu.py`."]
    (out / "moe_cpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
