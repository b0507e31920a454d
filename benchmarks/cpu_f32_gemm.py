"""A float32 model's prefill GEMMs on an AVX2 CPU: the native float32 GEMM (`native.linear_f32_gemm_cpu`) against
oneDNN's packed float32 GEMM (`onednn.linear`, what layerzero chose before), in GFLOP/s; with `--model`, whole
128-token prefills of that HF directory with each kernel locked in turn, in one process.

    .venv/bin/python benchmarks/cpu_f32_gemm.py [--rounds 7] [--model .bench/hf/smollm2-135m-fp32]

SmolLM2-135M's four projections (one layer's shapes, float32) at 17-1,920 rows; each round times both kernels in
alternating order; medians. Every result is checked against a float64 product first.
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from pathlib import Path

import torch

from layerzero.kernels import onednn
from layerzero.kernels.native import gemm
from layerzero.policy.state import lock, unlock

from bench_serving import hardware_info
from cpu_amx_gemm import SHAPES, alternated, checked, timed
from report_files import write_report

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {"native": gemm.linear, "onednn": onednn.linear}
REPEATS = 5  # passes over the four projections per timing


def per_pass(fn, weights: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    """ms of one pass of `fn` over the projections, the mean of REPEATS."""
    return timed(fn, [weights] * REPEATS, xs) / REPEATS


def prefills(model: Path, rounds: int, prompts: int) -> dict[str, float]:
    """Median ms of `prompts` 128-token prompts prefilled in one step (and one token sampled), each kernel locked for
    `linear` in turn, in alternating order."""
    from infer import LLM
    from infer.sampling.params import SamplingParams

    llm = LLM(str(model), dtype="float32")
    rng, params = random.Random(0), SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def once() -> float:
        started = time.perf_counter()
        for _ in range(prompts):
            llm.engine.add_request([rng.randrange(1000, 30000) for _ in range(128)], params)
        while llm.engine.has_unfinished():
            llm.engine.step()
        return (time.perf_counter() - started) * 1e3

    def locked(kernel_id: str) -> float:
        lock("linear", kernel_id)
        once()  # the first call after a switch packs weights
        return once()

    med = alternated({"native": functools.partial(locked, "native.linear_f32_gemm_cpu"),
                      "onednn": functools.partial(locked, "onednn.linear")}, rounds)
    unlock("linear")
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", default="17,32,64,128,512,1920")
    p.add_argument("--model", type=Path, default=None, help="an HF float32 directory for whole-prefill rounds")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/reports/cpu_f32_gemm")
    args = p.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(n, k) for n, k in SHAPES]
    rows_out = []
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
        flops = 2 * m * sum(n * k for n, k in SHAPES)
        checked(KERNELS, weights, xs)
        med = alternated({name: functools.partial(per_pass, fn, weights, xs) for name, fn in KERNELS.items()},
                         args.rounds)
        row = {"rows": m, **{f"{name}_ms": round(ms, 3) for name, ms in med.items()},
               **{f"{name}_gflop_s": round(flops / ms / 1e6, 1) for name, ms in med.items()},
               "speedup": round(med["onednn"] / med["native"], 2)}
        rows_out.append(row)
        print(row, flush=True)
    whole = {}
    if args.model is not None:
        for prompts in (1, 15):
            whole[prompts] = prefills(args.model, args.rounds, prompts)
            print(prompts, whole[prompts], flush=True)
    hw = hardware_info()
    lines = [
        "# float32 prefill GEMMs on an AVX2 CPU: the native GEMM against oneDNN's packed float32 GEMM",
        "",
        f"CPU: {hw['cpu']}, {hw['cpu_cores']} cores. torch {torch.__version__}. SmolLM2-135M's four projections "
        f"(qkv, o, gate_up, down), float32; medians of {args.rounds} alternating rounds.",
        "",
        "| rows | native ms | oneDNN ms | oneDNN / native | native GFLOP/s | oneDNN GFLOP/s |",
        "|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['rows']} | {r['native_ms']} | {r['onednn_ms']} | {r['speedup']} | {r['native_gflop_s']} | "
          f"{r['onednn_gflop_s']} |" for r in rows_out),
    ]
    if whole:
        lines += ["", f"Whole prefills of `{args.model.name}` in one process, `linear` locked to each kernel in turn:",
                  "", "| 128-token prompts in the step | native ms | oneDNN ms | oneDNN / native |",
                  "|---:|---:|---:|---:|",
                  *(f"| {n} | {w['native']:.1f} | {w['onednn']:.1f} | {w['onednn'] / w['native']:.2f} |"
                    for n, w in whole.items())]
    model = f" --model {args.model}" if args.model else ""
    lines += ["", f"Reproduce: `.venv/bin/python benchmarks/cpu_f32_gemm.py --rounds {args.rounds}{model}`."]
    write_report(args.out, {"hardware": hw, "rows": rows_out, "prefill_ms": whole}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
