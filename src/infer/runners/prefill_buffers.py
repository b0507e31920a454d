"""A prefill or mixed step's device inputs, uploaded in one copy: as they are (eager), or padded to a token bucket
at fixed addresses (what the bucket's captured graph reads).

Padded to a bucket of T_b tokens and B_b sequence slots: padding tokens have id 0, position 0 and KV slot -1
(the store skips them) and belong to no sequence; padding sequences have no tokens (their cu_seqlens repeat the
last bound), no context and a zero block table, so attention gives them no work. The bucket's arrays always
have the same shapes, so one upload lands them at the same offsets of one device buffer every step; the
step's sampling slots follow them (read outside the graph). docs/gpu.md ("Prefill graphs").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.models.forward_batch import ForwardBatch, KVCache, cu_seqlens
from infer.runners.step import StepInput, StepKind, block_table_array
from infer.transfer import StagedUpload, aligned


class PrefillShape(NamedTuple):
    """A bucket: token rows and sequence slots of a padded step."""

    tokens: int
    seqs: int


class PrefillInputs(NamedTuple):
    """A step's device inputs. `padded` is what the forward runs over (the step itself when eager); `batch` is the
    step's own sequences (sampling, probes and logprobs read it)."""

    token_ids: torch.Tensor  # [T_b] int64, as uploaded (a drafter writes its drafts here before the forward)
    prev_rows: torch.Tensor  # [T_b] int64 per token: the previous step's row whose sampled id it takes, or -1
    padded: ForwardBatch
    batch: ForwardBatch
    sampling_slots: torch.Tensor  # [N] int64
    advancing: torch.Tensor  # int64: the sampling slots of rows whose token counts
    lora_ids: torch.Tensor  # [T_b] int64 per token: its LoRA adapter slot, or -1


class PrefillBuffers:
    """Uploads prefill steps; holds the device buffer that padded steps land in (sized for `largest`)."""

    def __init__(self, device: torch.device, kv_caches: list[KVCache], max_blocks: int, max_context_len: int,
                 largest: PrefillShape | None) -> None:
        self.device, self.kv_caches = device, kv_caches
        self.max_blocks, self.max_context_len = max_blocks, max_context_len
        self._upload = StagedUpload(device)
        self._fixed: torch.Tensor | None = None
        if largest is not None:
            t, b = largest
            sizes = [8 * t] * 5 + [4 * (b + 1), 4 * b, 4 * b * max_blocks, 8 * b, 8 * b]
            self._fixed = torch.zeros(sum(aligned(n) for n in sizes), dtype=torch.uint8, device=device)

    def fill(self, step: StepInput, shape: PrefillShape | None, advancing: list[int],
             lora_ids: np.ndarray | None = None) -> PrefillInputs:
        """Upload `step` (padded to `shape` into the fixed buffer, or as it is) and its tokens' LoRA adapter slots
        (None: none): one host->device copy, no sync."""
        n, t = step.num_seqs, step.num_scheduled_tokens
        cu = cu_seqlens(step.query_lens)
        tokens, seqs = shape if shape is not None else (t, n)
        if t > tokens or n > seqs:
            raise ValueError(f"a step of {t} tokens in {n} sequences does not fit the bucket {shape}")
        ints = np.zeros((5, tokens), dtype=np.int64)  # ids, positions, KV slots, previous rows, LoRA adapter slots
        ints[0, :t], ints[1, :t], ints[2, :t] = step.token_ids, step.positions, step.slot_mapping
        ints[2, t:] = -1
        ints[3] = ints[4] = -1
        if lora_ids is not None:
            ints[4, :t] = lora_ids
        for i, row in enumerate(step.prev_rows or []):
            if row >= 0:
                ints[3, cu[i + 1] - 1] = row
        bounds = np.full(seqs + 1, t, dtype=np.int32)
        bounds[: n + 1] = cu
        context = np.zeros(seqs, dtype=np.int32)
        context[:n] = step.context_lens
        tables = block_table_array(step.block_tables)
        if shape is not None:
            if tables.shape[1] > self.max_blocks:
                raise ValueError(f"a sequence has {tables.shape[1]} blocks; the buffers hold {self.max_blocks}")
            padded_tables = np.zeros((seqs, self.max_blocks), dtype=np.int32)
            padded_tables[:n, : tables.shape[1]] = tables
            tables = padded_tables
        ids, positions, slots, prev, lora, cu_dev, ctx, tables_dev, sampling, advancing_dev = self._upload(
            ints[0], ints[1], ints[2], ints[3], ints[4], bounds, context, tables,
            np.array(step.sampling_slots, dtype=np.int64), np.array(advancing, dtype=np.int64),
            into=None if shape is None else self._fixed,
        )
        batch = ForwardBatch(
            is_prefill=True, positions=positions[:t], cu_seqlens_q=cu_dev[: n + 1], cu_seqlens_q_host=cu,
            max_seqlen_q=max(step.query_lens, default=0), context_lens=ctx[:n],
            context_lens_host=list(step.context_lens), max_context_len=int(max(step.context_lens, default=0)), block_tables=tables_dev[:n], slot_mapping=slots[:t],
            kv_caches=self.kv_caches,
        )
        padded = batch if shape is None else self._padded(positions, cu_dev, ctx, tables_dev, slots, tokens)
        return PrefillInputs(ids, prev, padded, batch, sampling, advancing_dev, lora)

    def padding(self, shape: PrefillShape) -> PrefillInputs:
        """Upload a step of padding alone for `shape`: the inputs a graph is captured over (at the addresses
        `fill` writes for that shape)."""
        return self.fill(StepInput(step_kind=StepKind.PREFILL), shape, [])

    def _padded(self, positions: torch.Tensor, cu: torch.Tensor, ctx: torch.Tensor, tables: torch.Tensor,
                slots: torch.Tensor, tokens: int) -> ForwardBatch:
        """The padded batch a graph runs: no host bounds (kernels read them on the device), capacities as limits."""
        return ForwardBatch(
            is_prefill=True, positions=positions, cu_seqlens_q=cu, cu_seqlens_q_host=[], max_seqlen_q=tokens,
            context_lens=ctx, max_context_len=self.max_context_len, block_tables=tables, slot_mapping=slots,
            kv_caches=self.kv_caches,
        )
