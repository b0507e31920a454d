"""All-reduce time per call inside CUDA graphs, 8 KB to 1 MB (the decode step's sizes: batch x hidden x 2 bytes),
through layerzero's all_reduce (the symmetric-memory one-shot path up to 512 KB, NCCL above; multicast stays off), beside
NCCL's all-reduce in a graph and eagerly; then a tensor-parallel layer's end on rows of 4096: the all-reduce followed
by the fused add + RMSNorm (two ops) against `lz.all_reduce_add_rms_norm` (one kernel up to 256 KB).

    python benchmarks/allreduce_latency.py --world 2 --report benchmarks/reports/allreduce_h100.md

One process per GPU; each size is captured as a graph of --calls all-reduces of one bf16 buffer, replayed --replays
times between CUDA events; the per-call time is the median replay over --calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
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


def _per_call(call: Callable[[], object], args: argparse.Namespace) -> tuple[float, float]:
    """(µs per call inside a CUDA graph of --calls calls, µs per call eagerly)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(args.calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    in_graph = _time(graph.replay, args.replays) / args.calls
    eager = _time(lambda: [call() for _ in range(args.calls)], args.replays) / args.calls
    return in_graph, eager


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60), device_id=torch.device(f"cuda:{rank}"))
    group = dist.group.WORLD
    site, add_norm, fused = lz.bind("all_reduce"), lz.bind("fused_add_rms_norm"), lz.bind("all_reduce_add_rms_norm")
    rows = []
    for kb in SIZES_KB:
        x = torch.ones(kb * 512, dtype=torch.bfloat16, device="cuda")
        ours = _per_call(lambda: site(x, group=group), args)
        nccl = _per_call(lambda: dist.all_reduce(x, group=group), args)
        part = x.view(-1, 4096)
        residual, weight = torch.randn_like(part), torch.ones(4096, dtype=part.dtype, device="cuda")
        two = _per_call(lambda: add_norm(site(part, group=group), residual, weight, eps=1e-6, weight_offset=0.0),
                        args)
        one = _per_call(lambda: fused(part, residual, weight, eps=1e-6, weight_offset=0.0, group=group), args)
        rows.append((kb, ours[0], *nccl, two[0], one[0]))
    if rank == 0:
        text = report(rows, world, args)
        print(text, flush=True)
        if args.report:
            Path(args.report).write_text(text)
    dist.barrier()
    os._exit(0)  # no NCCL teardown: destroying the group can hang on some hosts


def report(rows: list[tuple[int, float, float, float, float, float]], world: int, args: argparse.Namespace) -> str:
    lines = [f"## All-reduce per call, {world} x {torch.cuda.get_device_name()}", "",
             f"`python benchmarks/allreduce_latency.py --world {world}`; median of {args.replays} replays of "
             f"{args.calls} calls; NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}.", "",
             "| size | lz.all_reduce in a CUDA graph (us) | NCCL in a CUDA graph (us) | NCCL eager (us) "
             "| all-reduce + fused add & norm, graph (us) | lz.all_reduce_add_rms_norm, graph (us) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {kb} KB | {o:.1f} | {g:.1f} | {e:.1f} | {t:.1f} | {f:.1f} |" for kb, o, g, e, t, f in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--report", default=None)
    args = parser.parse_args()
    from infer.distributed.group import free_port

    mp.spawn(worker, args=(args.world, free_port(), args), nprocs=args.world)


if __name__ == "__main__":
    main()
