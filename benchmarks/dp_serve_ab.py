"""Data parallelism through the server, alternated in one call: `infer serve -dp A`, then `-dp B`, round after round.

    python benchmarks/dp_serve_ab.py [--sizes 1,2] [--rounds 3] [--level 1024] [--repeats 1]
                                     [--requests-per-stream 4] [--client-processes 16] [--api-server-count 4]
                                     [--tag NAME]

Each server is started afresh for its turn and measured as serve_vs_offline.py measures it (same prompts, settings,
clients and CPU placement; one first run, then the median of --repeats timed runs). A machine drifts by several
percent between calls and within one (benchmarks/reports/dp_serve_h200.md), so a scaling read off one server of
each size can move either way; alternating the sizes and taking each round's ratio puts both sides of a ratio in
the same minutes. Writes dp_serve_ab_<gpu>.{json,md} under OUT_DIR (default benchmarks/reports).
GPU run: `DPAB_ROUNDS=3 bash scripts/gpu_distributed.sh dpab`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import model_shapes as ms
from serve_vs_offline import run_server
from infer.engine.config import EngineConfig
from infer.server.launch import api_servers_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=list(ms.SHAPES))
    parser.add_argument("--sizes", default="1,2", help="data-parallel sizes served in turn, each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--level", type=int, default=1024, help="concurrent streams")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per server, after its first run")
    parser.add_argument("--requests-per-stream", type=int, default=4, metavar="R")
    parser.add_argument("--client-processes", type=int, default=16)
    parser.add_argument("--api-server-count", type=int, default=None)
    parser.add_argument("--serve-arg", action="append", default=[], metavar="FLAG=VALUE")
    parser.add_argument("--tag", default="", help="appended to the report's name (runs of one call side by side)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) < 2 or min(sizes) < 1 or args.rounds < 1 or args.repeats < 1:
        parser.error("--sizes needs two or more sizes >= 1; --rounds and --repeats at least 1")
    if max(sizes) > torch.cuda.device_count():
        parser.error(f"--sizes {args.sizes}: this machine has {torch.cuda.device_count()} GPU(s)")
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    vocab = ms.model_config(args.shape).vocab_size
    api_servers = api_servers_for(EngineConfig(device="cuda"), args.api_server_count)
    turns = []
    for round_ in range(args.rounds):
        for dp in sizes:
            started = time.time()
            out = run_server(path, vocab, [args.level], args.repeats, api_servers, data_parallel=dp,
                             client_processes=args.client_processes, serve_args=args.serve_arg,
                             per_stream=args.requests_per_stream)
            run = out[args.level]
            turns.append({"round": round_, "dp": dp, "tok_s": run["tok_s"], "first": run["first"],
                          "runs": run["runs"], "startup_s": out["startup_s"], "started": started,
                          "itl_p99_ms": run["itl_p99_ms"]})
            print(f"round {round_} -dp {dp}: {run['tok_s']:,.0f} tok/s (first run {run['first']:,.0f})", flush=True)
    write({"gpu": torch.cuda.get_device_name(), "shape": args.shape, "torch": torch.__version__, "sizes": sizes,
           "rounds": args.rounds, "level": args.level, "repeats": args.repeats,
           "requests_per_stream": args.requests_per_stream, "client_processes": args.client_processes,
           "api_server_count": api_servers, "serve_args": args.serve_arg, "tag": args.tag, "turns": turns})


def ratios(report: dict) -> dict[int, list[float]]:
    """Per size above the first: its rate over the first size's, round by round."""
    base = report["sizes"][0]
    by_round: dict[int, dict[int, float]] = {}
    for t in report["turns"]:
        by_round.setdefault(t["round"], {})[t["dp"]] = t["tok_s"]
    return {dp: [r[dp] / r[base] for r in by_round.values()] for dp in report["sizes"][1:]}


def write(r: dict) -> None:
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    gpu = r["gpu"].lower().replace("nvidia", "").split()[0]
    stem = f"dp_serve_ab_{gpu}" + (f"_{r['tag']}" if r.get("tag") else "")
    (out / f"{stem}.json").write_text(json.dumps(r, indent=2) + "\n")
    base = r["sizes"][0]
    lines = [f"# `infer serve -dp N`, sizes {', '.join(map(str, r['sizes']))} alternated — {r['shape']} (random bf16 "
             f"weights), {r['gpu']}", "",
             f"`python benchmarks/dp_serve_ab.py --sizes {','.join(map(str, r['sizes']))} --rounds {r['rounds']} "
             f"--level {r['level']} --repeats {r['repeats']} --requests-per-stream {r['requests_per_stream']} "
             f"--client-processes {r['client_processes']}`: a fresh server per turn, {r['api_server_count']} API "
             f"server(s), {r['level']} streams x {r['requests_per_stream']} requests of 256 new tokens, measured as "
             f"serve_vs_offline.py does (the median of {r['repeats']} timed run(s) after a first run). torch "
             f"{r['torch']}.", "",
             "| round | `-dp` | tok/s | first run | start s | ITL p99 ms |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {t['round']} | {t['dp']} | {t['tok_s']:,.0f} | {t['first']:,.0f} | {t['startup_s']:.1f} | "
              f"{t['itl_p99_ms']:.1f} |" for t in r["turns"]]
    lines += [""] + [f"-dp {dp} ÷ -dp {base}, round by round: {', '.join(f'{x:.2f}x' for x in xs)}; median "
                     f"**{statistics.median(xs):.2f}x**" for dp, xs in ratios(r).items()]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
