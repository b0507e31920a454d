"""Where a decode step's time goes at batch B: host work, waiting for the device, and the device's own time.

    python benchmarks/step_profile.py [--shape llama-3.2-1b] [--batch 256] [--steps 100] [--top 25] [--probes]
        [--offline] [--sort cumulative]

B requests with prompts of 128 random tokens decode until every one runs; then `--steps` steps of the engine
core are timed (`EngineCore.step_core`, what the serving core process runs; text is processed beside the API).
`--offline` times `Engine.step` instead: the core and the text side in one process, as the offline `LLM` runs
them (its requests' text decoded at their end, as `LLM.generate_ids` asks). `--probes`: every request reads
probe_overhead's probe set (16 probes at each of 4 layers) every token.
Wait = time blocked reading a step's tokens (the device is behind the host); host = the rest of the step (text:
its text side); the steps' own times as percentiles show stalls.
Device = one CUDA-graph replay of the decode forward for B rows (sampling excluded), timed with events before and
after the timed steps; their mean is the forward at the steps' mean context (its attention grows linearly with it).
With the overlap, a step costs max(host, device): the smaller one is hidden. Memory bound = the bytes a step
must read (weights once, every row's KV at its context) over the device's copy bandwidth; the step's fraction
of it is bound / step. A cProfile of the same steps follows (it slows the host, so its times are only
proportions). Random weights, bf16, on CUDA. Appends its report as a line of step_profile_<gpu>.jsonl under
OUT_DIR when set.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import model_shapes as ms
from device_rates import copy_bandwidth, host_loop_ms
from infer import LLM, SamplingParams
from infer.frontend.text import TextProcessor
from infer.runners.cuda_graphs import CudaGraphs
from infer.runners.torch_runner import TorchRunner
from infer.transfer import Readback
from layerzero.perf.measure import measure
from probe_overhead import probe_file


class Clock:
    """Wraps `cls.name` to add up the time spent in it: Readback.read, blocked on the device;
    TextProcessor.process_step, the text side; TorchRunner.forward and .sample, queueing a step's device work (CudaGraphs.replay,
    launching its graph, part of it)."""

    def __init__(self, cls: type, name: str) -> None:
        self.seconds = 0.0
        self.longest = 0.0  # the longest single call: where a stalled step spent its time
        self._cls, self._name, self._method = cls, name, getattr(cls, name)

    def __enter__(self) -> "Clock":
        clock, method = self, self._method

        def timed(*args: object) -> object:
            started = time.perf_counter()
            try:
                return method(*args)
            finally:
                took = time.perf_counter() - started
                clock.seconds += took
                clock.longest = max(clock.longest, took)

        setattr(self._cls, self._name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._cls, self._name, self._method)


def device_ms(llm: LLM, batch: int, reps: int = 50) -> float:
    """ms per replay of the batch's decode graph (median). A replay rewrites the KV of the last step's positions from
    other input tokens: the timing is unaffected, the tokens after it are not what a real run would sample."""
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
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"], help="the cProfile's order")
    parser.add_argument("--probes", action="store_true", help="every request reads 64 probe scores every token")
    parser.add_argument("--offline", action="store_true", help="time Engine.step (core + text), not step_core")
    args = parser.parse_args()
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    cfg = ms.model_config(args.shape)
    options: dict[str, object] = {}
    if args.probes:
        options["probes"] = str(probe_file(Path(tempfile.mkdtemp()), cfg.hidden_size, cfg.num_hidden_layers))
    llm = LLM(str(path), load_format="dummy", max_seq_len=2048, max_batch_size=args.batch, kv_cache_memory_gb=20,
              **options)
    engine, rng = llm.engine, random.Random(0)
    step = engine.step if args.offline else engine.step_core
    params = SamplingParams(temperature=0, max_tokens=2 * args.steps + 64, ignore_eos=True,
                            probes=True if args.probes else None)
    requests = [engine.add_request([rng.randrange(cfg.vocab_size) for _ in range(128)], params,
                                   incremental_text=False) for _ in range(args.batch)]
    while not all(r.output_token_ids for r in requests):
        step()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    forward_before = device_ms(llm, args.batch)
    first = [r.num_tokens for r in requests]
    with Clock(Readback, "read") as wait, Clock(TextProcessor, "process_step") as text, \
            Clock(TorchRunner, "forward") as forward, Clock(TorchRunner, "sample") as sample, \
            Clock(CudaGraphs, "replay") as replay:
        started = lap = time.perf_counter()
        laps = []
        for _ in range(args.steps):
            step()
            now = time.perf_counter()
            laps.append(now - lap)
            lap = now
        seconds = time.perf_counter() - started
    p50, p90, p99 = (1e3 * float(np.percentile(laps, q)) for q in (50, 90, 99))
    step_ms, wait_ms, text_ms, launch_ms, replay_ms = (1e3 * s / args.steps for s in (
        seconds, wait.seconds, text.seconds, forward.seconds + sample.seconds, replay.seconds))
    contexts = [(a + r.num_tokens) // 2 for a, r in zip(first, requests)]  # a sequence's mean over the timed steps
    step_bytes = ms.weight_bytes(cfg) + sum(ms.kv_read_bytes(cfg, c) for c in contexts)
    bound_ms = 1e3 * step_bytes / copy_bandwidth()
    forward_ms = (forward_before + device_ms(llm, args.batch)) / 2
    report = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "batch": args.batch, "probes": args.probes,
              "offline": args.offline, "step_ms": step_ms,
              "host_ms": step_ms - wait_ms, "wait_ms": wait_ms, "text_ms": text_ms, "launch_ms": launch_ms,
              "graph_replay_ms": replay_ms,
              "longest_ms": {c: 1e3 * clock.longest for c, clock in
                             (("read", wait), ("text", text), ("forward", forward), ("sample", sample),
                              ("replay", replay))},
              "step_p50_p90_p99_ms": [p50, p90, p99], "device_forward_ms": forward_ms,
              "memory_bound_ms": bound_ms, "fraction_of_bound": bound_ms / step_ms,
              "mean_context": statistics.mean(contexts), "tok_s": args.batch / seconds * args.steps,
              "host_loop_ms": host_loop_ms()}
    what = "Engine.step" if args.offline else "step_core"
    print(f"{args.shape}, batch {args.batch}{', probes' if args.probes else ''}, {what}, {report['gpu']}: step "
          f"{step_ms:.2f} ms (host {step_ms - wait_ms:.2f} of which text {text_ms:.2f}, the runner's launch "
          f"{launch_ms:.2f} with its graph replay {replay_ms:.2f}; waiting {wait_ms:.2f}); "
          f"device forward {forward_ms:.2f} ms; memory bound {bound_ms:.2f} ms "
          f"(mean context {report['mean_context']:.0f}) -> {report['fraction_of_bound']:.2f} of it; "
          f"{report['tok_s']:.0f} tok/s; steps p50/p90/p99 {p50:.2f}/{p90:.2f}/{p99:.2f} ms; "
          f"host loop {report['host_loop_ms']:.0f} ms; longest single call (ms): "
          + ", ".join(f"{c} {ms_:.2f}" for c, ms_ in report["longest_ms"].items()))
    if os.environ.get("OUT_DIR"):
        gpu = report["gpu"].lower().replace("nvidia", "").split()[0]
        with open(Path(os.environ["OUT_DIR"], f"step_profile_{gpu}.jsonl"), "a") as f:  # one file for every run
            f.write(json.dumps(report) + "\n")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        step()
    profile.disable()
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
