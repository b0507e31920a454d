"""Host CPUs for a data-parallel `infer serve` on CUDA: each engine core on CPUs of its own, the API servers on the
others.

A core on a GPU is host-bound at large batch: one Python thread schedules, launches and reads every step. Left to
the scheduler, two cores share CPUs with the API servers (and, in a benchmark, with clients) and move between them;
measured on 2 x H200 with `-dp 2`, 4 API servers and 16 client processes (docs/distributed.md, "Placement"): one
core ran every function 15-25% slower per call than the other, and the server gave 101-106k tok/s; with the cores
on CPUs of their own and everything else on the others, 110-112k. The core on cuda:k takes the available CPUs at
positions [CPUS_PER_RANK * k, CPUS_PER_RANK * (k + tp)) — by the physical GPU index where CUDA_VISIBLE_DEVICES
lists numbers, so servers started one per GPU on one host take different CPUs — and its tensor-parallel workers
run there too; the API servers and the launcher take every available CPU the cores do not. Available: the
launcher's affinity (`taskset` narrows it). Not pinned: one engine (its core on 2 CPUs measured no faster,
55.4-55.9k against 53.3-59.3k tok/s unpinned), the CPU (the engine's OpenMP threads use every core), and a core
whose slot would leave fewer than MIN_OTHER_CPUS to the rest.
"""

from __future__ import annotations

import os

CPUS_PER_RANK = 2  # a rank's stepping thread and its helpers (sockets, CUDA's), which wake briefly
MIN_OTHER_CPUS = 2  # left to the API servers and the launcher, at least


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; `taskset` narrows it), or [] where the OS cannot say."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def physical_gpu(index: int) -> int:
    """The physical index of logical CUDA device `index`: CUDA_VISIBLE_DEVICES' entry when it lists numbers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if index < len(visible) and visible[index].strip().isdigit():
        return int(visible[index])
    return index


def core_cpus(device: str, tensor_parallel_size: int, available: list[int]) -> frozenset[int] | None:
    """The CPUs of the core whose engine runs on `device` (resolved: cpu, cuda, cuda:k), or None: not on CUDA, or
    too few CPUs to leave MIN_OTHER_CPUS beside its slot."""
    if not device.startswith("cuda"):
        return None
    first = CPUS_PER_RANK * physical_gpu(int(device.split(":")[1]) if ":" in device else 0)
    last = first + CPUS_PER_RANK * tensor_parallel_size
    if last + MIN_OTHER_CPUS > len(available):
        return None
    return frozenset(available[first:last])


def other_cpus(engines: list[tuple[str, int]], available: list[int]) -> frozenset[int] | None:
    """The CPUs for everything but the cores of `engines` (each its resolved device and TP size): the available
    ones no core holds; None unless every core is pinned."""
    cores = [core_cpus(device, tp, available) for device, tp in engines]
    if not cores or any(c is None for c in cores):
        return None
    return frozenset(available) - frozenset().union(*cores)  # type: ignore[arg-type]


def pin(cpus: frozenset[int] | None) -> str | None:
    """Run this process (its threads and the processes it starts from now on) on `cpus` and return them as ranges
    ('0-3,8'); None: left as it was (no CPUs given, or the OS refused them)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # a container's cpuset may refuse some of them: run unpinned, as without a plan
        return None
    return ranges(cpus)


def ranges(cpus: frozenset[int]) -> str:
    """'0-3,8' for {0, 1, 2, 3, 8}."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
