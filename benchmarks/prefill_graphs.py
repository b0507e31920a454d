"""Prefill as a fraction of the bf16 GEMM rate, with prefill graphs and without, and a 1k prompt's TTFT on the server.

    python benchmarks/prefill_graphs.py --models llama-3.2-1b llama-3.1-8b --out benchmarks/reports/prefill_graphs_h100

Per model shape (random bf16 weights), one engine per row: a `--tokens` prompt in one step (prefill_chunk_size =
tokens) and in the default 512-token chunks, CUDA graphs on (prefill and mixed steps replay the graph of their
token bucket) and off (every step eager). Each number is the median of `--repeats` prefills (add request -> first
token, synchronized) after a warm-up; prefix caching is off so every repeat computes the whole prompt. FLOPs as in
gpu_decode (projections, causal attention, one LM-head row) / seconds / the bf16 GEMM rate (8192^3 matmul) measured
in the same run. Then, on the first shape with graphs on and off, the server's settings: the offline engine built with
them (with a profile of one prefill), and `infer serve` itself: time to the first SSE chunk of a streamed completion of
a `--tokens`-token prompt, median of `--repeats`, read by an HTTP client.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

import model_shapes as ms
from gpu_decode.baselines import gemm_rate
from gpu_decode.engine import prefill_once
from gpu_decode.plan import Plan, prompt_ids
from profile_generation import union_us
from infer import LLM
from report_files import write_report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_harness import serve_process  # noqa: E402  (the tests' `infer serve` subprocess harness)

MODES = {"graphs": None, "eager": False}
MAX_TOKENS_PER_STEP = 2048  # prefill buckets 16 ... 2048
PREFILL_RANGE = "prefill_once"  # the profiled request, add to first token, on the host's timeline


def engine_prefill(path: Path, graphs: bool | None, chunk: int, tokens: int, repeats: int,
                   server_config: bool = False) -> dict[str, Any]:
    """Median prefill seconds; `server_config`: the engine as `infer serve` builds it (its batch size, token budget
    and prefix caching; a 2 GiB KV cache), else a small engine with prefix caching off."""
    options: dict[str, Any] = dict(max_seq_len=tokens + 64, prefill_chunk_size=chunk, kv_cache_memory_gb=2.0)
    if not server_config:
        options |= dict(max_batch_size=8, max_num_batched_tokens=MAX_TOKENS_PER_STEP, use_prefix_caching=False)
    llm = LLM(str(path), load_format="dummy", dtype="bfloat16", use_cuda_graphs=graphs, **options)
    prompts = [prompt_ids(llm.runner.vocab_size, tokens, seed=tokens + i) for i in range(repeats + 1)]  # no cache hit
    prefill_once(llm, prompts[0], "cuda")
    seconds = [prefill_once(llm, ids, "cuda") for ids in prompts[1:]]
    stats = llm.runner.prefill_graph_stats
    out = {"median_s": statistics.median(seconds), "seconds": seconds,
           "prefill_graphs": None if stats is None else {"buckets": stats.batch_sizes,
                                                         "capture_s": stats.capture_seconds,
                                                         "memory_bytes": stats.memory_bytes}}
    if server_config:
        out["profile"] = device_profile(llm, prompt_ids(llm.runner.vocab_size, tokens, seed=7))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return out


def device_profile(llm: LLM, ids: list[int]) -> str:
    """One prefill under torch.profiler: wall and GPU-busy ms, kernels, and the longest kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(PREFILL_RANGE):
            wall = prefill_once(llm, ids, "cuda")
    events = prof.events()
    window = next(e for e in events if e.name == PREFILL_RANGE and e.device_type == DeviceType.CPU).time_range
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.name != PREFILL_RANGE]
    busy = union_us([(e.time_range.start, e.time_range.end) for e in kernels])
    before = min(e.time_range.start for e in kernels) - window.start
    after = window.end - max(e.time_range.end for e in kernels)
    totals: dict[str, float] = {}
    for e in kernels:
        totals[e.name[:70]] = totals.get(e.name[:70], 0.0) + e.time_range.elapsed_us()
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:8]
    return (f"wall {1e3 * wall:.2f} ms (profiled), GPU busy {busy / 1e3:.2f} ms, {len(kernels)} kernels; GPU idle "
            f"{before / 1e3:.2f} ms before the first kernel, {after / 1e3:.2f} ms after the last, "
            f"{(window.elapsed_us() - before - after - busy) / 1e3:.2f} ms between; longest: "
            + "; ".join(f"`{name}` {us / 1e3:.2f} ms" for name, us in top))


def server_ttft(path: Path, graphs: bool, tokens: int, repeats: int) -> dict[str, Any]:
    flag = "--cuda-graphs" if graphs else "--no-cuda-graphs"
    started = time.perf_counter()
    with serve_process("--model", str(path), "--load-format", "dummy", "--log-level", "warning", flag,
                       "--max-seq-len", str(tokens + 64), timeout=600) as server:
        startup = time.perf_counter() - started
        model = httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["id"]
        vocab = ms.model_config(path.name).vocab_size
        times = []
        with httpx.Client(timeout=60) as http:
            for i in range(repeats + 1):  # distinct prompts: no prefix-cache hit
                body = {"model": model, "prompt": prompt_ids(vocab, tokens, seed=100 + i), "max_tokens": 1,
                        "stream": True, "temperature": 0}
                sent = time.perf_counter()
                with http.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            times.append(time.perf_counter() - sent)
                            break
    return {"ttft_ms": 1e3 * statistics.median(times[1:]), "runs_ms": [1e3 * t for t in times],
            "startup_s": startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama-3.2-1b", "llama-3.1-8b"], choices=ms.GPU_SHAPES)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-server", action="store_true", help="skip `infer serve` (its settings still run offline)")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    gemm = gemm_rate(Plan(models=tuple(args.models)))["tflops"]
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "gemm_tflops": gemm,
                              "tokens": args.tokens, "rows": []}
    lines = [f"# Prefill vs the bf16 GEMM rate, prefill graphs on and off ({result['gpu']})", "",
             f"`python benchmarks/prefill_graphs.py --models {' '.join(args.models)}`; torch {result['torch']}; "
             f"bf16 GEMM 8192^3 {gemm:.0f} TFLOP/s; a {args.tokens}-token prompt, add request -> first token, median "
             f"of {args.repeats}; max_num_batched_tokens {MAX_TOKENS_PER_STEP}.", "",
             "| shape | prompt in | graphs | ms | TFLOP/s | / GEMM rate | eager / graphs |", "|---|---|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            path = ms.write_model_dir(name, Path(root))
            flops = ms.prefill_flops(ms.model_config(name), args.tokens)
            for label, chunk in (("one step", args.tokens), ("512-token chunks", 512)):
                runs = {mode: engine_prefill(path, graphs, chunk, args.tokens, args.repeats)
                        for mode, graphs in MODES.items()}
                for mode, run in runs.items():
                    s = run["median_s"]
                    fraction = flops / s / 1e12 / gemm
                    result["rows"].append({"shape": name, "chunk": chunk, "mode": mode, "fraction": fraction} | run)
                    speedup = runs["eager"]["median_s"] / s
                    lines.append(f"| {name} | {label} | {mode} | {1e3 * s:.2f} | {flops / s / 1e12:.1f} | "
                                 f"{fraction:.2f} | {speedup:.2f}x |")
                    print(lines[-1], flush=True)
        graphs_run = next((r for r in result["rows"] if r["prefill_graphs"]), None)
        if graphs_run is not None:
            g = graphs_run["prefill_graphs"]
            lines += ["", f"Prefill graphs ({graphs_run['shape']}): buckets {g['buckets']}, captured in "
                          f"{g['capture_s']:.1f} s, {g['memory_bytes'] / 2**20:.0f} MiB of device memory."]
        name = args.models[0]
        path = ms.write_model_dir(name, Path(root))
        lines += ["", f"## TTFT of a {args.tokens}-token prompt with the server's settings ({name})", "",
                  "Server defaults (512-token chunks, prefix caching on, distinct prompts): the offline engine built "
                  "with them, add request -> first token, and (unless --no-server) `infer serve` itself, time to the "
                  "first SSE chunk read by an HTTP client.", "",
                  "| graphs | offline, server settings, ms | server TTFT ms (median) | every request, ms (the first "
                  "is a warm-up) | server start s |", "|---|---:|---:|---|---:|"]
        for mode, graphs in (("graphs", True), ("eager", False)):
            offline = engine_prefill(path, graphs, 512, args.tokens, args.repeats, server_config=True)
            row = f"| {mode} | {1e3 * offline['median_s']:.2f} |"
            result[f"server_{mode}"] = {"offline_same_config": offline}
            if args.no_server:
                row += " — | — | — |"
            else:
                ttft = server_ttft(path, graphs, args.tokens, args.repeats)
                result[f"server_{mode}"] |= ttft
                runs = ", ".join(f"{t:.1f}" for t in ttft["runs_ms"])
                row += f" {ttft['ttft_ms']:.1f} | {runs} | {ttft['startup_s']:.0f} |"
            lines.append(row)
            print(row, flush=True)
        lines += [""] + [f"Offline, {mode}, profiled: {result[f'server_{mode}']['offline_same_config']['profile']}"
                         for mode in ("graphs", "eager")]
    write_report(args.out, result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
