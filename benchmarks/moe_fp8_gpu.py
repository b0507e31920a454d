"""One mixture-of-experts layer of the Qwen3-30B-A3B shape on the GPU with its experts in bf16 and the same experts
in float8 e4m3 (128 x 128 block scales, as Qwen's FP8 checkpoints store them): lz.fused_moe against lz.fused_moe_w8
(the kernel layerzero picks, and both Triton paths), each against the bytes it must read (the routed experts once,
1 byte a weight for fp8) at the device's copy bandwidth; kernels replayed from a CUDA graph.

    python benchmarks/moe_fp8_gpu.py [--batches 1,4,16,64,256] [--out benchmarks/reports/moe_fp8_gpu_h200]

Random weights: hidden 2048, 128 experts, top 8, expert intermediate 768, routing from a random router.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import layerzero as lz
from infer.models.quant import W8Experts
from layerzero.kernels.triton import moe as triton_moe, moe_decode as triton_moe_decode
from moe_gpu import EXPERTS, HIDDEN, INNER, TOP_K, copy_bandwidth, timed
from report_files import write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,4,16,64,256")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/reports/moe_fp8_gpu_h200"))
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    w13 = torch.randn(EXPERTS, 2 * INNER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INNER, device="cuda", dtype=torch.bfloat16) * 0.02
    q13, q2 = W8Experts.quantize(w13), W8Experts.quantize(w2)
    router = torch.randn(EXPERTS, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    gpu = torch.cuda.get_device_name()
    result = {"gpu": gpu, "torch": torch.__version__, "copy_bandwidth_gb_s": bw / 1e9, "rows": []}
    lines = [f"# One MoE layer, bf16 and fp8 experts ({gpu})", "",
             f"hidden {HIDDEN}, {EXPERTS} experts, top {TOP_K}, intermediate {INNER}; copy bandwidth {bw / 1e9:.0f} "
             "GB/s; bound = the routed experts' bytes at copy bandwidth (bf16: 2 bytes a weight, fp8: 1 plus a "
             "float32 scale per 128 x 128 block); median of 50 graph replays. `python benchmarks/moe_fp8_gpu.py`.", "",
             "| batch | experts routed | bf16 kernel | bf16 µs | of bound | fp8 kernel | fp8 µs | of bound | "
             "fp8 grouped µs | fp8 decode path µs | fp8 ÷ bf16 time |", "|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    per_expert = 3 * INNER * HIDDEN
    for batch in (int(b) for b in args.batches.split(",")):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        weights, ids = lz.moe_route(x @ router.T, TOP_K, renormalize=True)
        fp8 = (x, q13.weight, q13.scale, q2.weight, q2.scale, weights, ids)
        k16 = lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"]
        k8 = lz.which("fused_moe_w8", *fp8, block_size=q13.block_size)["kernel_id"]
        t16 = timed(lambda: lz.fused_moe(x, w13, w2, weights, ids), graph=True)
        t8 = timed(lambda: lz.fused_moe_w8(*fp8, block_size=q13.block_size), graph=True)
        t8g = timed(lambda: triton_moe.fused_moe_w8(*fp8, block_size=q13.block_size), graph=True)
        t8d = timed(lambda: triton_moe_decode.fused_moe_w8_decode(*fp8, block_size=q13.block_size), graph=True) \
            if batch <= 32 else float("nan")
        routed = ids.unique().numel()
        b16 = routed * per_expert * 2 / bw
        b8 = routed * per_expert * (1 + 4 / (128 * 128)) / bw
        row = {"batch": batch, "experts_routed": routed, "bf16_kernel": k16, "bf16_us": t16 * 1e6,
               "bf16_fraction": b16 / t16, "fp8_kernel": k8, "fp8_us": t8 * 1e6, "fp8_fraction": b8 / t8,
               "fp8_grouped_us": t8g * 1e6, "fp8_decode_us": t8d * 1e6}
        result["rows"].append(row)
        lines.append(f"| {batch} | {routed} | `{k16}` | {t16 * 1e6:.1f} | {b16 / t16:.2f} | `{k8}` | {t8 * 1e6:.1f} | "
                     f"{b8 / t8:.2f} | {t8g * 1e6:.1f} | {t8d * 1e6:.1f} | {t8 / t16:.2f} |")
        print(lines[-1], flush=True)
        write_report(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()
