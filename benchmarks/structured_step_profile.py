"""Where a structured-output step's host time goes: wall time per engine step split into the parts the overlap
must hide (schedule, step input, forward, masks, sample, the wait for the step before, grammar advance, mask fill, output
processing), at 0% and 100% constrained (twice, interleaved), and with --cprofile a top list of a constrained run.

    python3 benchmarks/structured_step_profile.py --model .bench/llama1b-smollm2 --load-format dummy --batch 64
"""

from __future__ import annotations

import argparse
import cProfile
import collections
import io
import json
import pstats
import time
from pathlib import Path

import infer.build.in_process as engine_module
import infer.engine.core as core_module
import infer.runners.torch_runner as torch_runner
import infer.structured.masks as masks
from infer import LLM, SamplingParams
from infer.engine.outputs import OutputProcessor
from infer.engine.scheduler import Scheduler
from infer.structured import Constraint

SCHEMAS = sorted((Path(__file__).parents[1] / "tests" / "fixtures" / "jsonschema").glob("*.json"))
TIMES: dict[str, float] = collections.defaultdict(float)


def timed(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES[label] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cprofile", action="store_true", help="also print cProfile's top list of a constrained run")
    args = parser.parse_args()
    llm = LLM(args.model, load_format=args.load_format, max_batch_size=args.batch)
    constraints = []
    for path in SCHEMAS:
        try:
            constraint = Constraint.json_schema(json.loads(path.read_text())["schema"])
            llm.engine.grammars.compile(constraint)
            constraints.append(constraint)
        except Exception:
            continue
    prompts = [llm.encode(f"JSON please {i}") for i in range(args.batch)]
    for owner, name, label in [
        (engine_module.Engine, "step", "engine.step"),
        (Scheduler, "schedule", "schedule"),
        (core_module, "step_input", "step_input"),
        (torch_runner.TorchRunner, "forward", "runner.forward"),
        (core_module.EngineCore, "_masks", "masks (incl. resolve)"),
        (torch_runner.TorchRunner, "sample", "runner.sample"),
        (torch_runner.LaunchedStep, "result", "readback wait"),
        (core_module, "advance", "grammar advance"),
        (masks, "_fill", "mask fill (worker thread)"),
        (OutputProcessor, "process", "process outputs"),
    ]:
        timed(owner, name, label)
    llm.generate_ids(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
    for share in (0.0, 1.0, 0.0, 1.0):
        params = [SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True,
                                 structured=constraints[i % len(constraints)] if i < share * args.batch else None)
                  for i in range(args.batch)]
        TIMES.clear()
        started = time.perf_counter()
        outs = llm.generate_ids(prompts, params)
        wall = time.perf_counter() - started
        steps = args.tokens
        print(f"\n## {share:.0%} constrained: {sum(len(o.token_ids) for o in outs) / wall:.0f} tok/s, "
              f"{wall / steps * 1e3:.2f} ms per token step")
        for label, seconds in TIMES.items():
            print(f"  {label:28s} {seconds / steps * 1e3:7.3f} ms/step")
    if not args.cprofile:
        return
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate_ids(prompts, params)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue()[:8000])


if __name__ == "__main__":
    main()
