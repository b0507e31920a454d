"""Where a batch-1 decode step of the Qwen3-30B-A3B shape spends device time, kernel by kernel: eager steps (no CUDA
graph, so each kernel is its own record) under torch.profiler, kernel times summed by name over `--steps` steps and
given per step, beside the step's memory bound (benchmarks/moe_decode.py's: the active weights and the KV over the
copy bandwidth). Eager launches leave gaps between kernels; the kernels' own times are what a graph replays.
`--graph` profiles the replayed CUDA graph instead and charges each kernel the time by which it moves the step's end
(its end minus the latest end before it, so what PDL overlaps costs nothing): the step's critical path, by kernel.
Any shape of benchmarks/model_shapes.py profiles alike; `--tp N` profiles rank 0 of tensor parallelism (its
collectives include the time spent waiting for the other ranks; the bound is the per-rank share).

    python benchmarks/moe_kernel_profile.py --out benchmarks/reports/moe_kernel_profile_h200
    python benchmarks/moe_kernel_profile.py --graph --shape llama-3.1-8b --tp 2 --out /tmp/tp2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import model_shapes as ms
from device_rates import copy_bandwidth
from gpu_decode.engine import decode_once, greedy, step
from gpu_decode.plan import prompt_ids
from infer import LLM
from report_files import write_report


def kernel_spans(prof: profile) -> tuple[list[tuple[str, float, float]], dict[float, tuple[str, float]]]:
    """(name, start µs, end µs) of every device kernel and copy the profile recorded, by start; and, by start, the
    host call that launched it (name, host time µs) where the profile recorded host activity."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    host = {e["args"]["correlation"]: (e["name"], float(e["ts"])) for e in events
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    spans = sorted(((e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in device),
                   key=lambda s: s[1])
    launched = {float(e["ts"]): host[e["args"]["correlation"]] for e in device
                if e.get("args", {}).get("correlation") in host}
    return spans, launched


def critical_path(spans: list[tuple[str, float, float]]) -> list[tuple[str, float, float, float]]:
    """(name, duration, gap after the latest end before it, charge): a kernel's charge is how far it moves the
    latest end, so time PDL overlaps with the kernel before it costs nothing and a launch gap counts as the kernel's."""
    out, latest = [], None
    for name, start, end in spans:
        gap = 0.0 if latest is None else start - latest
        charge = end - start if latest is None else max(0.0, end - latest)
        out.append((name, end - start, gap, charge))
        latest = end if latest is None else max(latest, end)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--graph", action="store_true", help="profile the replayed CUDA graph (critical path by kernel)")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (the profile is rank 0's)")
    p.add_argument("--max-batch-size", type=int, default=4, help="the engine's (moe_decode.py's headline: 256)")
    p.add_argument("--max-seq-len", type=int, default=512, help="the engine's (moe_decode.py's headline: 1152)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cfg = ms.model_config(args.shape)
    bw = copy_bandwidth()
    bound_s = ms.active_weight_bytes(cfg, ms.expected_experts(cfg, 1), 2) / bw / args.tp
    with tempfile.TemporaryDirectory() as root:
        llm = LLM(str(ms.write_model_dir(args.shape, Path(root))), load_format="dummy", dtype="bfloat16",
                  max_batch_size=args.max_batch_size, kv_cache_memory_gb=4.0, max_seq_len=args.max_seq_len,
                  use_cuda_graphs=args.graph, use_prefix_caching=False, tensor_parallel_size=args.tp)
        ids = prompt_ids(llm.runner.vocab_size, 128, seed=1)
        decode_once(llm, ids, 8)  # warm-up: compiles, selections
        llm.engine.add_request(ids, greedy(args.steps + 8))
        for _ in range(4):  # the prefill and a few decode steps before the profile
            step(llm)
        torch.cuda.synchronize()
        activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.graph else [])
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                step(llm)
            torch.cuda.synchronize()
        while llm.engine.has_unfinished():
            step(llm)
    if args.graph:
        graph_report(args, *kernel_spans(prof), bw, bound_s, cfg.num_hidden_layers)
    else:
        eager_report(args, prof, bw, bound_s)
    if args.tp > 1:
        os._exit(0)  # no NCCL teardown (it can wait on ranks that are gone)


def report_head(args: argparse.Namespace, bw: float, bound_s: float) -> tuple[str, dict[str, object]]:
    """What both reports start with: the title's model (and TP rank), and the run's facts for the JSON."""
    tp = f", TP={args.tp} rank 0" if args.tp > 1 else ""
    return f"{args.shape}{tp}", {"shape": args.shape, "tp": args.tp, "steps": args.steps, "copy_bandwidth": bw,
                                 "bound_ms": 1e3 * bound_s}


def eager_report(args: argparse.Namespace, prof: profile, bw: float, bound_s: float) -> None:
    """Device time by kernel name per step, beside the memory bound."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time_total / 1e6 if hasattr(event, "device_time_total") else \
                event.cuda_time_total / 1e6
            counts[event.name] += 1
    per_step = {name: s / args.steps for name, s in totals.items()}
    device_s = sum(per_step.values())
    rows = sorted(per_step.items(), key=lambda kv: -kv[1])[: args.top]
    title, data = report_head(args, bw, bound_s)
    data |= {"device_ms_per_step": 1e3 * device_s,
             "kernels": [{"name": n, "ms_per_step": 1e3 * s, "calls_per_step": counts[n] / args.steps} for n, s in rows]}
    lines = [f"# {title}: device time of a batch-1 decode step by kernel (eager, torch.profiler)", "",
             f"`python benchmarks/moe_kernel_profile.py`; {args.steps} steps; kernels' own time "
             f"{1e3 * device_s:.2f} ms a step against a memory bound of {1e3 * bound_s:.2f} ms "
             f"({bound_s / device_s:.2f} of it).", "",
             "| kernel | ms / step | calls / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{n[:90]}` | {1e3 * s:.3f} | {counts[n] / args.steps:.0f} | {s / device_s:.2f} |" for n, s in rows]
    write_report(args.out, data, "\n".join(lines))
    print("\n".join(lines))


def graph_report(args: argparse.Namespace, spans: list[tuple[str, float, float]],
                 launched: dict[float, tuple[str, float]], bw: float, bound_s: float, layers: int) -> None:
    """Charges by kernel name per step, one layer's kernels in order (the middle of the middle step) and the step
    boundary (the kernels around the middle step's widest gap), with when the host launched each of them."""
    path = critical_path(spans)
    charge: dict[str, float] = defaultdict(float)
    own: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for name, dur, _, c in path:
        charge[name] += c / args.steps
        own[name] += dur / args.steps
        counts[name] += 1
    step_us = sum(charge.values())
    per_step = len(path) // args.steps
    layer = max(1, (per_step - 8) // layers)  # a layer's kernels: the step's, less the few outside the layers
    middle = args.steps // 2 * per_step + per_step // 2
    rows = sorted(charge.items(), key=lambda kv: -kv[1])[: args.top]
    title, data = report_head(args, bw, bound_s)
    data |= {"charged_ms_per_step": step_us / 1e3, "kernels_per_step": per_step,
             "kernels": [{"name": n, "charged_us_per_step": c, "own_us_per_step": own[n],
                          "calls_per_step": counts[n] / args.steps} for n, c in rows],
             "layer": [{"name": n, "us": d, "gap_us": g, "charged_us": c} for n, d, g, c in
                       path[middle: middle + layer]]}
    lines = [f"# {title}: a batch-1 decode step's critical path by kernel (CUDA graph, torch.profiler)", "",
             f"`python benchmarks/moe_kernel_profile.py --graph`; {args.steps} steps; {per_step} kernels a step, "
             f"charged {step_us / 1e3:.3f} ms a step against a memory bound of {1e3 * bound_s:.3f} ms "
             f"({1e3 * bound_s / (step_us / 1e3):.2f} of it). A kernel's charge: how far it moves the step's end.", "",
             "| kernel | charged µs / step | own µs / step | calls / step |", "|---|---:|---:|---:|"]
    lines += [f"| `{n[:80]}` | {c:.1f} | {own[n]:.1f} | {counts[n] / args.steps:.0f} |" for n, c in rows]
    lines += ["", "One layer in order (µs):", "", "| kernel | own | gap | charged |", "|---|---:|---:|---:|"]
    lines += [f"| `{n[:80]}` | {d:.2f} | {g:.2f} | {c:.2f} |" for n, d, g, c in path[middle: middle + layer]]
    # the step boundary: around the widest gap of the middle step (the host's turn between two replays)
    window = range(max(1, middle - per_step // 2), min(len(path), middle + per_step // 2))
    widest = max(window, key=lambda i: path[i][2], default=None)
    if widest is not None:
        first, last = max(0, widest - 10), min(len(path), widest + 12)
        lines += ["", "The step boundary (µs; launched: the host's launch call, from the first listed kernel's end):",
                  "", "| kernel | own | gap | charged | launched by | launched at |", "|---|---:|---:|---:|---|---:|"]
        origin = spans[first][2]
        for i in range(first, last):
            n, d, g, c = path[i]
            call, at = launched.get(spans[i][1], ("", float("nan")))
            lines.append(f"| `{n[:60]}` | {d:.2f} | {g:.2f} | {c:.2f} | {call} | {at - origin:.1f} |")
        data["boundary"] = lines[-(last - first):]
    write_report(args.out, data, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
