"""Collectives over a tensor-parallel group, on torch.distributed (NCCL between GPUs, gloo on the CPU).

There is one kernel per collective and no fallback: every rank must run the same collective in the same order, and a
second choice made on one rank only would hang the others. Each call is also reported to an active CPU-graph
recording as a call of its own (`record_call`), run without the recorder's tensor-op tracing, so a recorded CPU
decode forward replays the collective in its place instead of refusing it.

All-reduce between GPUs takes one of two paths by a rule every rank computes alike from the call's shape: up to
ONE_SHOT_MAX_BYTES (a decode step's sizes) torch's symmetric-memory one-shot all-reduce (each rank copies its x into
a buffer every rank maps, then reads all of them over NVLink and sums; no multicast), above it NCCL. On 4 H200s
inside CUDA graphs the one-shot path took 8-14 µs a call from 8 to 512 KB, NCCL 16-22 µs
(benchmarks/reports/distributed_h200.md). The buffer is made on the first eligible call outside a capture, a
collective step every rank reaches at the same call; where symmetric memory is unavailable every call takes NCCL.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from layerzero.kernels.native.build import record_call
from layerzero.kernels.reference.norm import fused_add_rms_norm


ONE_SHOT_MAX_BYTES = 512 * 1024
_ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)  # what torch's symmetric-memory reductions are built for
_symmetric: dict[tuple[str, torch.dtype], torch.Tensor | None] = {}  # (group, dtype) -> buffer, None: unavailable
T = TypeVar("T")


def made_outside_capture(cache: dict[Any, T | None], key: Hashable, make: Callable[..., T | None],
                         *args: Any) -> T | None:
    """cache[key], made by `make(*args)` (a collective step; None where unavailable) on the first call outside a CUDA
    graph capture; None inside a capture before that. Every rank makes its calls, and captures them, in the same
    order, so all reach the collective at the same call, or all take the path without it."""
    if key not in cache:
        if torch.cuda.is_current_stream_capturing():
            return None
        cache[key] = make(*args)
    return cache[key]


def _all_reduce(x: torch.Tensor, group: Any) -> None:
    dist.all_reduce(x, group=group)


def one_shot_eligible(x: torch.Tensor) -> bool:
    """Whether an all-reduce of x takes the one-shot path: a GPU tensor of a supported dtype, at most
    ONE_SHOT_MAX_BYTES, whole 16-byte vectors. A rule of x's shape alone, so every rank decides alike."""
    return x.is_cuda and x.dtype in _ONE_SHOT_DTYPES and x.nbytes <= ONE_SHOT_MAX_BYTES and x.nbytes % 16 == 0


def _one_shot_buffer(x: torch.Tensor, group: Any) -> torch.Tensor | None:
    """The group's symmetric buffer when x takes the one-shot path, else None (NCCL)."""
    if not one_shot_eligible(x):
        return None
    return made_outside_capture(_symmetric, (group.group_name, x.dtype), _rendezvous, group.group_name, x.dtype,
                                x.device)


def _rendezvous(group_name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """A symmetric-memory buffer of ONE_SHOT_MAX_BYTES mapped by every rank of the group (a collective step)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(ONE_SHOT_MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(buffer, group_name)
        return buffer
    except (RuntimeError, NotImplementedError, ImportError, AttributeError):
        return None


def _broadcast(x: torch.Tensor, group: Any, src: int) -> None:
    dist.broadcast(x, src=dist.get_global_rank(group, src), group=group)


def _gather_into(out: torch.Tensor, x: torch.Tensor, group: Any) -> None:
    """out [..., size * d] = the ranks' x [..., d] side by side, in rank order."""
    size = dist.get_world_size(group)
    if x.is_cuda:  # one NCCL call into [size, rows, d], then moved side by side
        stacked = torch.empty((size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(stacked, x.contiguous(), group=group)
        out.copy_(stacked.movedim(0, -2).reshape(out.shape))
    else:  # gloo gathers into a list
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        torch.cat(parts, dim=-1, out=out)


def all_reduce(x: torch.Tensor, *, group: Any) -> torch.Tensor:
    """x summed over the group's ranks: in place (returns x) through NCCL or gloo, a new tensor through the one-shot
    path (module docstring); callers use the returned tensor."""
    buffer = _one_shot_buffer(x, group)
    if buffer is not None:
        flat = torch.ops.symm_mem.one_shot_all_reduce_copy(buffer[: x.numel()], x.reshape(-1), "sum", group.group_name)
        return flat.view(x.shape)
    with _disable_current_modes():
        record_call(_all_reduce, x, group)
        _all_reduce(x, group)
    return x


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            proj: torch.Tensor | None = None, *, eps: float, weight_offset: float,
                            group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum_ranks(x) + residual), sum_ranks(x) + residual): the all-reduce, then the add and the norm; with
    `proj` (this rank's shard of the projection before the sum), x is its input: F.linear(x, proj) is summed."""
    if proj is not None:
        x = F.linear(x, proj)
    return fused_add_rms_norm(all_reduce(x, group=group), residual, weight, eps, weight_offset)


def all_gather(x: torch.Tensor, *, group: Any) -> torch.Tensor:
    """The ranks' x [..., d] concatenated along the last dimension in rank order: [..., size * d]."""
    out = torch.empty((*x.shape[:-1], dist.get_world_size(group) * x.shape[-1]), dtype=x.dtype, device=x.device)
    with _disable_current_modes():
        record_call(_gather_into, out, x, group)
        _gather_into(out, x, group)
    return out


def broadcast(x: torch.Tensor, *, group: Any, src: int = 0) -> torch.Tensor:
    """x of the group's rank `src` on every rank, in place (returns x)."""
    with _disable_current_modes():
        record_call(_broadcast, x, group, src)
        _broadcast(x, group, src)
    return x
