"""Tensor-parallel decode: batch 1 and batch 32 at TP=1/2/4 in one run, each as a ratio to TP=1 and as a fraction of
the per-rank bandwidth roofline (each rank reads its share of the weights and of the KV every step).

    python benchmarks/tp_decode.py --shape llama-3.1-8b --tp 1 2 4 --report benchmarks/reports/distributed_h100.md
    python benchmarks/tp_decode.py --shape qwen3-30b-a3b --tp 1 2 2ep   # 2ep: TP=2 with whole experts on ranks

Random bf16 weights (`load_format="dummy"`: each rank draws its own shard) from benchmarks/model_shapes.py, each TP
size in a process of its own, CUDA graphs on, greedy, EOS ignored. A batch's decode rate is (tokens of a long run - tokens of a one-token run) / the
time between them, so the prompt's prefill is left out; each is the median of --repeats runs. GPU bandwidth for
the roofline: --bandwidth-tbs (default: measured here with a device-to-device copy). A mixture of experts' step reads
the experts its batch routes to (expected distinct experts under uniform routing), split over the ranks like the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import model_shapes as ms  # noqa: E402
from device_rates import copy_bandwidth  # noqa: E402

from infer import LLM, SamplingParams  # noqa: E402


def decode_rate(llm: LLM, batch: int, prompt_len: int, tokens: int, repeats: int) -> float:
    """Decode tokens/s of `batch` sequences (all tokens of the batch per second)."""
    rng = random.Random(batch)
    prompts = [[rng.randrange(llm.model_config.vocab_size) for _ in range(prompt_len)] for _ in range(batch)]

    def timed(n: int) -> float:
        started = time.perf_counter()
        llm.generate_ids(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - started

    timed(tokens)  # warm
    rates = []
    for _ in range(repeats):
        rates.append(batch * (tokens - 1) / (timed(tokens) - timed(1)))
    return statistics.median(rates)


def parse_tp(spec: str) -> tuple[int, bool]:
    """`N` (TP=N) or `Nep` (TP=N with --enable-expert-parallel) -> (N, expert parallel)."""
    ep = spec.endswith("ep")
    return int(spec.removesuffix("ep")), ep


def measure(args: argparse.Namespace, spec: str, bandwidth: float) -> list[dict[str, Any]]:
    """One TP configuration's rows (run in a process of its own: a process runs one NCCL tensor-parallel engine)."""
    tp, ep = parse_tp(spec)
    path = ms.write_model_dir(args.shape, Path(args.work))
    cfg = ms.model_config(args.shape)
    llm = LLM(str(path), load_format="dummy", dtype="bfloat16", tensor_parallel_size=tp, enable_expert_parallel=ep,
              max_batch_size=max(args.batches), max_seq_len=args.prompt_len + args.tokens + 64,
              kv_cache_memory_gb=args.kv_gb)
    rows = []
    for batch in args.batches:
        rate = decode_rate(llm, batch, args.prompt_len, args.tokens, args.repeats)
        context = args.prompt_len + args.tokens // 2
        weights = ms.active_weight_bytes(cfg, ms.expected_experts(cfg, batch)) if cfg.num_experts else \
            ms.weight_bytes(cfg)
        step_bytes = (weights + batch * ms.kv_read_bytes(cfg, context)) / tp
        rows.append(dict(tp=spec, batch=batch, tok_s=rate, roofline=batch * bandwidth / step_bytes))
    llm.close()
    return rows


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], float]:
    bandwidth = args.bandwidth_tbs * 1e12 if args.bandwidth_tbs else copy_bandwidth()
    rows: list[dict[str, Any]] = []
    for tp in args.tp:
        argv = [sys.executable, __file__, "--one", str(tp), "--bandwidth-tbs", str(bandwidth / 1e12), "--shape",
                args.shape, "--batches", *map(str, args.batches), "--prompt-len", str(args.prompt_len), "--tokens",
                str(args.tokens), "--repeats", str(args.repeats), "--kv-gb", str(args.kv_gb), "--work", args.work]
        done = subprocess.run(argv, capture_output=True, text=True)
        found = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
        if done.returncode != 0 or not found:
            print(f"TP={tp} failed (exit {done.returncode}):\n{done.stderr[-3000:]}", flush=True)
            continue
        for row in json.loads(found[-1][5:]):
            rows.append(row)
            print(f"TP={tp} batch={row['batch']}: {row['tok_s']:.1f} tok/s = {row['tok_s'] / row['roofline']:.2f} of "
                  f"the per-rank roofline ({row['roofline']:.0f} tok/s)", flush=True)
    for row in rows:
        base = next((r["tok_s"] for r in rows if r["tp"] == "1" and r["batch"] == row["batch"]), float("nan"))
        row["ratio"] = row["tok_s"] / base
    return rows, bandwidth


def report(rows: list[dict[str, Any]], bandwidth: float, args: argparse.Namespace) -> str:
    gpu = torch.cuda.get_device_name()
    lines = [f"# Tensor-parallel decode, {args.shape} shape (random bf16 weights), {gpu} "
             f"x{max(parse_tp(t)[0] for t in args.tp)}", "",
             f"`python benchmarks/tp_decode.py --shape {args.shape} --tp {' '.join(map(str, args.tp))}` "
             f"({platform.node()}, torch {torch.__version__}); prompt {args.prompt_len} tokens, {args.tokens} decoded, "
             f"median of {args.repeats}; roofline bandwidth {bandwidth / 1e12:.2f} TB/s (device copy) per rank.", "",
             "| TP | batch | tok/s | vs TP=1 | per-rank roofline tok/s | fraction |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tp']} | {r['batch']} | {r['tok_s']:.1f} | {r['ratio']:.2f}x | {r['roofline']:.0f} | "
                     f"{r['tok_s'] / r['roofline']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b", choices=(*ms.GPU_SHAPES, "qwen3-30b-a3b"))
    parser.add_argument("--tp", nargs="+", default=["1", "2"],
                        help="TP sizes to run, each N or Nep (expert parallel); TP=1 is the ratios' base")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-gb", type=float, default=4.0)
    parser.add_argument("--bandwidth-tbs", type=float, default=None)
    parser.add_argument("--work", default="/tmp/tp_models")
    parser.add_argument("--report", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child measuring one TP size
    args = parser.parse_args()
    if args.one is not None:
        print("ROWS " + json.dumps(measure(args, args.one, args.bandwidth_tbs * 1e12)), flush=True)
        os._exit(0)  # no NCCL teardown (it can wait on ranks that are gone)
    rows, bandwidth = run(args)
    text = report(rows, bandwidth, args)
    print(text)
    if args.report:
        Path(args.report).write_text(text)


if __name__ == "__main__":
    main()
