"""Why runs of one offline workload differ: per run, its wall time, the Triton kernels compiled during it, the
time Python's garbage collector paused it, its slowest engine steps, the time in steps that carry prefill rows
against decode-only steps, and the device allocations (cudaMalloc) the caching allocator made.

    python benchmarks/run_variance.py [--shape llama-3.2-1b] [--requests 64] [--runs 6]

Each run is --requests fresh random token-id prompts of 128-512 tokens, 256 new tokens each, greedy, EOS ignored,
through `LLM.generate_ids` (the settings of serve_vs_offline.py). Random bf16 weights, on CUDA.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import traceback
from pathlib import Path

import torch

import model_shapes as ms
from infer import LLM, SamplingParams


class Counters:
    """Triton compiles (Triton's post-compile hook), GC pause time (gc.callbacks) and step times during a run."""

    def __init__(self, llm: LLM) -> None:
        self.compiles: list[str] = []
        self.gc_seconds = 0.0
        self.gc_full = 0
        self.full_from: list[str] = []  # the stack each full collection ran on
        self.steps: list[float] = []
        self.prefill_steps: list[float] = []  # steps whose batch has prefill rows
        self._gc_started = 0.0
        import triton

        def compiled(**kw: object) -> None:  # a kernel's first call with new specializations (disk cache or not)
            self.compiles.append(str(kw.get("repr", "?")).split("[")[0])

        triton.knobs.runtime.jit_post_compile_hook = compiled
        gc.callbacks.append(self._gc)
        engine = llm.engine
        step = engine.step

        def timed_step():  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            before = engine.scheduler.step_index
            try:
                return step()
            finally:
                took = time.perf_counter() - started
                self.steps.append(took)
                if engine.scheduler.step_index != before and engine.scheduler._last_had_prefill:
                    self.prefill_steps.append(took)

        engine.step = timed_step  # type: ignore[method-assign]

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_started
            if info.get("generation") == 2:  # where it came from: an explicit gc.collect() or an allocation
                self.gc_full += 1
                self.full_from.append(" < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                                 for f in traceback.extract_stack()[-6:-1][::-1]))

    def reset(self) -> None:
        self.compiles, self.gc_seconds, self.gc_full, self.steps, self.prefill_steps = [], 0.0, 0, [], []
        self.full_from: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    vocab = ms.model_config(args.shape).vocab_size
    llm = LLM(str(path), load_format="dummy", max_seq_len=2048, max_batch_size=256, kv_cache_memory_gb=16.0)
    params = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
    counters = Counters(llm)
    print(f"gc thresholds {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen", flush=True)
    for run in range(args.runs):
        rng = random.Random(run)
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(128, 512))] for _ in range(args.requests)]
        counters.reset()
        mallocs = torch.cuda.memory_stats().get("num_device_alloc", 0)
        torch.cuda.synchronize()
        started = time.perf_counter()
        results = llm.generate_ids(prompts, params)
        seconds = time.perf_counter() - started
        steps = sorted(counters.steps)
        slow = ", ".join(f"{1e3 * s:.0f}" for s in steps[-5:])
        print(f"run {run}: {sum(len(r.token_ids) for r in results) / seconds:,.0f} tok/s in {seconds:.2f} s; "
              f"{len(steps)} steps, median {1e3 * steps[len(steps) // 2]:.2f} ms, slowest {slow} ms; "
              f"{len(counters.compiles)} Triton compiles {sorted(set(counters.compiles))[:6]}; "
              f"GC {1e3 * counters.gc_seconds:.0f} ms ({counters.gc_full} full); {len(counters.prefill_steps)} steps "
              f"with prefill rows took {sum(counters.prefill_steps):.2f} s, the others "
              f"{sum(steps) - sum(counters.prefill_steps):.2f} s; "
              f"{torch.cuda.memory_stats().get('num_device_alloc', 0) - mallocs} cudaMalloc", flush=True)
        for stack in counters.full_from:
            print(f"  full collection from: {stack}", flush=True)


if __name__ == "__main__":
    main()
