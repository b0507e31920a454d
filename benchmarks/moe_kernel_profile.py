"""Where a batch-1 decode step of the Qwen3-30B-A3B shape spends device time, kernel by kernel: eager steps (no CUDA
graph, so each kernel is its own record) under torch.profiler, kernel times summed by name over `--steps` steps and
given per step, beside the step's memory bound (benchmarks/moe_decode.py's: the active weights and the KV over the
copy bandwidth). Eager launches leave gaps between kernels; the kernels' own times are what a graph replays.

    python benchmarks/moe_kernel_profile.py --out benchmarks/reports/moe_kernel_profile_h200
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cfg = ms.model_config(args.shape)
    bw = copy_bandwidth()
    bound_s = ms.active_weight_bytes(cfg, ms.expected_experts(cfg, 1), 2) / bw
    with tempfile.TemporaryDirectory() as root:
        llm = LLM(str(ms.write_model_dir(args.shape, Path(root))), load_format="dummy", dtype="bfloat16",
                  max_batch_size=4, kv_cache_memory_gb=4.0, max_seq_len=512, use_cuda_graphs=False,
                  use_prefix_caching=False)
        ids = prompt_ids(llm.runner.vocab_size, 128, seed=1)
        decode_once(llm, ids, 8)  # warm-up: compiles, selections
        llm.engine.add_request(ids, greedy(args.steps + 8))
        for _ in range(4):  # the prefill and a few decode steps before the profile
            step(llm)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step(llm)
            torch.cuda.synchronize()
        while llm.engine.has_unfinished():
            step(llm)
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
    data = {"shape": args.shape, "steps": args.steps, "copy_bandwidth": bw, "bound_ms": 1e3 * bound_s,
            "device_ms_per_step": 1e3 * device_s,
            "kernels": [{"name": n, "ms_per_step": 1e3 * s, "calls_per_step": counts[n] / args.steps} for n, s in rows]}
    lines = [f"# {args.shape}: device time of a batch-1 decode step by kernel (eager, torch.profiler)", "",
             f"`python benchmarks/moe_kernel_profile.py`; {args.steps} steps; kernels' own time {1e3 * device_s:.2f} ms "
             f"a step against a memory bound of {1e3 * bound_s:.2f} ms ({bound_s / device_s:.2f} of it).", "",
             "| kernel | ms / step | calls / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{n[:90]}` | {1e3 * s:.3f} | {counts[n] / args.steps:.0f} | {s / device_s:.2f} |" for n, s in rows]
    write_report(args.out, data, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
