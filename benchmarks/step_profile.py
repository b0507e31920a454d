"""Where a decode step's time goes at batch B: host work, waiting for the device, and the device's own time.

    python benchmarks/step_profile.py [--shape llama-3.2-1b] [--batch 256] [--steps 100] [--top 25]

B requests with prompts of 128 random tokens decode until every one runs; then `--steps` steps of the engine
core are timed (`EngineCore.step_core`, what the serving core process runs; text is processed beside the API).
Wait = time blocked reading a step's tokens (the device is behind the host); host = the rest of the step.
Device = one CUDA-graph replay of the decode forward for B rows, timed with events (sampling excluded).
With the overlap, a step costs max(host, device): the smaller one is hidden. Memory bound = the bytes a step
must read (weights once, every row's KV at its context) over the device's copy bandwidth; the step's fraction
of it is bound / step. A cProfile of the same steps follows (it slows the host, so its times are only
proportions). Random weights, bf16, on CUDA. Writes step_profile_<gpu>_b<B>.json under OUT_DIR when set.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import time
from pathlib import Path

import torch

import model_shapes as ms
from device_rates import copy_bandwidth
from infer import LLM, SamplingParams
from infer.transfer import Readback
from layerzero.perf.measure import measure


class WaitClock:
    """Wraps Readback.read to add up the time spent blocked on the device."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._read = Readback.read

    def __enter__(self) -> "WaitClock":
        clock, read = self, self._read

        def timed(readback: Readback) -> list[int]:
            started = time.perf_counter()
            try:
                return read(readback)
            finally:
                clock.seconds += time.perf_counter() - started

        Readback.read = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Readback.read = self._read  # type: ignore[method-assign]


def device_ms(llm: LLM, batch: int, reps: int = 50) -> float:
    graphs = llm.runner.graphs
    if graphs is None or graphs.bucket(batch) != batch:
        return float("nan")
    return statistics.median(measure(lambda: graphs.replay(batch), device="cuda", iters=reps)) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    vocab = ms.model_config(args.shape).vocab_size
    llm = LLM(str(path), load_format="dummy", max_seq_len=2048, max_batch_size=args.batch, kv_cache_memory_gb=20)
    engine, rng = llm.engine, random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=2 * args.steps + 64, ignore_eos=True)
    requests = [engine.add_request([rng.randrange(vocab) for _ in range(128)], params) for _ in range(args.batch)]
    while not all(r.output_token_ids for r in requests):
        engine.step_core()
    for _ in range(10):
        engine.step_core()
    torch.cuda.synchronize()
    with WaitClock() as wait:
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step_core()
        seconds = time.perf_counter() - started
    step_ms, wait_ms = 1e3 * seconds / args.steps, 1e3 * wait.seconds / args.steps
    cfg = ms.model_config(args.shape)
    contexts = [r.num_tokens for r in requests]
    step_bytes = ms.weight_bytes(cfg) + sum(ms.kv_read_bytes(cfg, c) for c in contexts)
    bound_ms = 1e3 * step_bytes / (copy_bandwidth())
    forward_ms = device_ms(llm, args.batch)
    report = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "batch": args.batch, "step_ms": step_ms,
              "host_ms": step_ms - wait_ms, "wait_ms": wait_ms, "device_forward_ms": forward_ms,
              "memory_bound_ms": bound_ms, "fraction_of_bound": bound_ms / step_ms,
              "mean_context": statistics.mean(contexts), "tok_s": args.batch / seconds * args.steps}
    print(f"{args.shape}, batch {args.batch}, {report['gpu']}: step {step_ms:.2f} ms (host {step_ms - wait_ms:.2f}, "
          f"waiting {wait_ms:.2f}); device forward {forward_ms:.2f} ms; memory bound {bound_ms:.2f} ms "
          f"(mean context {report['mean_context']:.0f}) -> {report['fraction_of_bound']:.2f} of it; "
          f"{report['tok_s']:.0f} tok/s")
    if os.environ.get("OUT_DIR"):
        gpu = report["gpu"].lower().replace("nvidia", "").split()[0]
        Path(os.environ["OUT_DIR"], f"step_profile_{gpu}_b{args.batch}.json").write_text(json.dumps(report, indent=2))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        engine.step_core()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
