"""Measurement protocol: warm up, then time each call; device events on CUDA, perf_counter on CPU."""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable
from functools import cache

import torch

# x86 and Arm features that change which CPU code paths (and so timings) a kernel gets
_CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve")


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str,
    warmup: int = 3,
    iters: int = 10,
    flush_l2: bool = False,
) -> list[float]:
    """Per-call latencies of fn() in microseconds, after `warmup` untimed calls.

    On CUDA each call sits between two events on the current stream and the events are read after
    one final synchronize, so a launch-bound call's host launch time is part of its sample (as in an
    eager call); flush_l2 overwrites a buffer twice the L2 size before each call (cold cache).
    On CPU each call is timed with perf_counter_ns.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    device = torch.device(device)
    if device.type == "cuda":
        return _measure_cuda(fn, device, warmup, iters, flush_l2)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def _measure_cuda(fn: Callable[[], object], device: torch.device, warmup: int, iters: int, flush_l2: bool) -> list[float]:
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        scratch = None
        if flush_l2:
            l2 = torch.cuda.get_device_properties(device).L2_cache_size
            scratch = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        pairs = []
        for _ in range(iters):
            if scratch is not None:
                scratch.fill_(1)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]


def device_signature(device: torch.device | str) -> str:
    """Identifies the hardware and software a timing was taken on; part of every PerfDB key."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_signature(index)
    return _cpu_signature(torch.get_num_threads())


@cache
def _cuda_signature(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    driver = _nvidia_driver_version()
    return (
        f"cuda|{props.name}|sm{props.major}{props.minor}|sms{props.multi_processor_count}"
        f"|driver{driver}|cuda{torch.version.cuda}|torch{torch.__version__}"
    )


def _nvidia_driver_version() -> str:
    """The kernel driver's version from /proc (Linux); "unknown" elsewhere."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
    except OSError:
        return "unknown"
    return found.group(1) if found else "unknown"


@cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """(CPU model, ISA feature flags) from /proc/cpuinfo; the platform's processor name and no flags elsewhere."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model", "Hardware") and value.strip() and not model:
                    model = value.strip()
                elif name in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), frozenset(flags)


@cache
def _cpu_signature(threads: int) -> str:
    model, flags = cpu_info()
    present = ",".join(f for f in _CPU_FLAGS if f in flags)
    return f"cpu|{model}|{platform.machine()}|{present}|threads{threads}|torch{torch.__version__}"
