"""The runner's side of speculative decoding: the inputs of a verify forward and how the emitted tokens travel
back (one int64 block per step through the same readback as plain sampled ids).

A step whose every sequence decodes (its last token plus its drafts) is verified on the decode rows: sequence b
takes rows b * (K + 1) .. b * (K + 1) + K, one query token each, with the context up to that token, so the
forward is the decode forward (fixed buffers, a CUDA graph per bucket) and its logits are [B, K + 1] as they
come. A step that also carries prompt chunks is verified on the packed varlen forward instead (`logit_rows`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.runners.decode_buffers import DecodeRows
from infer.runners.step import StepInput
from infer.transfer import upload


class VerifyInputs(NamedTuple):
    """A step's drafts on the device."""

    drafts: torch.Tensor  # [B, K] int64 (0 past a row's drafts)
    num_drafts: torch.Tensor  # [B] int64
    counting: torch.Tensor  # [B] int64: 1 where the row's tokens count (advance its sampling noise), else 0
    # varlen steps: the packed positions whose hidden states become the [B, K+1] logits (row b's last
    # num_drafts[b] + 1 positions, then its last one repeated: read, never used); None on decode rows
    logit_rows: torch.Tensor | None

    @property
    def width(self) -> int:
        return self.drafts.shape[1] + 1


def verify_inputs(step: StepInput, device: torch.device, cu_seqlens: list[int] | None = None) -> VerifyInputs:
    """Uploads (one copy) what `infer.sampling.speculative.verify` needs for the step's rows; with `cu_seqlens`
    (a varlen step) the logit rows too."""
    assert step.drafts is not None
    rows = step.num_seqs
    counts = np.array([len(d) for d in step.drafts], dtype=np.int64)
    k = int(counts.max())
    padded = np.zeros((rows, k), dtype=np.int64)
    for i, d in enumerate(step.drafts):
        padded[i, : len(d)] = d
    counting = np.ones(rows, dtype=np.int64) if step.samples is None else np.asarray(step.samples, dtype=np.int64)
    parts = [padded.ravel(), counts, counting]
    if cu_seqlens is not None:
        ends = np.asarray(cu_seqlens[1:], dtype=np.int64) - 1
        parts.append((ends[:, None] - counts[:, None] + np.minimum(np.arange(k + 1)[None, :], counts[:, None])).ravel())
    flat = upload(np.concatenate(parts).tolist(), torch.int64, device)
    a = rows * k
    logit_rows = flat[a + 2 * rows :] if cu_seqlens is not None else None
    return VerifyInputs(flat[:a].view(rows, k), flat[a : a + rows], flat[a + rows : a + 2 * rows], logit_rows)


def decode_rows(step: StepInput) -> DecodeRows:
    """A decode step with drafts as K + 1 decode rows per sequence (padding rows past a sequence's drafts)."""
    assert step.drafts is not None
    width = 1 + max(len(d) for d in step.drafts)
    n = step.num_seqs * width
    ids, positions, slots, prev = [0] * n, [0] * n, [-1] * n, [-1] * n
    sampling, context, tables = [0] * n, [0] * n, [[] for _ in range(n)]
    prev_rows = step.prev_rows or [-1] * step.num_seqs
    start = 0
    for b, q in enumerate(step.query_lens):
        row = b * width
        ids[row : row + q] = step.token_ids[start : start + q]
        positions[row : row + q] = step.positions[start : start + q]
        slots[row : row + q] = step.slot_mapping[start : start + q]
        first = step.context_lens[b] - q + 1
        context[row : row + q] = range(first, first + q)
        sampling[row : row + q] = [step.sampling_slots[b]] * q
        tables[row : row + q] = [step.block_tables[b]] * q
        prev[row] = prev_rows[b]
        start += q
    if isinstance(step.block_tables, np.ndarray):  # an array of tables (a tensor-parallel worker's): one per row too
        return DecodeRows(ids, positions, slots, prev, sampling, context, np.repeat(step.block_tables, width, axis=0))
    return DecodeRows(ids, positions, slots, prev, sampling, context, tables)


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
