"""The device's copy bandwidth (the roofline's denominator for the decode and skinny-GEMM benchmarks) and the time
of kernels replayed in a CUDA graph (the host's launch cost left out)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import torch


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), median of 10, host-timed."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        start = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * x.numel() / statistics.median(times[2:])


def graph_us(fns: list[Callable[[], object]], calls: int = 20, replays: int = 10) -> float:
    """Median µs per call of a CUDA graph of max(calls, len(fns)) calls cycling over `fns` (each called once
    before the capture: compiles, autotuning), over `replays` replays after a first untimed one."""
    calls = max(calls, len(fns))
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in itertools.islice(itertools.cycle(fns), calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)
