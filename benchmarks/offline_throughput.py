"""Offline throughput on the GPU: nano-vllm's workload through our engine and transformers' `generate_batch`
in the same run, prefix caching on vs off at a 0% hit rate, and batched decode against the memory bound.

    python benchmarks/offline_throughput.py [--shape llama-3.2-1b] [--requests 256] [--skip-transformers]

Workload (nano-vllm's bench.py): 256 requests, prompt lengths uniform in [100, 1024], 512 new tokens each,
random token ids, greedy, EOS ignored, random weights at the named shape (bf16). Our three configs (chunked
prefill with and without prefix caching, whole-prompt prefill) are resident together and timed interleaved, median
of --repeats; transformers runs once, eager paged attention (no flash-attn on the machine). Prefix caching's cost is
the median over repeats of 1 - on/off, each pair of runs adjacent in time (the host's mood moves between repeats).
Decode at batch B: B prompts of 128 tokens decode 128 tokens; a step's memory bound is (weights + the KV the batch
reads) / the measured device copy bandwidth; its kernel bound runs the projections and LM head at the larger of
their FLOPs at the bf16 GEMM rate (8192^3 matmul) and their weights at copy bandwidth, then attention's KV reads at
copy bandwidth: a step that runs them one after another cannot beat it. Writes offline_throughput_<gpu>.{json,md}
under OUT_DIR (default benchmarks/reports). GPU run: `bash scripts/gpu_serving.sh bench` on the lent machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

import model_shapes as ms
from device_rates import copy_bandwidth, host_loop_ms
from gpu_decode.baselines import gemm_rate
from gpu_decode.plan import Plan
from infer import LLM, SamplingParams
from layerzero.kernels.triton.compiles import Compiles


def workload(vocab: int, requests: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(100, 1024))] for _ in range(requests)]


CONFIGS = {  # report key -> EngineConfig options
    "infer": {},  # the defaults: chunked prefill + prefix caching
    "infer_prefix_off": {"use_prefix_caching": False},
    "infer_unchunked": {"use_chunked_prefill": False},
}


def run_infer(path: Path, vocab: int, requests: int, new_tokens: int, repeats: int) -> dict[str, dict[str, float]]:
    """Every config resident at once, timed runs interleaved (A B C A B C ...); the first run after start (the
    engine's own start-up warm-up is all the warming it gets) and the median of the later ones. Each repeat draws
    fresh prompts (the same for every config), so the prefix cache never hits."""
    llms = {name: LLM(str(path), load_format="dummy", max_seq_len=2048, max_batch_size=256, kv_cache_memory_gb=14,
                      **options) for name, options in CONFIGS.items()}
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    times: dict[str, list[float]] = {name: [] for name in llms}
    compiled: dict[str, list[list[tuple[str, float]]]] = {name: [] for name in llms}
    for repeat in range(repeats):
        prompts = workload(vocab, requests, seed=100 + repeat)
        for name, llm in llms.items():
            torch.cuda.synchronize()
            with Compiles() as compiles:
                started = time.perf_counter()
                outs = llm.generate_ids(prompts, params)
                times[name].append(time.perf_counter() - started)
            compiled[name].append(compiles.kernels)
            assert sum(len(o.token_ids) for o in outs) == len(prompts) * new_tokens
    result = {}
    for name, llm in llms.items():
        seconds = statistics.median(times[name][1:])
        result[name] = {"tok_s": requests * new_tokens / seconds, "seconds": seconds, "runs_s": times[name],
                        "first_tok_s": requests * new_tokens / times[name][0],
                        "warmup_s": llm.built.warmup_seconds, "compiled_per_run": compiled[name],
                        "prefix_hits": llm.engine.kv.prefix_hits, "preemptions": llm.engine.scheduler.num_preemptions}
    del llms
    gc.collect()
    torch.cuda.empty_cache()
    return result


def run_decode(path: Path, batches: list[int], vocab: int, repeats: int = 3) -> dict[int, float]:
    """Median decode tok/s at each batch size over `repeats` interleaved runs, each timed from the step at
    which every request has its first token (one run is ~128 steps, short enough for host noise to show)."""
    llm = LLM(str(path), load_format="dummy", max_seq_len=2048, max_batch_size=max(batches), kv_cache_memory_gb=20)
    runs: dict[int, list[float]] = {batch: [] for batch in batches}
    for _ in range(repeats):
        for batch in batches:
            prompts = [p[:128] for p in workload(vocab, batch, seed=batch)]
            params = SamplingParams(temperature=0, max_tokens=129, ignore_eos=True)
            engine = llm.engine
            # text decoded at each request's end, as LLM.generate_ids has it
            requests = [engine.add_request(p, params, incremental_text=False) for p in prompts]
            started = None
            while engine.has_unfinished():
                engine.step()
                if started is None and all(r.output_token_ids for r in requests):
                    torch.cuda.synchronize()
                    started, base = time.perf_counter(), sum(len(r.output_token_ids) for r in requests)
            seconds = time.perf_counter() - started  # type: ignore[operator]
            runs[batch].append((sum(len(r.output_token_ids) for r in requests) - base) / seconds)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {batch: statistics.median(tok_s) for batch, tok_s in runs.items()}


def run_transformers(shape: str, prompts: list[list[int]], new_tokens: int) -> dict[str, object]:
    """transformers' continuous-batching `generate_batch` (paged attention) on the same workload."""
    try:
        from transformers import AutoModelForCausalLM, GenerationConfig

        model = AutoModelForCausalLM.from_config(ms.hf_config(shape), dtype=torch.bfloat16,
                                                 attn_implementation="paged|eager").cuda().eval()
        # max_batch_tokens bounds the eager attention's score matrices (the default ran out of memory on an H100)
        options = dict(do_sample=False, eos_token_id=-1, pad_token_id=0, use_cuda_graph=False, max_batch_tokens=2048)
        config = GenerationConfig(max_new_tokens=new_tokens, **options)
        model.generate_batch(inputs=prompts[:8], generation_config=GenerationConfig(max_new_tokens=16, **options))
        torch.cuda.synchronize()
        started = time.perf_counter()
        outs = model.generate_batch(inputs=prompts, generation_config=config)
        seconds = time.perf_counter() - started
        tokens = sum(len(o.generated_tokens) for o in outs.values())
        if tokens == 0:
            raise RuntimeError("generate_batch returned no tokens (its requests failed; see its log above)")
        del model
        gc.collect()
        torch.cuda.empty_cache()
        return {"tok_s": tokens / seconds, "seconds": seconds, "tokens": tokens}
    except Exception as exc:  # an older transformers without generate_batch, or it failed: say so
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=6,
                        help="timed runs per engine config, interleaved: the first after start, then the warm ones")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    cfg = ms.model_config(args.shape)
    report: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "requests": args.requests,
                                 "new_tokens": args.new_tokens, "torch": torch.__version__}
    # the roofline's bandwidth, before any load: after the engines' runs it once measured 2.59 TB/s on a GPU where
    # step_profile.py measured 3.0 minutes later
    bandwidth = copy_bandwidth() / 1e9
    report["host_loop_ms"] = host_loop_ms()
    if not args.skip_transformers:  # first, while the GPU's memory is all free
        report["transformers"] = run_transformers(args.shape, workload(cfg.vocab_size, args.requests, seed=100),
                                                  args.new_tokens)
    report |= run_infer(path, cfg.vocab_size, args.requests, args.new_tokens, args.repeats)
    decode = run_decode(path, [64, 256], cfg.vocab_size)
    gemm_tflops = gemm_rate(Plan(models=(args.shape,)))["tflops"]
    report["copy_gb_s"], report["gemm_tflops"] = bandwidth, gemm_tflops
    report["decode"] = {}
    for batch, tok_s in decode.items():
        kv_seconds = batch * ms.kv_read_bytes(cfg, 192) / (bandwidth * 1e9)
        memory = ms.weight_bytes(cfg) / (bandwidth * 1e9) + kv_seconds
        gemms = 2 * batch * ms.weight_bytes(cfg) / 2 / (gemm_tflops * 1e12)  # 2 FLOPs per bf16 weight and row
        kernels = max(gemms, ms.weight_bytes(cfg) / (bandwidth * 1e9)) + kv_seconds
        report["decode"][batch] = {"tok_s": tok_s, "memory_bound_tok_s": batch / memory,  # type: ignore[index]
                                   "kernel_bound_tok_s": batch / kernels, "fraction": tok_s * memory / batch,
                                   "kernel_fraction": tok_s * kernels / batch}
    write(report)


def write(r: dict) -> None:
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    gpu = r["gpu"].lower().replace("nvidia", "").split()[0]
    (out / f"offline_throughput_{gpu}.json").write_text(json.dumps(r, indent=2) + "\n")
    ours, off, whole = r["infer"], r["infer_prefix_off"], r["infer_unchunked"]
    hf = r.get("transformers", {})
    lines = [
        f"# Offline throughput — {r['shape']} (random weights, bf16), {r['gpu']}", "",
        f"nano-vllm's workload: {r['requests']} requests, prompts 100-1024 tokens, {r['new_tokens']} new tokens each, "
        f"greedy, EOS ignored; same process; ours: median of the warm interleaved runs, and the first run after "
        f"start (after the engine's own start-up warm-up); transformers: one run. torch {r['torch']}. Host speed: "
        f"{r['host_loop_ms']:.0f} ms for 2M dict stores in Python (`device_rates.host_loop_ms`).", "",
        "| engine | tok/s (warm) | seconds | first run tok/s | first ÷ warm | start-up warm-up s | ratio to transformers |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    hf_rate = hf.get("tok_s")
    for name, row in (("infer, chunked prefill + prefix caching (the defaults)", ours),
                      ("infer, chunked prefill, no prefix caching", off), ("infer, whole-prompt prefill", whole)):
        ratio = f"{row['tok_s'] / hf_rate:.1f}x" if hf_rate else "—"
        lines.append(f"| {name} | {row['tok_s']:.0f} | {row['seconds']:.1f} | {row['first_tok_s']:.0f} | "
                     f"{row['first_tok_s'] / row['tok_s']:.2f} | {row['warmup_s']:.1f} | {ratio} |")
    if hf_rate:
        lines.append(f"| transformers `generate_batch` (sdpa_paged) | {hf_rate:.0f} | {hf['seconds']:.1f} | | | | 1.0x |")
    elif hf:
        lines.append(f"| transformers `generate_batch` | failed: {hf['error']} | | | | | |")
    lines += ["", "Triton kernels compiled during each run, in run order (a first run's compiles are what the start-up "
                  "warm-up missed):", ""]
    for name, row in (("the defaults", ours), ("no prefix caching", off), ("whole-prompt prefill", whole)):
        runs = row.get("compiled_per_run", [])
        first = ", ".join(sorted({k for k, _ in runs[0]})) if runs and runs[0] else "none"
        lines.append(f"- {name}: " + ", ".join(f"{len(k)} ({sum(s for _, s in k):.2f} s)" for k in runs)
                     + f"; first run's kernels: {first}")
    costs = sorted(1 - b / a for a, b in zip(ours["runs_s"][1:], off["runs_s"][1:]))
    lines += ["", f"Prefix caching at a 0% hit rate (random prompts; {ours['prefix_hits']} tokens hit): "
                  f"{100 * statistics.median(costs):+.1f}% throughput cost, median of the {len(costs)} warm pairs "
                  f"(range {100 * costs[0]:+.1f}% to {100 * costs[-1]:+.1f}%; medians on {ours['tok_s']:.0f} vs off "
                  f"{off['tok_s']:.0f} tok/s).", "",
              f"Decode (prompts of 128 tokens, 128 decoded; median of 3 runs) against the step's memory bound "
              f"(weights + the KV it reads at the measured copy bandwidth {r['copy_gb_s']:.0f} GB/s) and its kernel "
              f"bound (the projections at the larger of their FLOPs at the bf16 GEMM rate {r['gemm_tflops']:.0f} TFLOP/s and "
              f"their weights at copy bandwidth, then the KV reads):", "",
              "| batch | tok/s | memory bound tok/s | fraction | kernel bound tok/s | fraction |",
              "|---:|---:|---:|---:|---:|---:|"]
    for batch, d in r["decode"].items():
        lines.append(f"| {batch} | {d['tok_s']:.0f} | {d['memory_bound_tok_s']:.0f} | {d['fraction']:.2f} | "
                     f"{d['kernel_bound_tok_s']:.0f} | {d['kernel_fraction']:.2f} |")
    lines += ["", "Reproduce: `bash scripts/gpu_serving.sh` (device tool), or `python benchmarks/offline_throughput.py`."]
    (out / f"offline_throughput_{gpu}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
