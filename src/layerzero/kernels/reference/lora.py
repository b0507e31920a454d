"""LoRA adapters batched over rows whose adapters differ, as plain compositions of torch ops.

Every adapter sits in a slot of two stacked tensors: `a` [S, R, K] (its down-projections, rank padded to R with zero
rows) and `b` [S, N, R] (its up-projections, its scaling folded in). A row's slot id picks its adapter; -1 is none.
`lora_shrink` gives h = x @ a[slot].T per row (float32 [T, R], zero for rows without an adapter) and `lora_expand`
adds h @ b[slot].T into the base projection's output y in place.

The reference gathers each row's adapter (one batched matmul, no host sync); `lora_shrink_grouped` and
`lora_expand_grouped` are the CPU path: one matmul per adapter present in the batch over the rows that use it, so
their weights are read once however many rows share them.
"""

from __future__ import annotations

import torch


def _rows_of(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's slot clamped to a valid one, whether the row has an adapter [T, 1])."""
    return ids.long().clamp(min=0), (ids >= 0)[:, None]


def lora_shrink(x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    slots, has = _rows_of(ids)
    h = torch.bmm(a[slots].float(), x.float()[:, :, None])[:, :, 0]  # [T, R]
    return h * has


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    slots, has = _rows_of(ids)
    delta = torch.bmm(b[slots].float(), h.float()[:, :, None])[:, :, 0]  # [T, N]
    y += (delta * has).to(y.dtype)
    return y


def _groups(ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(slot, its rows) for each slot present (reads the ids on the host)."""
    present = torch.unique(ids[ids >= 0]).tolist()
    return [(int(s), (ids == s).nonzero()[:, 0]) for s in present]


def lora_shrink_grouped(x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    h = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for slot, rows in _groups(ids):
        h[rows] = (x[rows] @ a[slot].T).float()
    return h


def lora_expand_grouped(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    for slot, rows in _groups(ids):
        y.index_add_(0, rows, (h[rows] @ b[slot].float().T).to(y.dtype))
    return y
