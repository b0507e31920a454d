"""Where this process stands in a tensor-parallel group, and the process groups themselves.

Ranks 0..N-1 of one model: rank 0 runs the engine (scheduler, sampling), the others replay its steps on their shards.
Tensors travel through torch.distributed (NCCL between GPUs, gloo on the CPU); the step messages through a gloo group
of their own whose waits may be long (a worker idles while nothing runs). The data group's collectives time out after
`distributed_timeout_s`, so a dead peer is an error, never a hang.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from infer.engine.config import EngineConfig, EngineConfigError
from infer.distributed.torchrun import under_torchrun
from infer.models.shard import Shard

CONTROL_TIMEOUT = timedelta(days=365)  # a worker waits for rank 0's next step as long as the server idles
JOINED = "infer/joined"  # the store's count of ranks other than 0 that have arrived


class DistributedError(RuntimeError):
    """A rank died or a collective failed: the engine cannot go on (every in-flight request fails, the process
    exits non-zero)."""


@dataclass(frozen=True)
class Placement:
    """One rank of a tensor-parallel group: its rank, the device it runs on and how it meets the others."""

    rank: int
    world_size: int
    local_rank: int
    local_world: int  # ranks on this host
    device: str
    init_method: str  # "env://" under torchrun, else tcp://master_addr:master_port
    timeout_s: float

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"


def resolve_torchrun(config: EngineConfig) -> EngineConfig:
    """The config a torchrun-started process runs: tensor_parallel_size is WORLD_SIZE (a different -tp fails naming
    both), the rendezvous torchrun's."""
    world = int(os.environ["WORLD_SIZE"])
    if config.tensor_parallel_size not in (1, world):
        raise EngineConfigError(f"tensor_parallel_size={config.tensor_parallel_size}: torchrun started "
                                f"WORLD_SIZE={world} processes; run one process per rank (or leave -tp out)")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = world // local_world if world % local_world == 0 else 1
    node = int(os.environ["RANK"]) // local_world if nodes > 1 else 0
    return replace(config, tensor_parallel_size=world, nnodes=nodes, node_rank=node,
                   master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def device_of(config: EngineConfig, local_rank: int) -> str:
    """Rank `local_rank` of this node runs on the configured device's index + local_rank (CUDA), or the CPU."""
    device = config.resolved_device
    if not device.startswith("cuda"):
        return "cpu"
    base = int(device.split(":")[1]) if ":" in device else 0
    index = base + local_rank
    if index >= torch.cuda.device_count():
        raise EngineConfigError(f"tensor_parallel_size={config.tensor_parallel_size}: rank {local_rank} of this node "
                                f"needs cuda:{index}, but {torch.cuda.device_count()} CUDA device(s) are visible")
    return f"cuda:{index}"


def placement(config: EngineConfig, rank: int, init_method: str) -> Placement:
    per_node = config.tensor_parallel_size // config.nnodes
    local = int(os.environ["LOCAL_RANK"]) if under_torchrun() else rank % per_node
    return Placement(rank, config.tensor_parallel_size, local, per_node, device_of(config, local), init_method,
                     config.distributed_timeout_s)


@dataclass
class Groups:
    """This process's groups: `shard` (rank, size, the data group the model's collectives use) and `control`, the
    gloo group step messages travel on."""

    shard: Shard
    control: Any
    place: Placement

    def agree_min(self, value: int) -> int:
        """The smallest `value` over the ranks (KV blocks: each rank's memory holds at least that many); on the data
        group, whose timeout turns a rank that never comes into an error."""
        t = torch.tensor([value], dtype=torch.int64, device=self.place.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.shard.group)
        return int(t.item())

    def close(self) -> None:
        """Leave the groups. gloo's are destroyed (another group can be joined in this process afterwards). NCCL's are
        left as they are: destroying or aborting a NCCL communicator waits on peers that may be gone or stopping
        themselves (seen to hang on H200s), so a process runs one NCCL tensor-parallel engine and ends with it."""
        if dist.is_initialized() and self.place.backend != "nccl":
            dist.destroy_process_group()


def join(place: Placement, failure: Callable[[], str | None] = lambda: None) -> Groups:
    """Meet the other ranks: blocks until all have joined; fails after the timeout, or at once when `failure` (the
    local workers' watch) reports one of them gone."""
    if dist.is_initialized():
        raise DistributedError("this process ran a NCCL tensor-parallel engine already (its groups cannot be left "
                               "without waiting on the other ranks); start another tensor-parallel engine in a new "
                               "process")
    if place.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(place.device))
    elif "OMP_NUM_THREADS" not in os.environ:  # the host's cores split between its ranks, not each rank taking all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // place.local_world))
    timeout = timedelta(seconds=place.timeout_s)
    kwargs: dict[str, Any] = {"device_id": torch.device(place.device)} if place.backend == "nccl" else {}
    if place.init_method == "env://":
        dist.init_process_group(place.backend, init_method="env://", rank=place.rank, world_size=place.world_size,
                                timeout=timeout, **kwargs)
    else:
        store = _meet(place, timeout, failure)
        dist.init_process_group(place.backend, store=store, rank=place.rank, world_size=place.world_size,
                                timeout=timeout, **kwargs)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Groups(Shard(place.rank, place.world_size, dist.group.WORLD), control, place)


def _meet(place: Placement, timeout: timedelta, failure: Callable[[], str | None]) -> dist.TCPStore:
    """Rank 0 hosts the store and waits for every other rank to check in, watching its own workers meanwhile."""
    host, port = place.init_method.removeprefix("tcp://").rsplit(":", 1)
    store = dist.TCPStore(host, int(port), place.world_size, is_master=place.rank == 0, timeout=timeout,
                          wait_for_workers=False)
    if place.rank != 0:
        store.add(JOINED, 1)
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while (joined := store.add(JOINED, 0)) < place.world_size - 1:
        gone = failure()
        if gone is not None:
            raise DistributedError(gone)
        if time.monotonic() > deadline:
            raise DistributedError(f"{joined + 1} of {place.world_size} tensor-parallel ranks joined within "
                                   f"{timeout.total_seconds():.0f} s (distributed_timeout_s)")
        time.sleep(0.05)
    return store
