"""Offline throughput of data parallelism: LLM(data_parallel_size=N) against one engine (DP=1), same workload.

    python benchmarks/dp_throughput.py --shape llama-3.2-1b --dp 2 --report dp_throughput_gpu.md
    python benchmarks/dp_throughput.py --model bundled --dp 2 --requests 64 --new-tokens 64   # the CPU, SmolLM2

`--shape` builds a model directory with random weights (`load_format="dummy"`, bf16 on CUDA) from
benchmarks/model_shapes.py, so nothing needs the network; `--model` takes a checkpoint (`bundled`: the bundled
SmolLM2). Prompts are random token ids (lengths drawn from --prompt-len), greedy, EOS ignored, every prompt
submitted at once. DP=1 is the in-process LLM; DP=N runs N engine-core processes (cuda:0..N-1 with TP=1; on the
CPU each core gets cpu_count // N threads) behind one DPClient, the requests routed by --load-balance-method.
Each configuration is loaded on its own (DP=N first, then freed), warmed with one small batch, then timed
--repeats times; the median run counts. Prints tok/s and the ratio; --report writes a markdown report.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import model_shapes as ms  # noqa: E402

from infer import LLM, SamplingParams  # noqa: E402


def workload(vocab: int, requests: int, lengths: tuple[int, int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(requests)]


def measure(model: str | None, options: dict[str, object], dp: int, args: argparse.Namespace) -> dict[str, object]:
    """Load, warm, time `repeats` runs of the workload; tok/s of the median run."""
    started = time.perf_counter()
    llm = LLM(model, data_parallel_size=dp, load_balance_method=args.load_balance_method, **options)
    load_s = time.perf_counter() - started
    vocab = llm.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate_ids(workload(vocab, min(8, args.requests), (16, 32), seed=1), params)  # warm-up
    runs = []
    for repeat in range(args.repeats):
        prompts = workload(vocab, args.requests, tuple(args.prompt_len), seed=100 + repeat)  # fresh: no prefix hits
        t0 = time.perf_counter()
        outs = llm.generate_ids(prompts, params)
        runs.append(time.perf_counter() - t0)
        assert sum(len(o.token_ids) for o in outs) == len(prompts) * args.new_tokens
    if dp > 1:
        llm.close()  # type: ignore[attr-defined]
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    seconds = statistics.median(runs)
    return {"dp": dp, "tok_s": args.requests * args.new_tokens / seconds, "seconds": seconds, "runs_s": runs,
            "load_s": load_s}


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def report(results: list[dict[str, object]], args: argparse.Namespace, what: str) -> str:
    base = results[0]["tok_s"]
    lines = [f"# Data parallelism, offline throughput — {what}", "",
             f"Hardware: {hardware()}; torch {torch.__version__}.",
             f"Workload: {args.requests} prompts of {args.prompt_len[0]}-{args.prompt_len[1]} random tokens, "
             f"{args.new_tokens} new tokens each (greedy, EOS ignored), all submitted at once; median of "
             f"{args.repeats} runs; routing {args.load_balance_method}.",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| DP | tok/s | run (s) | load (s) | vs DP=1 |", "|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['dp']} | {r['tok_s']:.0f} | {r['seconds']:.2f} | {r['load_s']:.1f} | "
                     f"{r['tok_s'] / base:.2f}x |")  # type: ignore[operator]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(ms.SHAPES))
    parser.add_argument("--model", help="a checkpoint instead of --shape; 'bundled' for the bundled SmolLM2")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel engines compared with one")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(128, 512), metavar=("MIN", "MAX"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load-balance-method", default="least_load")
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--report", type=Path, help="write a markdown report here")
    args = parser.parse_args()
    options: dict[str, object] = {"max_seq_len": args.max_seq_len}
    if args.max_batch_size is not None:
        options["max_batch_size"] = args.max_batch_size
    if args.model is None:
        model: str | None = str(ms.write_model_dir(args.shape, Path("/tmp/infer-shapes")))
        options["load_format"] = "dummy"
        what = f"{args.shape} (random weights)"
    else:
        model = None if args.model == "bundled" else args.model
        what = "bundled SmolLM2-135M-Instruct" if model is None else Path(args.model).name
    # DP=N first: its cores load while this process has not touched the GPU yet (DP=1 then runs in this process)
    results = [measure(model, options, dp, args) for dp in (args.dp, 1)][::-1]
    for r in results:
        print(f"DP={r['dp']}: {r['tok_s']:.0f} tok/s (median run {r['seconds']:.2f} s, load {r['load_s']:.1f} s)")
    print(f"DP={args.dp} / DP=1: {results[1]['tok_s'] / results[0]['tok_s']:.2f}x")  # type: ignore[operator]
    if args.report is not None:
        args.report.write_text(report(results, args, what))
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
