"""torch.profiler record of N steady-state decode steps of infer at one model shape and batch (random weights).

    python benchmarks/profile_generation.py --model llama-3.2-1b --batch 1 --steps 20 --graphs --out DIR
    python benchmarks/profile_generation.py --model tiny-llama --steps 4 --out /tmp/prof   # on the CPU
    python benchmarks/profile_generation.py --model llama-3.1-8b --tp 2 --out DIR   # rank 0 of tensor parallelism
    python benchmarks/profile_generation.py --batch 256 --graphs --core --out DIR   # the serving core's step

Writes DIR/trace.json (Chrome trace: ui.perfetto.dev or chrome://tracing; gzipped to trace.json.gz when over
15 MiB) and DIR/kernels.md: the top kernels by total GPU time (count, average µs, share of the step time),
and GPU busy time (union of kernel intervals) against wall time per step; the difference is the GPU idle gap
that launch overhead and host work leave. On the CPU the table lists operators by self CPU time instead.
With --tp N the profile is rank 0's: its collectives' kernels include the time spent waiting for the other ranks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import model_shapes as ms
from infer import LLM, SamplingParams
from infer.kv.sizing import kv_bytes_per_token

TRACE_LIMIT_BYTES = 15 * 2**20  # the device tool brings back files of up to 16 MiB
MODES = {True: "on", False: "off", None: "default"}
STEP_RANGE = "decode_step"  # record_function name around each step (also projected onto the GPU timeline)


GAP_LIMIT_US = 50.0  # a longer idle time before a kernel is the host's, not the boundary's


@dataclass
class KernelRow:
    name: str
    count: int
    total_us: float
    gaps_us: list[float] = field(default_factory=list)  # idle time before each launch, when under GAP_LIMIT_US


def build_llm(args: argparse.Namespace) -> LLM:
    """An LLM sized for `batch` sequences of prompt + warm-up + profiled steps, nothing more."""
    seq = args.max_seq_len or args.prompt_len + args.warmup + args.steps + 64
    dtype = getattr(torch, args.dtype)
    kv_gb = 1.2 * (args.batch + 1) * seq * kv_bytes_per_token(ms.model_config(args.model), dtype) / 2**30
    path = ms.write_model_dir(args.model, Path(args.model_root))
    return LLM(str(path), load_format="dummy", dtype=args.dtype, device=args.device, use_cuda_graphs=args.graphs,
               max_batch_size=args.batch, max_seq_len=seq, kv_cache_memory_gb=kv_gb, tensor_parallel_size=args.tp)


def step(llm: LLM, core: bool = False) -> int:
    """One engine step (`core`: the engine core's alone, as the serving core process runs it); returns the tokens
    it output."""
    if core:
        out = llm.engine.step_core()
        errors = [o.error for o in out.outputs if o.error]
        tokens = len(out.token_ids) + sum(o.token_id is not None for o in out.outputs)
    else:
        outs = llm.engine.step()
        errors = [o.error for o in outs if o.error]
        tokens = sum(o.token_id is not None for o in outs)
    if errors:
        raise RuntimeError(f"engine step failed: {errors[0]}")
    return tokens


def start_decoding(llm: LLM, args: argparse.Namespace) -> None:
    """Admit `batch` requests with distinct random prompts (one shared prompt would share its KV blocks through the
    prefix cache, and the attention would read them from L2), run every prefill, then the warm-up decode steps."""
    rng = random.Random(0)
    vocab = llm.runner.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.warmup + args.steps + 32, ignore_eos=True)
    requests = [llm.engine.add_request([rng.randrange(2, vocab) for _ in range(args.prompt_len)], params)
                for _ in range(args.batch)]
    while any(not r.output_token_ids for r in requests):
        step(llm, args.core)
    for _ in range(args.warmup):
        step(llm, args.core)


def record(llm: LLM, args: argparse.Namespace) -> tuple[profile, list[float], int]:
    """Profile `steps` decode steps; returns the profiler, each step's wall seconds and the tokens output."""
    cuda = args.device.startswith("cuda")
    host = [] if cuda and args.device_only else [ProfilerActivity.CPU]
    activities = host + ([ProfilerActivity.CUDA] if cuda else [])
    walls, tokens = [], 0
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            start = time.perf_counter()
            with record_function(STEP_RANGE):
                if args.replays:  # the decode graph alone, back to back: wall = the host's launch of a replay
                    llm.runner.graphs.replay(llm.runner.graphs.bucket(args.batch))
                else:
                    tokens += step(llm, args.core)
            walls.append(time.perf_counter() - start)
        if cuda:
            start = time.perf_counter()
            torch.cuda.synchronize()
            walls[-1] += time.perf_counter() - start  # the last step's GPU work belongs to the window
    return prof, walls, tokens


def device_kernels(prof: profile) -> tuple[list[KernelRow], float]:
    """Per-name GPU time of kernels, memcpys and memsets, the idle time before each, and the union of their
    intervals (busy µs)."""
    rows: dict[str, KernelRow] = {}
    events = []
    for evt in prof.events():
        annotation = getattr(evt, "is_user_annotation", False) or evt.name == STEP_RANGE
        if evt.device_type != DeviceType.CUDA or annotation:
            continue
        events.append((evt.time_range.start, evt.time_range.end, evt.name))
    end = float("-inf")
    for s, e, name in sorted(events):
        row = rows.setdefault(name, KernelRow(name, 0, 0.0))
        row.count += 1
        row.total_us += e - s
        if 0 <= s - end < GAP_LIMIT_US:
            row.gaps_us.append(s - end)
        end = max(end, e)
    return sorted(rows.values(), key=lambda r: -r.total_us), union_us([(s, e) for s, e, _ in events])


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def cpu_operators(prof: profile) -> list[KernelRow]:
    """Operators by self CPU time (the CPU has no kernels to list)."""
    rows = [KernelRow(a.key, a.count, a.self_cpu_time_total) for a in prof.key_averages()]
    return sorted(rows, key=lambda r: -r.total_us)


def export_trace(prof: profile, out: Path) -> Path:
    """trace.json, gzipped when too large to bring back from the device machine."""
    path = out / "trace.json"
    prof.export_chrome_trace(str(path))
    if path.stat().st_size <= TRACE_LIMIT_BYTES:
        return path
    gz = out / "trace.json.gz"
    with path.open("rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return gz


def graph_stats(llm: LLM) -> object:
    stats = getattr(llm.runner, "graph_stats", None)
    return asdict(stats) if is_dataclass(stats) else stats


def summary_md(args: argparse.Namespace, llm: LLM, prof: profile, walls: list[float], tokens: int, trace: Path) -> str:
    """kernels.md: setup, per-step wall vs GPU busy time, then the top kernels (or CPU operators)."""
    cuda = args.device.startswith("cuda")
    wall_us = 1e6 * sum(walls)
    per_step = wall_us / args.steps
    where = torch.cuda.get_device_name() if cuda else "CPU"
    lines = [
        f"# Decode profile: {args.model}, batch {args.batch}, CUDA graphs {MODES[args.graphs]}"
        + (", engine core" if args.core else "") + (", graph replays" if args.replays else "")
        + (f", TP={args.tp} (rank 0)" if args.tp > 1 else ""),
        "",
        f"{where}; torch {torch.__version__}; {args.dtype}; prompt {args.prompt_len} tokens; {args.steps} decode steps "
        f"profiled after {args.warmup} warm-up steps; {tokens} tokens out. Trace: `{trace.name}`.",
        f"graph_stats: `{json.dumps(graph_stats(llm), default=str)}`",
        "",
        f"Wall per step: {per_step:.1f} µs (mean; median {1e6 * statistics.median(walls):.1f} µs of host time per "
        f"step() call).",
    ]
    if cuda:
        rows, busy_us = device_kernels(prof)
        kernels = sum(r.count for r in rows)
        lines += [
            f"GPU busy per step: {busy_us / args.steps:.1f} µs (union of kernel intervals) → idle gap "
            f"{(wall_us - busy_us) / args.steps:.1f} µs per step; busy fraction {busy_us / wall_us:.2f}; "
            f"{kernels / args.steps:.1f} kernels per step; idle time before kernels that follow another within "
            f"{GAP_LIMIT_US:.0f} µs (kernel boundaries): {sum(sum(r.gaps_us) for r in rows) / args.steps:.1f} µs "
            "per step.",
            "",
            "| kernel | count | per step | total µs | avg µs | share of step time | median idle before, µs |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
    else:
        rows = cpu_operators(prof)
        lines += ["GPU busy time: n/a on the CPU; operators by self CPU time.", "",
                  "| operator | count | per step | self µs | avg µs | share of step time |",
                  "|---|---:|---:|---:|---:|---:|"]
    for r in rows[: args.top]:
        name = r.name if len(r.name) <= 100 else r.name[:97] + "..."
        gap = f" {statistics.median(r.gaps_us):.2f} |" if r.gaps_us else (" |" if cuda else "")
        lines.append(f"| `{name}` | {r.count} | {r.count / args.steps:.1f} | {r.total_us:.0f} | "
                     f"{r.total_us / r.count:.1f} | {r.total_us / wall_us:.3f} |{gap}")
    lines += ["", f"EngineConfig: `{json.dumps(llm.config.as_dict(), default=str)}`", ""]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.2-1b", choices=list(ms.SHAPES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="decode steps recorded")
    parser.add_argument("--warmup", type=int, default=8, help="decode steps run before recording")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=0,
                        help="the engine's max_seq_len (default: just what the run needs; serving uses 2048 and more)")
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                        help="use_cuda_graphs (default: the engine's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--top", type=int, default=30, help="kernels listed")
    parser.add_argument("--core", action="store_true",
                        help="profile the engine core's step (step_core, what `infer serve`'s core runs), not the "
                             "offline Engine.step")
    parser.add_argument("--device-only", action="store_true",
                        help="record the device's activity alone (no host events): the host runs at nearly full speed")
    parser.add_argument("--replays", action="store_true",
                        help="profile back-to-back replays of the batch's decode graph, not engine steps (needs "
                             "CUDA graphs; each replay rewrites the last step's KV, so the run's tokens are not kept)")
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (the profile is rank 0's)")
    parser.add_argument("--model-root", default="/tmp/infer_bench_models")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.replays and (args.graphs is False or not args.device.startswith("cuda")):
        parser.error("--replays replays the decode graph: it needs CUDA graphs")
    return args


def main() -> None:
    args = parse_args()
    llm = build_llm(args)
    start_decoding(llm, args)
    prof, walls, tokens = record(llm, args)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = export_trace(prof, args.out)
    text = summary_md(args, llm, prof, walls, tokens, trace)
    (args.out / "kernels.md").write_text(text)
    print(text, flush=True)
    if args.tp > 1:
        os._exit(0)  # no NCCL teardown (it can wait on ranks that are gone)


if __name__ == "__main__":
    main()
