"""Collectives over a tensor-parallel group, on torch.distributed (NCCL between GPUs, gloo on the CPU).

There is one kernel per collective and no fallback: every rank must run the same collective in the same order, and a
second choice made on one rank only would hang the others. Each call is also reported to an active CPU-graph
recording as a call of its own (`record_call`), run without the recorder's tensor-op tracing, so a recorded CPU
decode forward replays the collective in its place instead of refusing it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from layerzero.kernels.native.build import record_call


def _all_reduce(x: torch.Tensor, group: Any) -> None:
    dist.all_reduce(x, group=group)


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
    """x summed over the group's ranks, in place (returns x)."""
    with _disable_current_modes():
        record_call(_all_reduce, x, group)
        _all_reduce(x, group)
    return x


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
