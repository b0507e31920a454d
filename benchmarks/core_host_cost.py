"""The engine core's host time per step with a runner that does nothing: what scheduling, KV bookkeeping, the step
input and output processing cost the host, measurable on any machine.

    python benchmarks/core_host_cost.py [--requests 256] [--new-tokens 512] [--repeats 3] [--profile 25]

Workload: nano-vllm's offline one (prompts of 100-1024 random token ids, `--new-tokens` each, greedy, EOS ignored),
through `EngineCore.step_core` (what the serving core process runs) with prefix caching on and off, both cores
resident and their runs interleaved, fresh prompts each repeat (so the cache never hits and, once full, evicts).
The runner returns a constant token at once, so every step's time is host time. Reported: the median over repeats
of the whole run's ms per step and of the decode-only steps' (every request running); `--profile N` adds a cProfile
of one more run of the defaults, its N largest functions by own time. Writes core_host_cost_<tag>.{json,md} under
OUT_DIR (default benchmarks/reports), tag `cpu` unless --tag.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from engine_fakes import Done, FakeTokenizer  # noqa: E402  (the tests' model-free tokenizer)

from infer.heap import settle_heap  # noqa: E402
from infer.engine.config import EngineConfig  # noqa: E402
from infer.engine.core import EngineCore  # noqa: E402
from infer.kv.kv_manager import KVCacheManager  # noqa: E402
from infer.runners.step import StepInput, StepResult  # noqa: E402
from infer.sampling.params import SamplingParams  # noqa: E402
from omniscience.bank import ProbeLayout  # noqa: E402
from report_files import write_report  # noqa: E402

VOCAB = 32000
BLOCK_SIZE = 16
NUM_BLOCKS = 28000  # ~14 GB of Llama-3.2-1B KV: the offline benchmark's cache, so a full one evicts as there


class LoadedProbes(NamedTuple):
    """What the engine reads of a runner's probe bank: the loaded set's layout."""

    layout: ProbeLayout


class NullRunner:
    """Returns token 7 for every sequence at once (and, with a probe `layout`, random scores for every loaded probe
    when the step asks for them): the step costs the device nothing."""

    vocab_size = VOCAB
    launches_ahead = True  # as the GPUs' runner: the core's overlapped step path

    def __init__(self, layout: ProbeLayout | None = None) -> None:
        self.layout = layout
        self.probes = None if layout is None else LoadedProbes(layout)
        self.rng = np.random.default_rng(0)

    def check(self) -> None:
        """Never loses a rank."""

    def close(self) -> None:
        """Nothing to release."""

    def forward(self, step: StepInput) -> StepInput:
        return step

    def sample(self, step: StepInput, masks: object) -> Done:
        result = StepResult(token_ids=[7] * step.num_seqs)
        if step.probes and self.layout is not None:
            result.probe_layout = self.layout
            result.probe_scores = self.rng.random((step.num_seqs, len(self.layout.probes)), dtype=np.float32)
        return Done(result)


def build(prefix_caching: bool, batch: int) -> EngineCore:
    config = EngineConfig(max_seq_len=2048, max_batch_size=batch, use_prefix_caching=prefix_caching)
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, prefix_caching=prefix_caching)
    return EngineCore(config, NullRunner(), kv, FakeTokenizer())  # type: ignore[arg-type]


def workload(requests: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(100, 1024))] for _ in range(requests)]


def run(core: EngineCore, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(ms per step over the run, ms per step while every request decodes)."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    requests = [core.add_request(p, params) for p in prompts]
    steps, decode_steps, total, decode_s = 0, 0, 0.0, 0.0
    while core.has_unfinished():
        decoding = all(r.output_token_ids for r in requests) and not any(r.finished for r in requests)
        started = time.perf_counter()
        core.step_core()
        took = time.perf_counter() - started
        total += took
        steps += 1
        if decoding:
            decode_s += took
            decode_steps += 1
    return 1e3 * total / steps, 1e3 * decode_s / max(decode_steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="functions listed from a profiled run (0: none)")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    cores = {"prefix caching on (the default)": build(True, args.requests),
             "prefix caching off": build(False, args.requests)}
    settle_heap()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cores}
    for repeat in range(args.repeats):
        prompts = workload(args.requests, seed=repeat)
        for name, core in cores.items():
            runs[name].append(run(core, prompts, args.new_tokens))
    result = {name: {"ms_per_step": statistics.median(r[0] for r in rs),
                     "decode_ms_per_step": statistics.median(r[1] for r in rs), "runs": rs}
              for name, rs in runs.items()}
    lines = [f"# Engine-core host time per step ({platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()})", "",
             f"`python benchmarks/core_host_cost.py --requests {args.requests} --new-tokens {args.new_tokens}`: "
             f"nano-vllm's workload through `EngineCore.step_core` with a runner that returns at once, medians of "
             f"{args.repeats} interleaved runs (fresh prompts each, the prefix cache full and evicting from the "
             "second on).", "",
             f"| core | ms per step, whole run | ms per step, {args.requests} requests decoding |", "|---|---:|---:|"]
    for name, r in result.items():
        lines.append(f"| {name} | {r['ms_per_step']:.3f} | {r['decode_ms_per_step']:.3f} |")
    if args.profile:
        prompts = workload(args.requests, seed=99)
        profiler = cProfile.Profile()
        profiler.enable()
        run(cores["prefix caching on (the default)"], prompts, args.new_tokens)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        body = text.getvalue()
        body = body[body.index("ncalls"):] if "ncalls" in body else body
        lines += ["", f"One more run of the defaults under cProfile (it slows the host; read proportions), the "
                      f"{args.profile} largest functions by own time:", "", "```", body.rstrip().replace(
                          str(Path(__file__).resolve().parent.parent) + "/", ""), "```"]
    markdown = "\n".join(lines) + "\n"
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    write_report(out / f"core_host_cost_{args.tag}", {"args": vars(args), "result": result}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
