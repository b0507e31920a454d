"""The draft model of speculative decoding: proposes each speculating row's k tokens on the device, inside the step.

Its paged KV cache has the target's block layout and is addressed by the target's block tables, so the scheduler's
blocks serve both and a rollback frees both. The drafter holds KV for a request's first `num_drafter_tokens`
positions (the scheduler keeps that count): a step first catches it up to the row's input token in one varlen
pass (the whole prompt on the first drafting step, else the one or two tokens since), whose last logits give
draft 1, then runs k - 1 decode passes, each feeding the draft before. Rows that draft fewer than K tokens sit
out the later passes as padding (no KV written). No host sync: the drafts stay on the device for the verify.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.models.base import CausalLM
from infer.models.forward_batch import ForwardBatch, KVCache, cu_seqlens
from infer.runners.step import StepInput
from infer.sampling.slots import SamplingSlots
from infer.sampling.speculative import draft_sample
from infer.transfer import StagedUpload


class Drafts(NamedTuple):
    tokens: torch.Tensor  # [B, K] int64 over all the step's rows (zeros where a row drafts fewer)
    probs: torch.Tensor | None  # [B, K, V] the drafter's distributions (None when every drafting row is greedy)


class Drafter:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.device = model.embed.device
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype = model.embed.dtype
        self.kv_caches: list[KVCache] = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self._upload = StagedUpload(self.device)

    def propose(self, step: StepInput, sampling: SamplingSlots) -> Drafts:
        """The drafts of every row with drafts in `step` (step.drafter_tokens: what each must catch up on)."""
        assert step.drafts is not None and step.drafter_tokens is not None
        rows = [b for b, d in enumerate(step.drafts) if d]
        num = np.array([len(step.drafts[b]) for b in rows], dtype=np.int64)
        width = int(num.max())
        cu_step = cu_seqlens(step.query_lens)
        starts = np.array([step.positions[cu_step[b]] for b in rows], dtype=np.int64)  # each input token's position
        tables = np.zeros((len(rows), max(len(step.block_tables[b]) for b in rows)), dtype=np.int32)
        for i, b in enumerate(rows):
            tables[i, : len(step.block_tables[b])] = step.block_tables[b]
        catch_up = [step.drafter_tokens[b] for b in rows]
        lengths = [len(t) for t in catch_up]
        cu = cu_seqlens(lengths)
        positions = np.concatenate([np.arange(s - n + 1, s + 1) for s, n in zip(starts, lengths)])
        row_of = np.repeat(np.arange(len(rows)), lengths)
        slots = tables[row_of, positions // self.block_size].astype(np.int64) * self.block_size + positions % self.block_size
        # decode pass j (1 .. K-1) feeds draft j at position start + j; rows with fewer drafts are padding
        later = np.arange(1, width)[:, None]
        live = later < num[None, :]
        dec_positions = np.where(live, starts[None, :] + later, 0)
        dec_slots = np.full((width - 1, len(rows)), -1, dtype=np.int64)
        for i, b in enumerate(rows):
            k, base = len(step.drafts[b]), cu_step[b]
            dec_slots[: k - 1, i] = step.slot_mapping[base + 1 : base + k]
        dec_context = np.where(live, dec_positions + 1, 0).astype(np.int32)
        (ids, pos, slot, cu_dev, context, tables_dev, dec_pos, dec_slot, dec_ctx, row_index, draft_slots) = self._upload(
            np.concatenate([np.asarray(t, dtype=np.int64) for t in catch_up]), positions, slots,
            np.array(cu, dtype=np.int32), (starts + 1).astype(np.int32), tables,
            dec_positions.astype(np.int64), dec_slots, dec_context, np.array(rows, dtype=np.int64),
            np.array([step.sampling_slots[b] for b in rows], dtype=np.int64),
        )
        t = sampling.gather(draft_slots, [step.sampling_slots[b] for b in rows])
        batch = ForwardBatch(
            is_prefill=True, positions=pos, cu_seqlens_q=cu_dev, cu_seqlens_q_host=cu, max_seqlen_q=max(lengths),
            context_lens=context, context_lens_host=(starts + 1).tolist(), max_context_len=int(starts.max()) + 1,
            block_tables=tables_dev, slot_mapping=slot, kv_caches=self.kv_caches,
        )
        hidden = self.model(ids, batch)
        token, q = draft_sample(self.model.compute_logits(hidden[batch.last_token_indices]), t, 0)
        tokens, probs = [token], [q]
        arange = torch.arange(len(rows) + 1, dtype=torch.int32, device=self.device)
        for j in range(1, width):
            batch = ForwardBatch(
                is_prefill=False, positions=dec_pos[j - 1], cu_seqlens_q=arange, cu_seqlens_q_host=list(range(len(rows) + 1)),
                max_seqlen_q=1, context_lens=dec_ctx[j - 1], max_context_len=int(dec_context[j - 1].max()),
                block_tables=tables_dev, slot_mapping=dec_slot[j - 1], kv_caches=self.kv_caches,
            )
            token, q = draft_sample(self.model.compute_logits(self.model(token, batch)), t, j)
            tokens.append(token)
            probs.append(q)
        full = torch.zeros(step.num_seqs, width, dtype=torch.int64, device=self.device)
        full.index_copy_(0, row_index, torch.stack(tokens, dim=1))
        if probs[0] is None:
            return Drafts(full, None)
        vocab = probs[0].shape[-1]
        dist = torch.zeros(step.num_seqs, width, vocab, dtype=probs[0].dtype, device=self.device)
        dist.index_copy_(0, row_index, torch.stack(probs, dim=1))  # type: ignore[arg-type]
        return Drafts(full, dist)
