"""The steps an engine core runs when its prompts arrive as a served core's do, against all at once: measurable on
any machine, without an LLM.

    python benchmarks/admission_sim.py [--streams 512] [--requests-per-stream 4] [--client-steps 2] [--jitter 8]
                                       [--first-wave 50] [--patch FILE]

The real scheduler and KV manager (`EngineCore.step_core`) over a runner that returns at once (core_host_cost.py's
NullRunner), with the workload of `serve_vs_offline.py --requests-per-stream R` on one core of `-dp 2` (512 of the
1,024 streams, 128-512-token prompts, 256 new tokens, greedy, EOS ignored, batch 256). "offline": every request
added before the first step, as `LLM.generate_ids` gets them. "served": a closed loop, each stream adding its next
request --client-steps to --client-steps + --jitter steps after its last one ended, at random (the time its answer
takes to reach the client and the next request to reach the core), the first ones over --first-wave steps (the burst
of 1,024 streams reaching two cores through the API servers; 50 steps give the step mix the H200's DP=2 cores
showed). Reported per run: steps, decode-only steps, steps with prompt tokens and their mean prompt tokens, the decode
rows per step, and a step-time model fitted to an H200's cores (`dp_serve_core_probe_h200.md`: a decode-only step
DECODE_MS, a step with prompts PROMPT_STEP_MS + PROMPT_TOKEN_US a prompt token) that turns the step mix into tokens
a second. The model is a reading aid, not a measurement: the GPU runs (`scripts/gpu_distributed.sh dpab`) decide.
--patch FILE runs a Python file first (an .ab_patches file) to see what a scheduling change does to the mix.
Report: benchmarks/reports/admission_sim_cpu.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import core_host_cost as c
from infer.sampling.params import SamplingParams

NEW_TOKENS = 256
DECODE_MS = 2.65  # ~253 decode rows, Llama-3.2-1B shape, H200 (decode-only steps, every core alike)
PROMPT_STEP_MS, PROMPT_TOKEN_US = 7.0, 3.3  # a line through the served and offline steps with prompts


def workload(streams: int, per_stream: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [[[rng.randrange(1, c.VOCAB) for _ in range(rng.randint(128, 512))] for _ in range(per_stream)]
            for _ in range(streams)]


class _Spy:
    """The (decode rows, prompt tokens) of the last step the runner was given."""

    def __init__(self, runner: c.NullRunner) -> None:
        self.last = (0, 0)
        forward = runner.forward

        def spy(step):  # type: ignore[no-untyped-def]
            self.last = (sum(1 for q in step.query_lens if q == 1), sum(q for q in step.query_lens if q > 1))
            return forward(step)

        runner.forward = spy  # type: ignore[method-assign]


def run(prompts: list[list[list[int]]], served: bool, client_steps: int, jitter: int,
        first_wave: int) -> dict[str, float]:
    """One core through the whole workload; the step mix and the model's time for it."""
    core = c.build(False, 256)
    rng = random.Random(1)
    spy = _Spy(core.runner)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    queue = [list(stream) for stream in prompts]
    owner: dict[str, int] = {}
    due: list[tuple[int, int]] = []  # (step, stream): its next request goes in at that step

    def submit(stream: int) -> None:
        owner[core.add_request(queue[stream].pop(0), params).request_id] = stream

    for s in range(len(queue)):
        if served:  # the streams' first requests reach the core over the first `first_wave` steps
            due.append((rng.randint(0, first_wave), s))
        while queue[s] and not served:
            submit(s)
    steps = decode_only = 0
    prompt_steps: list[int] = []
    rows: list[int] = []
    while core.has_unfinished() or due:
        for entry in [d for d in due if d[0] <= steps]:
            due.remove(entry)
            submit(entry[1])
        steps += 1
        if not core.has_unfinished():  # nothing arrived yet: an idle step
            continue
        spy.last = (0, 0)
        out = core.step_core()
        decoding, prompt_tokens = spy.last
        rows.append(decoding)
        if prompt_tokens:
            prompt_steps.append(prompt_tokens)
        elif decoding:
            decode_only += 1
        for o in out.outputs:
            if o.finish_reason is not None and served and queue[owner[o.request_id]]:
                due.append((steps + client_steps + rng.randint(0, jitter), owner[o.request_id]))
    model_ms = decode_only * DECODE_MS + sum(PROMPT_STEP_MS + PROMPT_TOKEN_US * t / 1e3 for t in prompt_steps)
    return {"steps": steps, "decode_only": decode_only, "prompt_steps": len(prompt_steps),
            "prompt_tokens_per_step": statistics.mean(prompt_steps) if prompt_steps else 0.0,
            "decode_rows_per_step": statistics.mean(rows) if rows else 0.0,
            "model_tok_s": len(owner) * NEW_TOKENS / (model_ms / 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=512)
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--client-steps", type=int, default=2)
    parser.add_argument("--jitter", type=int, default=8, help="up to this many more steps, at random per request")
    parser.add_argument("--first-wave", type=int, default=50,
                        help="steps over which the streams' first requests reach the core (50: the served DP=2 "
                             "cores' step mix on the H200)")
    parser.add_argument("--patch", type=Path, help="a Python file run first (a scheduling change to try)")
    args = parser.parse_args()
    if args.patch:
        exec(compile(args.patch.read_text(), str(args.patch), "exec"), {})
    prompts = workload(args.streams, args.requests_per_stream, seed=0)
    print("| arrival | steps | decode-only | with prompts | prompt tokens a step | decode rows a step | "
          "model tok/s |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, served in (("all at once (offline)", False),
                         (f"closed loop, {args.client_steps}-{args.client_steps + args.jitter} steps back", True)):
        r = run(prompts, served, args.client_steps, args.jitter, args.first_wave)
        print(f"| {name} | {r['steps']} | {r['decode_only']} | {r['prompt_steps']} | "
              f"{r['prompt_tokens_per_step']:,.0f} | {r['decode_rows_per_step']:.0f} | {r['model_tok_s']:,.0f} |")


if __name__ == "__main__":
    main()
