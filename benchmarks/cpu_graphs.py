"""CPU decode graphs against eager decode, batch by batch, in one process: what replaying a recorded decode forward
saves (or costs) at each batch size, on the bundled SmolLM2 at the server's defaults.

    .venv/bin/python benchmarks/cpu_graphs.py [--batches 1,2,4,8,16,32] [--tokens 64] [--runs 3] [--cap 64]

For each batch size, `batch` different chat prompts are generated together (greedy, EOS ignored, `--tokens` new
tokens each, prefill included) by an engine with `use_cuda_graphs=False` (eager) and one with the default (CPU decode
graphs for buckets up to MAX_CPU_GRAPH_BATCH, or `--cap`: what the cap would give if raised), alternating, after a
warm-up generate each. A batch above the cap decodes eagerly either way. Writes benchmarks/reports/cpu_graphs.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from infer import LLM, SamplingParams
from infer.runners import cpu_graphs

REPORT = Path(__file__).parent / "reports" / "cpu_graphs.md"


def _rate(llm: LLM, ids: list[list[int]], params: SamplingParams) -> float:
    started = time.perf_counter()
    outs = llm.generate(ids, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="runs per engine and batch (median reported)")
    parser.add_argument("--cap", type=int, default=cpu_graphs.MAX_CPU_GRAPH_BATCH,
                        help="largest bucket recorded (default: the engine's MAX_CPU_GRAPH_BATCH)")
    args = parser.parse_args()
    cpu_graphs.MAX_CPU_GRAPH_BATCH = args.cap  # read when an engine builds its graphs
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    engines = {"eager": LLM(None, use_cuda_graphs=False), "graphs": LLM(None)}
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        chats = [[{"role": "user", "content": f"Tell me fact number {i + 1} about the sea."}] for i in range(batch)]
        ids = [engines["eager"].encode_chat(c) for c in chats]
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for llm in engines.values():
            llm.generate(ids, params)  # warm-up: selection, and the graphs' eager step and recording
        for _ in range(args.runs):
            for name, llm in engines.items():
                rates[name].append(_rate(llm, ids, params))
        eager, graphs = statistics.median(rates["eager"]), statistics.median(rates["graphs"])
        rows.append((batch, eager, graphs, rates))
        print(f"batch {batch}: eager {eager:.1f} tok/s, graphs {graphs:.1f} tok/s, {graphs / eager:.2f}x", flush=True)
    stats = engines["graphs"].engine.runner.graphs.stats
    lines = [
        "# CPU decode graphs against eager decode — SmolLM2-135M-Instruct (GGUF Q4_1 kept 4-bit), server defaults",
        "",
        f"Hardware: x86_64, {torch.get_num_threads()} threads. Software: torch {torch.__version__}.",
        f"Each row: that many different chat prompts generated together, {args.tokens} new tokens each (greedy, EOS "
        f"ignored), generated tokens over wall time with the prefill included; median of {args.runs} runs, the two "
        f"engines alternating in one process. Buckets above {args.cap} rows decode eagerly either way"
        f"{'' if args.cap == 32 else ' (the engine caps them at 32; this run set the cap)'}.",
        "",
        "| batch | eager tok/s | graphs tok/s | graphs ÷ eager | runs (eager / graphs) |",
        "|---:|---:|---:|---:|---|",
        *(f"| {b} | {e:.1f} | {g:.1f} | {g / e:.2f} | {[round(x, 1) for x in r['eager']]} / "
          f"{[round(x, 1) for x in r['graphs']]} |" for b, e, g, r in rows),
        "",
        f"Recorded buckets at the end: {stats.batch_sizes}, {stats.memory_bytes / 2**20:.1f} MiB kept, "
        f"{stats.capture_seconds * 1e3:.0f} ms spent recording.",
        "",
        f"Reproduce: `.venv/bin/python benchmarks/cpu_graphs.py --batches {args.batches} --tokens {args.tokens} "
        f"--runs {args.runs} --cap {args.cap}`",
        "",
    ]
    REPORT.write_text("\n".join(lines))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
