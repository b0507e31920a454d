"""The device's copy bandwidth (the roofline's denominator for the decode and skinny-GEMM benchmarks), the time
of kernels replayed in a CUDA graph (the host's launch cost left out), and the host's Python speed (lent machines
differ by up to ~2x in it, which moves every host-bound number)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import torch


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), the roofline's bandwidth in every GPU benchmark: 10
    back-to-back copies timed with CUDA events (no host sync between them), the median of 5 such runs after two
    warm-up copies."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(2):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = []
    for _ in range(5):
        start.record()
        for _ in range(10):
            y.copy_(x)
        end.record()
        end.synchronize()
        rates.append(2 * x.numel() * 10 / (start.elapsed_time(end) * 1e-3))
    return statistics.median(rates)


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


def host_loop_ms() -> float:
    """Milliseconds of 2M dict stores in a Python loop, the median of 3: the host's interpreter speed, reported
    beside host-bound numbers (87-92 ms with Python 3.12 on the 2-core development machine; compare runs of one
    Python version only)."""
    times = []
    for _ in range(3):
        started, d = time.perf_counter(), {}
        for i in range(2_000_000):
            d[i & 1023] = i
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)
