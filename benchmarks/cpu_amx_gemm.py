"""The CPU's bf16 GEMMs on a small model's shapes: the AMX kernel (`native.linear_bf16_amx_cpu`) against oneDNN's
packed bf16 GEMM (`onednn.linear`, what layerzero chose before), cold and hot weights, beside the memory bound.

    .venv/bin/python benchmarks/cpu_amx_gemm.py [--rounds 7] [--out benchmarks/reports/cpu_amx_gemm]

The shapes are SmolLM2-135M's four projections (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536) over 30
layers: a "model" pass multiplies each layer's own weights once (270 MB of bf16 weights: read from memory, as a
forward reads them), at 1 / 16 / 128 / 2,048 rows of bf16 x. "hot" repeats one layer's weights 30 times instead
(they stay in cache: the kernel's arithmetic alone). Each round times both kernels in alternating order; medians.
The bound: the weights' bytes at the machine's read bandwidth (a 512 MB torch sum, measured here).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from layerzero.kernels import onednn
from layerzero.kernels.native import amx

from bench_serving import hardware_info
from report_files import write_report

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of qkv, o, gate_up, down
LAYERS = 30
KERNELS = {"amx": amx.linear, "onednn": onednn.linear}


def read_bandwidth() -> float:
    """GB/s of a 512 MB sum (both cores)."""
    a = torch.ones(128 * 2**20)
    a.sum()
    started = time.perf_counter()
    for _ in range(3):
        a.sum()
    return a.numel() * 4 * 3 / (time.perf_counter() - started) / 1e9


def alternated(measures: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """The median of each measure over `rounds` rounds, the measures taken in turn, their order reversed every other
    round (the machine drifts: each gets the same share of early and late turns)."""
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for r in range(rounds):
        for name in (list(measures) if r % 2 == 0 else list(reversed(measures))):
            samples[name].append(measures[name]())
    return {name: statistics.median(v) for name, v in samples.items()}


def checked(kernels: dict[str, Callable[..., torch.Tensor]], weights: list[torch.Tensor],
            xs: dict[int, torch.Tensor]) -> None:
    """Every kernel's product with each weight against the float64 one (float32 tolerances) before it is timed."""
    for w in weights:
        want = xs[w.shape[1]].double() @ w.double().T
        for fn in kernels.values():
            torch.testing.assert_close(fn(xs[w.shape[1]], w).double(), want, rtol=1e-4, atol=1e-3)


def timed(fn, weights: list[list[torch.Tensor]], xs: dict[int, torch.Tensor]) -> float:
    started = time.perf_counter()
    for layer in weights:
        for w in layer:
            fn(xs[w.shape[1]], w)
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", default="1,16,128,2048")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/reports/cpu_amx_gemm")
    args = p.parse_args()
    if not amx.available():
        raise SystemExit("this CPU has no AMX (amx_bf16): nothing to compare")
    torch.manual_seed(0)
    cold = [[torch.randn(n, k).bfloat16() for n, k in SHAPES] for _ in range(LAYERS)]
    hot = [cold[0]] * LAYERS
    weight_bytes = sum(n * k * 2 for n, k in SHAPES) * LAYERS
    bandwidth = read_bandwidth()
    rows_out = []
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k).bfloat16() for k in {k for _, k in SHAPES}}
        flops = 2 * m * weight_bytes / 2
        for kind, weights in (("cold", cold), ("hot", hot)):
            for fn in KERNELS.values():
                timed(fn, weights, xs)  # packs each weight once
            med = alternated({name: functools.partial(timed, fn, weights, xs) for name, fn in KERNELS.items()},
                             args.rounds)
            row = {"rows": m, "weights": kind, **{f"{name}_ms": round(ms, 2) for name, ms in med.items()},
                   "amx_gb_s": round(weight_bytes / med["amx"] / 1e6, 1),
                   "amx_gflop_s": round(flops / med["amx"] / 1e6),
                   "onednn_gflop_s": round(flops / med["onednn"] / 1e6),
                   "speedup": round(med["onednn"] / med["amx"], 2)}
            rows_out.append(row)
            print(row, flush=True)
    bound_ms = weight_bytes / bandwidth / 1e6
    hw = hardware_info()
    lines = [
        "# bf16 GEMMs on the CPU: the AMX kernel against oneDNN's packed bf16 GEMM",
        "",
        f"CPU: {hw['cpu']}, {hw['cpu_cores']} cores. torch {torch.__version__}. SmolLM2-135M's projections x {LAYERS} layers "
        f"({weight_bytes / 1e6:.0f} MB of bf16 weights); medians of {args.rounds} alternating rounds. Read bandwidth "
        f"(512 MB sum): {bandwidth:.1f} GB/s, so streaming the weights once takes at least {bound_ms:.1f} ms.",
        "",
        "| rows | weights | AMX ms | oneDNN ms | oneDNN / AMX | AMX GB/s of weights | AMX GFLOP/s | oneDNN GFLOP/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['rows']} | {r['weights']} | {r['amx_ms']} | {r['onednn_ms']} | {r['speedup']} | {r['amx_gb_s']} | "
          f"{r['amx_gflop_s']} | {r['onednn_gflop_s']} |" for r in rows_out),
        "",
        f"Reproduce: `.venv/bin/python benchmarks/cpu_amx_gemm.py --rounds {args.rounds}`.",
    ]
    write_report(args.out, {"hardware": hw, "bandwidth_gb_s": bandwidth, "weight_bytes": weight_bytes, "rows": rows_out},
                 "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
