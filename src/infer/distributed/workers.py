"""Tensor-parallel worker processes: the ones a rank-0 engine (or a headless node) starts, and a worker's main.

A worker joins the group, loads its shard, builds the same runner as rank 0 (the same KV block count, agreed as the
minimum over ranks, and the same graphs, captured in the same order) and replays every step rank 0 sends until the
empty message comes or rank 0's connection closes (then it exits non-zero: a worker never outlives its engine).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from dataclasses import replace

import torch

from infer.engine.config import EngineConfig

log = logging.getLogger("infer.distributed")

HARD_EXIT_GRACE_S = 5.0  # a core whose worker died and that did not stop by itself within this is ended


class WorkerSet:
    """Worker processes started here, watched: `failure` says which exited, once one has (while not closing)."""

    def __init__(self, config: EngineConfig, ranks: list[int], init_method: str, hard_exit: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: safe with CUDA and with threads
        self.processes = {rank: ctx.Process(target=run_worker, args=(config, rank, init_method),
                                            name=f"infer-tp-{rank}", daemon=True) for rank in ranks}
        for process in self.processes.values():
            process.start()
        self.failure: str | None = None
        self._closing = False
        self._hard_exit = hard_exit
        threading.Thread(target=self._watch, name="infer-tp-watch", daemon=True).start()

    def _watch(self) -> None:
        by_sentinel = {p.sentinel: (rank, p) for rank, p in self.processes.items()}
        ready = multiprocessing.connection.wait(list(by_sentinel))
        if self._closing:
            return
        rank, process = by_sentinel[ready[0]]
        process.join(1)
        if process.exitcode == 0:  # a worker exits 0 only after rank 0's stop message
            return
        self.failure = (f"tensor-parallel worker rank {rank} (pid {process.pid}) exited with code {process.exitcode}; "
                        "the engine cannot run without it")
        log.error(self.failure)
        if self._hard_exit:  # the engine loop notices within a second; if it is stuck in a collective, end it here
            time.sleep(HARD_EXIT_GRACE_S)
            log.error("the engine did not stop after its worker died; exiting")
            os._exit(1)

    def failure_within(self, timeout_s: float) -> str | None:
        """`failure`, waiting up to `timeout_s` for the watch to see a worker that is exiting."""
        deadline = time.monotonic() + timeout_s
        while self.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.failure

    def wait(self) -> int:
        """A headless node: wait for the workers however long they serve; the largest exit code."""
        for process in self.processes.values():
            process.join()
        self._closing = True
        return max((p.exitcode or 0 for p in self.processes.values()), default=0)

    def join(self, timeout_s: float = 10.0) -> int:
        """Wait for the workers to exit (killing those that do not); the largest exit code."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        return max((p.exitcode or 0 for p in self.processes.values()), default=0)


def run_worker(config: EngineConfig, rank: int, init_method: str) -> None:
    """A worker's main: join, load this rank's shard, build its runner, replay rank 0's steps until told to stop."""
    from infer.distributed.channel import Channel
    from infer.distributed.group import join, placement
    from infer.distributed.step_message import STOP, StepDecoder
    from infer.distributed.tp_runner import table_mirror
    from infer.build.rank_runner import build_rank_runner, load_rank_model

    logging.basicConfig(level=logging.INFO, format=f"[infer tp rank {rank}] %(message)s")
    place = placement(config, rank, init_method)
    groups = join(place)
    config = replace(config, device=place.device)
    runner = build_rank_runner(config, load_rank_model(config, groups.shard), groups, probes=None)
    channel, decoder = Channel(groups.control), StepDecoder(table_mirror(runner))
    try:
        while (data := channel.recv()) != STOP:
            runner.replay(decoder.decode(data))
    except RuntimeError as exc:  # rank 0 is gone (its connection closed) or a collective failed
        log.error("stopping: %s", exc)
        raise SystemExit(1) from None
    if place.device.startswith("cuda"):
        torch.cuda.synchronize()
    os._exit(0)  # no teardown: leaving a NCCL group waits on the other ranks (Groups.close)

