"""The runner's side of speculative decoding: which packed rows a verify step reads logits at, and how the
emitted tokens travel back (one int64 block per step through the same readback as plain sampled ids)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.transfer import upload


class VerifyInputs(NamedTuple):
    """A step's drafts on the device. Row b's logits come from its last num_drafts[b] + 1 packed positions; the
    positions past them in the [B, K+1] layout repeat its last one (read, never used)."""

    logit_rows: torch.Tensor  # [B * (K + 1)] int64: packed positions whose hidden states become logits
    drafts: torch.Tensor  # [B, K] int64 (0 past a row's drafts)
    num_drafts: torch.Tensor  # [B] int64
    counting: torch.Tensor  # [B] int64: 1 where the row's tokens count (advance its sampling noise), else 0

    @property
    def width(self) -> int:
        return self.drafts.shape[1] + 1


def verify_inputs(drafts: list[tuple[int, ...]], cu_seqlens: list[int], samples: list[bool] | None,
                  device: torch.device) -> VerifyInputs:
    """Uploads (one copy) what `infer.sampling.speculative.verify` needs for a step's rows."""
    rows = len(drafts)
    counts = np.array([len(d) for d in drafts], dtype=np.int64)
    k = int(counts.max())
    ends = np.asarray(cu_seqlens[1:], dtype=np.int64) - 1
    logit_rows = ends[:, None] - counts[:, None] + np.minimum(np.arange(k + 1)[None, :], counts[:, None])
    padded = np.zeros((rows, k), dtype=np.int64)
    for i, d in enumerate(drafts):
        padded[i, : len(d)] = d
    counting = np.ones(rows, dtype=np.int64) if samples is None else np.asarray(samples, dtype=np.int64)
    flat = upload(np.concatenate([logit_rows.ravel(), padded.ravel(), counts, counting]).tolist(), torch.int64, device)
    a, b = rows * (k + 1), rows * (k + 1) + rows * k
    return VerifyInputs(flat[:a], flat[a:b].view(rows, k), flat[b : b + rows], flat[b + rows :])


def pack(tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B, K+1] tokens and [B] counts as one flat int64 block [B * (K + 2)] for the readback."""
    return torch.cat([tokens, counts[:, None]], dim=1).reshape(-1)


def unpack(flat: list[int], rows: int, width: int) -> tuple[list[int], list[list[int]]]:
    """(each row's first emitted token, the tokens it emitted after that) from a packed block."""
    first, extra = [], []
    for i in range(rows):
        record = flat[i * (width + 1) : (i + 1) * (width + 1)]
        emitted = record[: record[-1]]
        first.append(emitted[0])
        extra.append(emitted[1:])
    return first, extra
