"""GPU decode, prefill and startup of infer on real model shapes (random bf16 weights), transformers as the peer.

    python benchmarks/gpu_decode [--models llama-3.2-1b,qwen3-1.7b,...] [--out DIR] [--budget-s 450]
    bash scripts/gpu_decode.sh                              # on the lent GPU: this, then decode profiles
    python benchmarks/gpu_decode --smoke --out /tmp/gd   # the whole pipeline on CPU with a tiny shape

One run, one report: gpu_decode_<gpu>.{json,md} in DIR (default $OUT, else benchmarks/reports/), rewritten
after every measurement so a timeout still leaves data. In order:
- device copy bandwidth (1 GiB device-to-device copy, read + write bytes / median time) and bf16 GEMM rate;
- time from process start to a ready LLM (a child process, Llama-3.2-1B with CUDA graphs);
- per model shape, with CUDA graphs and without: batch-1 decode tok/s (first to last output of a
  256-token greedy reply to a 128-token prompt, median of 3) against the roofline copy_bw / weight bytes;
  steady-state decode throughput at batch 16/64/256 (every power of two up to 256 for Llama-3.2-1B: each
  graph bucket) against max((weights + KV read) / copy_bw, FLOPs / GEMM rate);
  prefill tok/s of 1k and 8k-token prompts; the graphs' capture time and memory;
- transformers' generate with a static cache (eager: disable_compile) on a random model of the same config,
  decode rate (N-1) / (t(N) - t(1)); if time is left, the auto-compiled variant on Llama-3.2-1B.
Each item that fails records its error and the run goes on; items are skipped once --budget-s is spent.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: model_shapes and this package

import model_shapes as ms  # noqa: E402
from gpu_decode.baselines import copy_bandwidth, device_info, gemm_rate, gpu_slug, hf_decode
from gpu_decode.engine import engine_suite, kv_cache_gb, model_batches, ready_time
from gpu_decode.plan import MODE_NAMES, SMOKE, Plan, batch_context
from gpu_decode.recorder import Recorder
from gpu_decode.report import markdown

REPORTS = Path(__file__).parent / "reports"


def bench_model(rec: Recorder, name: str) -> None:
    """Every engine mode, then transformers; each LLM or transformers model is freed before the next."""
    plan = rec.plan
    entry = rec.report["models"][name] = {
        "hf_config": ms.SHAPES[name], "weight_bytes": ms.weight_bytes(ms.model_config(name)),
        "kv_cache_memory_gb": kv_cache_gb(name, plan), "batches": model_batches(name, plan),
        "batch_context": batch_context(plan), "runs": {},
    }
    for graphs in plan.graph_modes:
        run: dict[str, Any] = {}
        entry["runs"][MODE_NAMES[graphs]] = run
        rec.attempt(entry["runs"], MODE_NAMES[graphs], lambda r=run, g=graphs: engine_suite(r, rec, name, g),
                    need_s=20)
    rec.attempt(entry, "transformers", lambda: hf_decode(name, plan, compiled=False), need_s=20)


def parse_args() -> tuple[Plan, Path, bool]:
    """The plan (defaults, --smoke, then --models and --budget-s), the output folder and whether this is a smoke run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPORTS)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(ms.SHAPES)}")
    parser.add_argument("--budget-s", type=float, default=None, help="skip remaining items after this many seconds")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, tiny counts (checks the pipeline)")
    args = parser.parse_args()
    overrides: dict[str, Any] = dict(SMOKE) if args.smoke else {}
    if args.models:
        overrides["models"] = tuple(args.models.split(","))
    if args.budget_s is not None:
        overrides["budget_s"] = args.budget_s
    plan = Plan(**overrides)
    unknown = [m for m in plan.models if m not in ms.SHAPES]
    if unknown:
        parser.error(f"unknown model shapes {unknown}; known: {', '.join(ms.SHAPES)}")
    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --smoke)")
    return plan, args.out, args.smoke


def main() -> None:
    """Hardware, startup, every model, transformers compiled, startup again; then print the report."""
    plan, out, smoke = parse_args()
    torch.manual_seed(0)
    info = device_info(plan)
    rec = Recorder(plan, out, gpu_slug(info, smoke))
    rec.report = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "wall_s": 0.0},
                  "hardware": info, "plan": dataclasses.asdict(plan), "device": {}, "ready": {}, "models": {}}
    rec.attempt(rec.report["device"], "copy", lambda: copy_bandwidth(plan))
    rec.attempt(rec.report["device"], "gemm", lambda: gemm_rate(plan))
    rec.attempt(rec.report["ready"], "first", lambda: ready_time(rec), need_s=30)
    for name in plan.models:
        bench_model(rec, name)
    for name in plan.hf_compiled_models:
        if name in rec.report["models"]:
            rec.attempt(rec.report["models"][name], "transformers_compiled", lambda n=name: hf_decode(n, plan, True),
                        need_s=90)
    if plan.ready_again:
        rec.attempt(rec.report["ready"], "again_warm_triton_cache", lambda: ready_time(rec), need_s=30)
    rec.save()
    rec.log(f"wrote {out / f'gpu_decode_{rec.slug}.md'}")
    print(markdown(rec.report))


if __name__ == "__main__":
    main()
