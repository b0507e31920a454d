"""The device's copy bandwidth, the roofline's denominator for the decode and skinny-GEMM benchmarks."""

from __future__ import annotations

import statistics
import time

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
