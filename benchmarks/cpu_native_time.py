"""Where a CPU decode token's time goes: the C time of each native kernel per token, beside the whole token.

    .venv/bin/python benchmarks/cpu_native_time.py [--tokens 64] [--runs 3]

The bundled SmolLM2 at the server's defaults, but decoding eagerly (`use_cuda_graphs=False`: a CPU decode graph's
replay calls the C functions without the Python this benchmark times them from), decodes `--tokens` tokens greedily
at batch 1 (after a warm-up run); after the first token (the prefill) every native kernel call
(layerzero/kernels/native) is timed around its ctypes call. What the table does not list (Python, aten glue, the
engine step) is the gap between their sum and the token: what a CPU decode graph removes (docs/engine.md).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

from infer import LLM, SamplingParams
from layerzero.kernels.native import activation, attention, build, linear, norm, rope_kv

SECONDS: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()


def timed_kernel(name: str, symbol: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
    fn = build.kernel(name, symbol, *args, **kwargs)

    def call(*c_args: Any) -> Any:
        started = time.perf_counter()
        out = fn(*c_args)
        SECONDS[symbol] += time.perf_counter() - started
        CALLS[symbol] += 1
        return out
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3, help="runs; the one with the median token time is shown")
    args = parser.parse_args()
    for module in (activation, attention, linear, norm, rope_kv):
        module.kernel = timed_kernel
    llm = LLM(None, use_cuda_graphs=False)
    ids = llm.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    list(llm.stream(ids, params))
    runs = []
    for _ in range(args.runs):
        stamps = []
        for _ in llm.stream(ids, params):
            if not stamps:  # the prefill is done: count decode steps only
                SECONDS.clear()
                CALLS.clear()
            stamps.append(time.perf_counter())
        per_token = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        runs.append((per_token, dict(SECONDS), dict(CALLS), len(stamps) - 1))
    per_token, seconds, calls, tokens = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    print(f"batch-1 decode: {per_token * 1e3:.2f} ms a token ({1 / per_token:.1f} tok/s), median of {args.runs} runs")
    print("| kernel | ms a token | µs a call | calls a token |\n|---|---:|---:|---:|")
    for symbol, total in sorted(seconds.items(), key=lambda kv: -kv[1]):
        per_call, count = total / calls[symbol] * 1e6, calls[symbol] / tokens
        print(f"| {symbol} | {total / tokens * 1e3:.2f} | {per_call:.1f} | {count:.0f} |")
    native = sum(seconds.values()) / tokens
    print(f"| (all native) | {native * 1e3:.2f} | | |\n| (the rest: Python, aten glue, engine) | "
          f"{(per_token - native) * 1e3:.2f} | | |")
    times = [r[0] * 1e3 for r in runs]
    print(f"runs (ms a token): {[round(t, 2) for t in times]}, median {statistics.median(times):.2f}")


if __name__ == "__main__":
    main()
