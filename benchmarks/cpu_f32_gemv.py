"""A float32 model's decode GEMMs on the CPU: the native float32 GEMV (`native.linear_f32_cpu`) against oneDNN's packed
float32 GEMM (`onednn.linear`, what layerzero chose before), beside the memory bound.

    .venv/bin/python benchmarks/cpu_f32_gemv.py [--rounds 7] [--out benchmarks/reports/cpu_f32_gemv]

SmolLM2-135M's four projections over 30 layers and its 49152 x 576 head, float32 (540 MB: read from memory, as a
decode step reads them), at 1-16 rows; each round times both kernels in alternating order; medians. Every result is
checked against a float64 product first.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from layerzero.kernels import onednn
from layerzero.kernels.native.linear import linear_f32

from bench_serving import hardware_info
from cpu_amx_gemm import LAYERS, SHAPES, alternated, checked, read_bandwidth, timed
from report_files import write_report

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {"native": linear_f32, "onednn": onednn.linear}
HEAD = (49152, 576)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/reports/cpu_f32_gemv")
    args = p.parse_args()
    torch.manual_seed(0)
    weights = [[torch.randn(n, k) for n, k in SHAPES] for _ in range(LAYERS)] + [[torch.randn(*HEAD)]]
    weight_bytes = sum(w.numel() * 4 for layer in weights for w in layer)
    bandwidth = read_bandwidth()
    rows_out = []
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
        checked(KERNELS, weights[0] + weights[-1], xs)
        for fn in KERNELS.values():
            timed(fn, weights, xs)  # oneDNN packs each weight once
        med = alternated({name: functools.partial(timed, fn, weights, xs) for name, fn in KERNELS.items()},
                         args.rounds)
        row = {"rows": m, **{f"{name}_ms": round(ms, 2) for name, ms in med.items()},
               **{f"{name}_gb_s": round(weight_bytes / ms / 1e6, 1) for name, ms in med.items()},
               "speedup": round(med["onednn"] / med["native"], 2)}
        rows_out.append(row)
        print(row, flush=True)
    hw = hardware_info()
    lines = [
        "# float32 decode GEMMs on the CPU: the native GEMV against oneDNN's packed float32 GEMM",
        "",
        f"CPU: {hw['cpu']}, {hw['cpu_cores']} cores. torch {torch.__version__}. SmolLM2-135M's projections x {LAYERS} "
        f"layers and its head ({weight_bytes / 1e6:.0f} MB of float32 weights); medians of {args.rounds} alternating "
        f"rounds. Read bandwidth (512 MB sum): {bandwidth:.1f} GB/s, so reading the weights once takes at least "
        f"{weight_bytes / bandwidth / 1e6:.1f} ms.",
        "",
        "| rows | native ms | oneDNN ms | oneDNN / native | native GB/s | oneDNN GB/s |",
        "|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['rows']} | {r['native_ms']} | {r['onednn_ms']} | {r['speedup']} | {r['native_gb_s']} | "
          f"{r['onednn_gb_s']} |" for r in rows_out),
        "",
        f"Reproduce: `.venv/bin/python benchmarks/cpu_f32_gemv.py --rounds {args.rounds}`.",
    ]
    write_report(args.out, {"hardware": hw, "bandwidth_gb_s": bandwidth, "weight_bytes": weight_bytes,
                            "rows": rows_out}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
