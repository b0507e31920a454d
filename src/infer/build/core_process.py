"""Starting the engine-core process of `infer serve` and holding on to it. This module is light: the process that
starts the core (an API server, with one) imports none of the engine's code; the core builds it (core_main.py)."""

from __future__ import annotations

import importlib
import multiprocessing
import tempfile
import time
from typing import Any

from infer.build.core_env import core_environment
from infer.engine.config import EngineConfig
from infer.wire import CoreInfo


class CoreStartError(RuntimeError):
    """The core could not start; `config_error` when the cause is a bad setting (the CLI exits 2)."""

    def __init__(self, message: str, config_error: bool) -> None:
        super().__init__(message)
        self.config_error = config_error


class CoreProcess:
    """A started engine-core process and the facts it reported when ready."""

    def __init__(self, process: multiprocessing.process.BaseProcess, info: CoreInfo, config: EngineConfig,
                 host_cpus: list[int] | None = None) -> None:
        self.process = process
        self.info = info
        self.config = config  # as it was started with (a restart starts from it again)
        self.host_cpus = host_cpus  # the CPUs its place was chosen among, None: not pinned (a restart does the same)

    @classmethod
    def start(cls, config: EngineConfig, timeout_s: float | None = None, address: str | None = None,
              host_cpus: list[int] | None = None) -> CoreProcess:
        """Spawn the core, wait until it has loaded, warmed up and bound its socket; CoreStartError if it failed.
        `address`: the endpoint of a core it replaces (its API servers reconnect there), else a new one.
        `host_cpus`: the CPUs a data-parallel core takes its own among on CUDA (build/placement.py); None: the core
        runs wherever this process may."""
        address = address or f"ipc://{tempfile.mkdtemp(prefix='infer-')}/core.sock"  # a private (0700) folder
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: safe with CUDA and with threads
        ours, theirs = ctx.Pipe(duplex=False)
        # the target is named, not imported: this process (an API server, with one) never loads the engine's code
        process = ctx.Process(target=_run, args=("infer.build.core_main", "run_core", config, address, theirs,
                                                 time.time(), host_cpus), name="infer-core", daemon=False)
        with core_environment():
            process.start()
        theirs.close()
        if not ours.poll(timeout_s):
            process.kill()
            raise CoreStartError(f"the engine core did not start within {timeout_s:.0f} s", config_error=False)
        try:
            kind, payload = ours.recv()
        except EOFError:
            process.join(5)
            raise CoreStartError(f"the engine core exited while starting (exit code {process.exitcode})",
                                 config_error=False) from None
        if kind == "error":
            message, config_error = payload
            process.join(10)
            raise CoreStartError(message, config_error)
        return cls(process, payload, config, host_cpus)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the core to exit (SIGTERM), killing it if it does not within the timeout."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


def _run(module: str, function: str, *args: Any) -> None:
    """A spawned process's target, given by name so that pickling it does not import its module here."""
    getattr(importlib.import_module(module), function)(*args)
