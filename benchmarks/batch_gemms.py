"""The projection GEMMs of a batch-64..256 decode step: cuBLAS, cuBLASLt and Triton templates, as a FLOP rate.

    python benchmarks/batch_gemms.py --out STEM [--autotune]   # writes STEM.md and STEM.json

At 256 rows a Llama-3.2-1B decode step is GEMM-bound, and its projections are short and wide or tall and thin
(N = 2048 for O and down): a 128 x 128 tile grid leaves most of the SMs idle. For each projection and M in --rows,
y [M, N] = x [M, K] @ W [N, K]^T in bf16 is timed inside a CUDA graph (median of 10 replays) over weight copies past
L2, as in a decode step, with: torch.mm on cuBLAS (the default), torch.mm with cuBLASLt preferred, the same product
with the weight stored transposed ([K, N]: x @ W^T as an NN GEMM) and, with --autotune, inductor's max-autotune
Triton templates (what a Triton GEMM reaches at its best tile). TFLOP/s = 2 M N K / time.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from device_rates import graph_us
from gemv_bandwidth import SHAPES
from report_files import write_report

_COPY_BYTES = 256 * 2**20


def _weights(n: int, k: int) -> list[torch.Tensor]:
    copies = max(2, -(-_COPY_BYTES // (n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]


def _time(make: Callable[[torch.Tensor], Callable[[], object]], ws: list[torch.Tensor]) -> float:
    return graph_us([make(w) for w in ws])


def _variants(x: torch.Tensor, ws: list[torch.Tensor], autotune: bool) -> dict[str, float]:
    y = torch.empty(x.shape[0], ws[0].shape[0], device="cuda", dtype=torch.bfloat16)
    out: dict[str, float] = {}
    torch.backends.cuda.preferred_blas_library("cublas")
    out["cublas"] = _time(lambda w: lambda: torch.mm(x, w.t(), out=y), ws)
    wts = [w.t().contiguous() for w in ws]
    out["cublas_nn"] = _time(lambda wt: lambda: torch.mm(x, wt, out=y), wts)
    del wts
    torch.backends.cuda.preferred_blas_library("cublaslt")
    out["cublaslt"] = _time(lambda w: lambda: torch.mm(x, w.t(), out=y), ws)
    torch.backends.cuda.preferred_blas_library("cublas")
    if autotune:
        import torch._inductor.config as inductor_config

        inductor_config.max_autotune_gemm_backends = "TRITON"
        fn = torch.compile(lambda a, b: a @ b.t(), mode="max-autotune-no-cudagraphs", dynamic=False)
        out["triton_autotune"] = _time(lambda w: lambda: fn(x, w), ws)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--autotune", action="store_true", help="also time inductor's Triton GEMM templates")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, (n, k) in SHAPES[args.shape].items():
        ws = _weights(n, k)
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            times = _variants(x, ws, args.autotune and m == max(args.rows))
            flops = 2 * m * n * k
            row = {"projection": name, "m": m, "n": n, "k": k,
                   **{f"{v}_us": t for v, t in times.items()},
                   **{f"{v}_tflops": flops / t / 1e6 for v, t in times.items()}}
            rows.append(row)
            print(name, m, {v: round(t, 2) for v, t in times.items()}, flush=True)
        del ws
    variants = list(dict.fromkeys(key[:-3] for row in rows for key in row if key.endswith("_us")))
    table = ["| projection | M | " + " | ".join(f"{v} µs (TFLOP/s)" for v in variants) + " |",
             "|---|---:|" + "---:|" * len(variants)]
    for row in rows:
        cells = [f"{row[v + '_us']:.1f} ({row[v + '_tflops']:.0f})" if v + "_us" in row else "" for v in variants]
        table.append(f"| {row['projection']} | {row['m']} | " + " | ".join(cells) + " |")
    per_m = {m: statistics.fsum(r["cublas_us"] for r in rows if r["m"] == m) for m in args.rows}
    text = "\n".join([f"# Decode-batch projection GEMMs, {args.shape} ({torch.cuda.get_device_name()})", "",
                      f"`python benchmarks/batch_gemms.py`; torch {torch.__version__}; bf16; CUDA graph of >= 20 "
                      "calls over weight copies past L2, median of 10 replays.", "", *table, "",
                      "cuBLAS µs summed over one layer's projections and the LM head: "
                      + ", ".join(f"M={m}: {t:.1f}" for m, t in per_m.items())])
    write_report(args.out, {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "rows": rows}, text)


if __name__ == "__main__":
    main()
