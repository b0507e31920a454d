"""Starting a tensor-parallel group: rank 0 (in the engine's process) with the workers of its node, or a headless
node's workers, by our flags (--nnodes, --node-rank, --master-addr, --master-port) or by torchrun's variables."""

from __future__ import annotations

import os
from dataclasses import replace

from infer.distributed.group import Groups, device_of, free_port, join, placement, resolve_torchrun
from infer.distributed.torchrun import under_torchrun
from infer.distributed.workers import WorkerSet, run_worker
from infer.engine.config import EngineConfig


def rendezvous(config: EngineConfig) -> str:
    """torchrun's store (env://), node 0's address for several nodes, else a free local port."""
    if under_torchrun():
        return "env://"
    if config.nnodes > 1:
        return f"tcp://{config.master_addr}:{config.master_port}"
    return f"tcp://127.0.0.1:{free_port()}"


def node_ranks(config: EngineConfig) -> list[int]:
    per_node = config.tensor_parallel_size // config.nnodes
    return list(range(config.node_rank * per_node, (config.node_rank + 1) * per_node))


def start_rank0(config: EngineConfig, hard_exit: bool = False) -> tuple[Groups, WorkerSet | None, EngineConfig]:
    """Start this node's other ranks (torchrun started them already), join as rank 0; the config on rank 0's device."""
    init = rendezvous(config)
    place = placement(config, 0, init)
    others = [] if under_torchrun() else node_ranks(config)[1:]
    device_of(config, len(others))  # this node's last device must exist: fails before any worker starts
    workers = WorkerSet(config, others, init, hard_exit) if others else None
    try:
        groups = join(place, (lambda: workers.failure) if workers is not None else (lambda: None))
    except BaseException:
        if workers is not None:
            workers.join(0)
        raise
    return groups, workers, replace(config, device=place.device)


def distributed_config(config: EngineConfig) -> EngineConfig:
    """The config as this process runs it: under torchrun, its world and rendezvous."""
    return resolve_torchrun(config) if under_torchrun() else config


def headless(config: EngineConfig) -> bool:
    """Whether this process runs workers only (a node other than 0, or a torchrun rank other than 0)."""
    return int(os.environ["RANK"]) != 0 if under_torchrun() else config.node_rank > 0


def run_headless(config: EngineConfig) -> int:
    """A node that does not serve: its ranks replay rank 0's steps until rank 0 stops; the exit code."""
    if under_torchrun():
        run_worker(config, int(os.environ["RANK"]), "env://")
        return 0
    return WorkerSet(config, node_ranks(config), rendezvous(config)).wait()
