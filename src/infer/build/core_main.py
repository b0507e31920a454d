"""The engine-core process's main (started by core_process.py): build and warm the engine, report to the parent,
then run the core loop until stopped."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import replace
from multiprocessing.connection import Connection

from infer.build.placement import core_cpus, pin
from infer.build.startup_log import phase
from infer.engine.config import EngineConfig, EngineConfigError
from infer.loader.model_path import resolve_model_path
from infer.loader.tokenizer_prefetch import TokenizerPrefetch
from infer.wire import CoreInfo

log = logging.getLogger("infer.core")


def run_core(config: EngineConfig, address: str, ready: Connection, spawned: float,
             host_cpus: list[int] | None) -> None:
    """The core process's main: build and warm the engine, report to the parent, then serve until stopped.
    `spawned`: when the parent started this process (time.time()), for the start-up report; `host_cpus`: the CPUs
    a data-parallel core takes its own among, on CUDA (build/placement.py), or None."""
    logging.basicConfig(level=logging.INFO, format="[infer core] %(message)s")
    phase("core process up", time.time() - spawned, "interpreter")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us in order
    prefetch = _prefetch_tokenizer(config)  # first: its child reads while this process imports the engine
    started = time.perf_counter()
    from infer.build.builder import build_engine  # torch and the engine's modules
    from infer.distributed.group import DistributedError
    from infer.engine.core_loop import CoreLoop

    phase("engine code imported", time.perf_counter() - started, "torch and the engine's modules")
    # before any thread or TP worker starts, so all of them run there
    if host_cpus and (cpus := pin(core_cpus(config.resolved_device, config.tensor_parallel_size, host_cpus))):
        log.info("on CPUs %s of its own (docs/distributed.md, Placement)", cpus)
    try:
        built = build_engine(config, core_only=True, hard_exit=True, tokenizer_prefetch=prefetch)
    except (EngineConfigError, ValueError, OSError, DistributedError) as exc:
        _cancel(prefetch)
        ready.send(("error", (str(exc), isinstance(exc, (EngineConfigError, ValueError)))))
        raise SystemExit(2) from None
    except BaseException as exc:
        _cancel(prefetch)
        ready.send(("error", (f"{type(exc).__name__}: {exc}", False)))
        raise
    started = time.perf_counter()
    if (reason := built.engine.grammars.prepare()) is not None:  # before the core reports ready (see prepare)
        log.warning("serving without structured output and tools: %s", reason)
    phase("structured output prepared", time.perf_counter() - started, "llguidance's view of the tokenizer")
    loop = CoreLoop(built.engine, address, built.read_probe_set)
    config = replace(built.config, device=built.config.resolved_device)  # the API server imports no torch to ask
    ready.send(("ready", CoreInfo(address, config, built.model_config, str(built.path), built.tokenizer,
                                  built.engine.runner.vocab_size, built.engine.probe_catalog, built.load_seconds,
                                  built.warmup_seconds, os.getpid())))
    ready.close()
    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    loop.run()
    if built.config.tensor_parallel_size > 1:  # NCCL's teardown at exit can wait on ranks that are gone: skip it
        logging.shutdown()
        os._exit(0)


def _prefetch_tokenizer(config: EngineConfig) -> TokenizerPrefetch | None:
    """The model's tokenizer, read by a child process from now on (loader/tokenizer_prefetch.py); None for the MLX
    runner (its builder reads its own) or a model path that does not resolve (build_engine then says why)."""
    if config.resolved_runner != "torch":
        return None
    try:
        return TokenizerPrefetch(resolve_model_path(config.model))
    except Exception:  # noqa: BLE001  (reported by build_engine, which resolves it again)
        return None


def _cancel(prefetch: TokenizerPrefetch | None) -> None:
    if prefetch is not None:
        prefetch.cancel()
