"""CPU time the offline data-parallel client spends per generated token: the ceiling it puts on DP throughput.

    python benchmarks/dp_client_cost.py --report benchmarks/reports/dp_client_cost_cpu.md

`LLM(data_parallel_size=N)` receives every engine's tokens in the calling process (DPClient: ZMQ, msgpack,
incremental detokenization, one asyncio stream per request). This runs it on the CPU against engine cores serving
a tiny random Llama (tests/checkpoints.py; its forward is cheap, so the cores keep the client busy) and reads the
client process's own CPU time (time.process_time) over a run: CPU µs per token, and 1e6 / that = the most tokens
per second one client process can take, whatever the engines could produce. A cProfile of one run lists where it
goes. Random prompts, greedy, EOS ignored, all submitted at once.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from checkpoints import save_tiny_with_tokenizer  # noqa: E402

from infer import LLM, SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        path = save_tiny_with_tokenizer("llama", Path(root))
        llm = LLM(str(path), data_parallel_size=args.dp, max_batch_size=256, max_seq_len=256)
        params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
        rng = random.Random(0)
        llm.generate_ids([[rng.randrange(3, 300) for _ in range(8)] for _ in range(8)], params)  # warm-up
        rows = []
        profile_text = ""
        for repeat in range(args.repeats):
            prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(16, 64))] for _ in range(args.requests)]
            profiler = cProfile.Profile() if repeat == args.repeats - 1 else None
            wall, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            outs = llm.generate_ids(prompts, params)
            if profiler is not None:
                profiler.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens = sum(len(o.token_ids) for o in outs)
            rows.append((tokens, wall, cpu, profiler is not None))
            if profiler is not None:
                stream = io.StringIO()
                pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(12)
                profile_text = stream.getvalue()
        llm.close()  # type: ignore[attr-defined]
    lines = [f"# The offline DP client's CPU time per token (DP={args.dp}, CPU)", "",
             f"`python benchmarks/dp_client_cost.py --dp {args.dp}` on {platform.node()} ({platform.processor() or 'cpu'}); "
             f"{args.requests} requests x {args.new_tokens} tokens, tiny random Llama; the last run under cProfile.", "",
             "| run | tokens | wall s | client CPU s | client CPU us per token | ceiling tok/s (1e6 / us) |",
             "|---|---:|---:|---:|---:|---:|"]
    for i, (tokens, wall, cpu, profiled) in enumerate(rows):
        us = 1e6 * cpu / tokens
        lines.append(f"| {i + 1}{' (profiled)' if profiled else ''} | {tokens} | {wall:.2f} | {cpu:.2f} | {us:.1f} | "
                     f"{1e6 / us:,.0f} |")
    lines += ["", "Top functions by own time (the profiled run):", "", "```", profile_text.strip(), "```"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        args.report.write_text(text)


if __name__ == "__main__":
    main()
