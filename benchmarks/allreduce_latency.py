"""All-reduce time per call inside CUDA graphs, 8 KB to 1 MB (the decode step's sizes: batch x hidden x 2 bytes),
through layerzero's all_reduce (NCCL), beside the same calls run eagerly.

    python benchmarks/allreduce_latency.py --world 2 --report benchmarks/reports/allreduce_h100.md

One process per GPU; each size is captured as a graph of --calls all-reduces of one bf16 buffer, replayed --replays
times between CUDA events; the per-call time is the median replay over --calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import layerzero as lz

SIZES_KB = (8, 16, 32, 64, 128, 256, 512, 1024)


def _time(fn, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)  # microseconds
    return statistics.median(times)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, results: dict) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60), device_id=torch.device(f"cuda:{rank}"))
    group = dist.group.WORLD
    site = lz.bind("all_reduce")
    rows = []
    for kb in SIZES_KB:
        x = torch.ones(kb * 512, dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            site(x, group=group)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.calls):
                site(x, group=group)
        graph.replay()
        torch.cuda.synchronize()
        in_graph = _time(graph.replay, args.replays) / args.calls
        eager = _time(lambda: [site(x, group=group) for _ in range(args.calls)], args.replays) / args.calls
        rows.append((kb, in_graph, eager))
    if rank == 0:
        results["rows"] = rows
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--report", default=None)
    args = parser.parse_args()
    from infer.distributed.group import free_port

    results = mp.Manager().dict()
    mp.spawn(worker, args=(args.world, free_port(), args, results), nprocs=args.world)
    lines = [f"## All-reduce per call, {args.world} x {torch.cuda.get_device_name()} (NCCL through lz.all_reduce)", "",
             f"`python benchmarks/allreduce_latency.py --world {args.world}`; median of {args.replays} replays of "
             f"{args.calls} calls; NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}.", "",
             "| size | in a CUDA graph (us) | eager (us) |", "|---|---|---|"]
    lines += [f"| {kb} KB | {g:.1f} | {e:.1f} |" for kb, g, e in results["rows"]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        Path(args.report).write_text(text)


if __name__ == "__main__":
    main()
