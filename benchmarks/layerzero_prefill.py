"""Eager prefill as a fraction of the GEMM rate: what per-call host cost leaves of the GPU on a 1k-token prompt.

One prompt of `--tokens` through the engine without CUDA graphs (prefill never replays graphs), on a random-weight
model shape, median of `--repeats` after a warm-up; FLOPs as in gpu_decode (projections, causal attention, one
LM-head row) ÷ seconds ÷ the bf16 GEMM rate (8192³ matmul) measured in the same run. Rows: the prompt in one
engine step (prefill_chunk_size = tokens); the same with every bound site reset first, so each call resolves
through `dispatch` (call key, call cache) as before binding existed; the engine's default 512-token chunks (two
forwards for 1k tokens); and the model's forward alone (plus the last row's logits), without the engine. GPU only.

    python benchmarks/layerzero_prefill.py --out benchmarks/reports/layerzero_prefill_h100
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch

import model_shapes as ms
from gpu_decode.baselines import gemm_rate
from gpu_decode.engine import engine_options, prefill, prefill_once
from gpu_decode.plan import Plan, prompt_ids
from report_files import write_report
from infer import LLM
from infer.models.forward_batch import ForwardBatch
from layerzero.dispatch.bound import sites_of

REPORTS = Path(__file__).resolve().parent / "reports"


def _profile(llm: LLM, ids: list[int], device: str) -> str:
    """Device busy time against wall time, the top device kernels, and the top host functions of one prefill."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = prefill_once(llm, ids, device)
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, end = 0, None
    for start, stop in spans:  # union of kernel intervals
        if end is None or start > end:
            busy, end = busy + stop - start, stop
        elif stop > end:
            busy, end = busy + stop - end, stop
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
    host = cProfile.Profile()
    host.enable()
    prefill_once(llm, ids, device)
    host.disable()
    stream = io.StringIO()
    pstats.Stats(host, stream=stream).sort_stats("cumulative").print_stats(40)
    return (f"wall {wall * 1e3:.2f} ms, device busy {busy / 1e3:.2f} ms ({len(spans)} kernels)\n\n```\n{table}\n```\n\n"
            f"cProfile (cumulative; slows the host, proportions only):\n\n```\n{stream.getvalue()[-9000:]}\n```")


def _forward_only(llm: LLM, ids: list[int], repeats: int) -> float:
    """Median seconds of the model's forward over the prompt plus the last row's logits, without the engine."""
    model = llm.engine.runner.model
    x = torch.tensor(ids, device="cuda")
    batch = ForwardBatch.for_prompts([len(ids)], "cuda")
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.compute_logits(model(x, batch)[-1:])
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPORTS / "layerzero_prefill")
    parser.add_argument("--profile", action="store_true", help="also profile one bound prefill (device kernels, host)")
    args = parser.parse_args()
    plan = Plan(models=(args.model,), prefill_lens=(args.tokens,), prefill_repeats=args.repeats,
                max_seq_len=args.tokens + 256, max_batch_size=8)
    gemm = gemm_rate(plan)
    cfg = ms.model_config(args.model)
    flops = ms.prefill_flops(cfg, args.tokens)
    with tempfile.TemporaryDirectory() as root:
        path = ms.write_model_dir(args.model, Path(root))
        options = engine_options(args.model, False, plan)
        llm = LLM(str(path), **options | {"prefill_chunk_size": args.tokens})
        bound = prefill(llm, args.tokens, plan)
        ids = prompt_ids(llm.runner.vocab_size, args.tokens, seed=args.tokens)
        profile = _profile(llm, ids, plan.device) if args.profile else None
        forward = _forward_only(llm, ids, args.repeats)
        unbound_runs = []
        for _ in range(args.repeats):  # every site resolves through dispatch's call cache again
            for site in sites_of(llm.engine.runner.model).values():
                site.reset()
            unbound_runs.append(prefill_once(llm, ids, plan.device))
        del llm
        chunked = prefill(LLM(str(path), **options), args.tokens, plan)
    rows = {"bound": bound["median_s"], "dispatch": statistics.median(unbound_runs),
            "bound, 512-token chunks": chunked["median_s"], "forward only": forward}
    result = {"model": args.model, "tokens": args.tokens, "flops": flops, "gemm_tflops": gemm["tflops"],
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "seconds": rows, "bound_runs": bound["seconds"], "dispatch_runs": unbound_runs,
              "fraction_of_gemm": {k: flops / s / 1e12 / gemm["tflops"] for k, s in rows.items()}}
    lines = [f"# Eager prefill vs the GEMM rate ({args.model}, {args.tokens} tokens)", "",
             f"{result['gpu']}, torch {result['torch']}; bf16 GEMM 8192³ {gemm['tflops']:.0f} TFLOP/s; "
             f"{flops / 1e12:.2f} TFLOP per prefill; engine end to end (add request -> first token), no CUDA graphs, "
             f"median of {args.repeats}.", "",
             "| call sites | seconds | tok/s | TFLOP/s | ÷ GEMM rate |", "|---|---:|---:|---:|---:|"]
    for name, s in rows.items():
        lines.append(f"| {name} | {s * 1e3:.2f} ms | {args.tokens / s:.0f} | {flops / s / 1e12:.1f} | "
                     f"{result['fraction_of_gemm'][name]:.2f} |")
    lines += ["", "`bound`: the models' call sites bound once (as served), the prompt in one step. `dispatch`: every site "
              "reset before the prefill, so each call resolves through dispatch (call key, call cache) and re-binds. "
              "`512-token chunks`: the engine's default prefill_chunk_size, two forwards. `forward only`: "
              "`model(ids)` and the last row's logits, synchronized, without the engine."]
    if profile is not None:
        lines += ["", "## Profile of one bound prefill", "", profile]
    write_report(args.out, result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
