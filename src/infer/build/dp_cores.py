"""Start the engine cores of `--data-parallel-size N`: one core process per engine, all loading at once, each on
CPUs of its own on CUDA (build/placement.py; `place_the_rest` pins the launcher to the others).

Engine i runs with its own copy of the config: `data_parallel_size=1` (nothing below the API server knows of DP),
`device` cuda:{base + i * tensor_parallel_size} on CUDA (base: the configured cuda:K, else 0; its TP ranks take
the devices after it), and `seed` + i, so requests without a seed draw different seeds on different engines
(two choices of one request routed to two engines must not sample alike). On the CPU, where the engines share
the host's cores, each core's OpenMP pool gets cpu_count // N threads unless OMP_NUM_THREADS is set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from infer.engine.config import EngineConfig, EngineConfigError
from infer.engine.devices import cuda_device_count
from infer.build.core_env import core_environment
from infer.build.core_process import CoreProcess, CoreStartError
from infer.build.placement import available_cpus, other_cpus, pin


def engine_configs(config: EngineConfig) -> list[EngineConfig]:
    """Each DP engine's config; EngineConfigError naming data_parallel_size when the devices are not there."""
    n, tp = config.data_parallel_size, config.tensor_parallel_size
    if n == 1:  # the core resolves its device itself
        return [config]
    device = config.resolved_device
    if not device.startswith("cuda"):
        return [replace(config, data_parallel_size=1, device=device, seed=config.seed + i) for i in range(n)]
    base = int(device.split(":")[1]) if ":" in device else 0
    visible = cuda_device_count()  # without torch where it can (engine/devices.py): the launcher stays torch-free
    if visible and base + n * tp > visible:
        raise EngineConfigError(
            f"data_parallel_size={n}: needs {n} x tensor_parallel_size={tp} CUDA devices from cuda:{base}, "
            f"but {visible} are visible")
    return [replace(config, data_parallel_size=1, device=f"cuda:{base + i * tp}", seed=config.seed + i)
            for i in range(n)]


@contextlib.contextmanager
def _thread_share(config: EngineConfig) -> Iterator[None]:
    """OMP_NUM_THREADS = cpu_count // N while CPU cores are spawned (they copy the environment); a set value wins."""
    n = config.data_parallel_size
    if n == 1 or config.resolved_device != "cpu" or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


def start_cores(config: EngineConfig, timeout_s: float | None = None) -> list[CoreProcess]:
    """Start every engine's core concurrently; if one fails the others are stopped and its CoreStartError raised."""
    configs = engine_configs(config)
    if len(configs) == 1:
        return [CoreProcess.start(configs[0], timeout_s)]
    host_cpus = available_cpus()  # each core on CPUs of its own, on CUDA (build/placement.py)
    # the environment is set once around all spawns: core_environment inside each start then changes nothing
    with core_environment(), _thread_share(config), ThreadPoolExecutor(len(configs)) as pool:
        futures = [pool.submit(CoreProcess.start, c, timeout_s, None, host_cpus) for c in configs]
        results: list[CoreProcess | BaseException] = []
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below once the started ones are stopped
                results.append(exc)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed:
        for r in results:
            if isinstance(r, CoreProcess):
                r.stop()
        i, exc = failed[0]
        if isinstance(exc, CoreStartError) and not exc.config_error:  # a bad setting reads the same on every engine
            raise CoreStartError(f"engine {i} of {len(configs)}: {exc}", exc.config_error) from None
        raise exc
    return [r for r in results if isinstance(r, CoreProcess)]


def place_the_rest(cores: list[CoreProcess]) -> str | None:
    """Pin this process (the launcher, and the API servers it starts after this) to the CPUs that data-parallel
    cores on CUDA left (build/placement.py); those CPUs as ranges, or None where the cores were not placed."""
    if not cores[0].host_cpus:  # the cores of one call share one list; None: not placed
        return None
    engines = [(c.info.config.device, c.info.config.tensor_parallel_size) for c in cores]
    return pin(other_cpus(engines, cores[0].host_cpus))
