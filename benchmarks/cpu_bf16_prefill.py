"""`--dtype bfloat16` on the CPU, in process: prefill time and batch-1 decode speed, with and without a prefill's
activations kept in bf16 between the projections (docs/engine.md, "bfloat16 on the CPU").

    .venv/bin/python benchmarks/cpu_bf16_prefill.py [--model .bench/hf/smollm2-135m-bf16] [--rounds 5]

Each round measures both arms back to back, in alternating order, on one loaded engine (the machine is noisy):
- "bf16 rows": the engine as it runs;
- "float32 rows": every block told to keep float32 rows (`Block.half_rows` returning None), the path before: each
  projection casts its float32 rows to bf16 and its bf16 output back.
Per arm: a prefill of 16 prompts of 128 tokens (one 2,048-token step) and of one 128-token prompt (`generate_ids`
with max_tokens=1: the time to the first token, in process), and batch-1 decode tok/s over 64 tokens (first token
excluded). Fresh random prompts every run, prefix caching off. Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from infer import LLM, SamplingParams
from infer.models.base import Block

PREFILL = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
DECODE_TOKENS = 64


@contextlib.contextmanager
def float32_rows(on: bool) -> Iterator[None]:
    """While `on`, every block keeps float32 rows between its projections (the path before bf16 rows)."""
    original = Block.half_rows
    if on:
        Block.half_rows = lambda self, x: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Block.half_rows = original  # type: ignore[method-assign]


def _prompts(rng: random.Random, count: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(count)]


def _timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    start = time.perf_counter()
    llm.generate_ids(prompts, params)
    return time.perf_counter() - start


def measure(llm: LLM, rng: random.Random, vocab: int) -> dict[str, float]:
    """One arm's numbers: 16x128 and 1x128 prefill seconds, batch-1 decode tok/s."""
    batch = _timed(llm, _prompts(rng, 16, 128, vocab), PREFILL)
    single = _timed(llm, _prompts(rng, 1, 128, vocab), PREFILL)
    prompt = _prompts(rng, 1, 32, vocab)
    first = _timed(llm, prompt, PREFILL)
    whole = _timed(llm, prompt, SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True))
    return {"prefill_16x128_ms": 1000 * batch, "prefill_1x128_ms": 1000 * single,
            "decode_tok_s": (DECODE_TOKENS - 1) / max(whole - first, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=".bench/hf/smollm2-135m-bf16")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    llm = LLM(args.model, device="cpu", dtype="bfloat16", use_prefix_caching=False, max_seq_len=1024)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    arms = {"float32 rows": True, "bf16 rows": False}
    for name, old in arms.items():  # warm both: kernels selected, weights packed, graphs recorded
        with float32_rows(old):
            measure(llm, rng, vocab)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            with float32_rows(arms[name]):
                results[name].append(measure(llm, rng, vocab))
            print(f"round {r} {name:13s} " + "  ".join(f"{k} {v:7.1f}" for k, v in results[name][-1].items()),
                  flush=True)
    print("median:")
    for name, runs in results.items():
        print(f"  {name:13s} " + "  ".join(f"{k} {statistics.median(run[k] for run in runs):7.1f}" for k in runs[0]))


if __name__ == "__main__":
    main()
