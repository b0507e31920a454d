"""The draft model of speculative decoding: proposes each speculating row's k tokens on the device, inside the step.

Its paged KV cache has the target's block layout and is addressed by the target's block tables, so the scheduler's
blocks serve both and a rollback frees both. The drafter holds KV for a request's first `num_drafter_tokens`
positions (the scheduler keeps that count): a step first catches it up to the row's input token in one varlen
pass (the whole prompt on the first drafting step), whose last logits give draft 1, then runs k - 1 decode passes,
each feeding the draft before. In the steady state a row lags by one or two tokens (two after every draft was
accepted), so the catch-up is itself a decode pass of two rows per sequence; decode passes run on fixed buffers,
as CUDA graphs per bucket when captured. Rows that draft fewer than K tokens sit out the later passes as padding
(no KV written). No host sync: the drafts stay on the device for the verify.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.models.base import CausalLM
from infer.models.forward_batch import ForwardBatch, KVCache, cu_seqlens
from infer.runners.graphs import Graphs, decode_graphs
from infer.runners.step import StepInput, block_table_array
from infer.sampling.slots import SamplingSlots
from infer.sampling.speculative import draft_sample
from infer.transfer import StagedUpload


class Drafts(NamedTuple):
    tokens: torch.Tensor  # [B, K] int64 over all the step's rows (zeros where a row drafts fewer)
    probs: torch.Tensor | None  # [B, K, V] the drafter's distributions (None when every drafting row is greedy)


class DraftPlan(NamedTuple):
    """A step's drafting work on the host: R drafting rows, K = the most drafts of any."""

    rows: np.ndarray  # [R] the step rows that draft
    starts: np.ndarray  # [R] each row's input token position
    tables: np.ndarray  # [R, blocks] int32 block tables
    catch_up: tuple[np.ndarray, ...]  # ids, positions, slots, context lens: decode rows [2R], or varlen (+ cu)
    short: bool  # every row lags by at most two tokens: the catch-up is a decode pass of two rows per sequence
    passes: tuple[np.ndarray, np.ndarray, np.ndarray]  # positions, slots, context lens [K-1, R] of decode pass j
    sampling_slots: np.ndarray  # [R]


def plan(step: StepInput, block_size: int) -> DraftPlan:
    """What the drafter runs for `step` (step.drafter_tokens: each drafting row's tokens to catch up on)."""
    assert step.drafts is not None and step.drafter_tokens is not None
    rows = np.array([b for b, d in enumerate(step.drafts) if d], dtype=np.int64)
    num = np.array([len(step.drafts[b]) for b in rows], dtype=np.int64)
    cu_step = cu_seqlens(step.query_lens)
    starts = np.array([step.positions[cu_step[b]] for b in rows], dtype=np.int64)
    tables = block_table_array([step.block_tables[b] for b in rows])
    tokens = [step.drafter_tokens[b] for b in rows]
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    short = bool(lengths.max() <= 2)
    if short:  # rows 2i, 2i + 1: the token before the input (padding when already cached) and the input
        lengths = np.full(len(rows), 2, dtype=np.int64)
        tokens = [[0] * (2 - len(t)) + list(t) for t in tokens]
    positions = np.concatenate([np.arange(s - n + 1, s + 1) for s, n in zip(starts, lengths)])
    row_of = np.repeat(np.arange(len(rows)), lengths)
    slots = tables[row_of, positions // block_size].astype(np.int64) * block_size + positions % block_size
    ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
    if short:
        cached = np.array([len(step.drafter_tokens[b]) < 2 for b in rows]).repeat(2) & (np.arange(2 * len(rows)) % 2 == 0)
        slots[cached] = -1
        catch_up = (ids, positions, slots, np.where(cached, 0, positions + 1).astype(np.int32))
    else:
        catch_up = (ids, positions, slots, (starts + 1).astype(np.int32), np.array(cu_seqlens(lengths.tolist()), dtype=np.int32))
    # decode pass j (1 .. K-1) feeds draft j at position start + j; rows with fewer drafts are padding
    later = np.arange(1, int(num.max()))[:, None]
    live = later < num[None, :]
    pass_positions = np.where(live, starts[None, :] + later, 0)
    pass_slots = np.full(live.shape, -1, dtype=np.int64)
    for i, b in enumerate(rows):
        pass_slots[: num[i] - 1, i] = step.slot_mapping[cu_step[b] + 1 : cu_step[b] + num[i]]
    pass_context = np.where(live, pass_positions + 1, 0).astype(np.int32)
    sampling = np.array([step.sampling_slots[b] for b in rows], dtype=np.int64)
    return DraftPlan(rows, starts, tables, catch_up, short, (pass_positions, pass_slots, pass_context), sampling)


class Drafter:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, max_batch_size: int, max_seq_len: int,
                 graph_sizes: tuple[int, ...] = ()) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.device = model.embed.device
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype = model.embed.dtype
        self.kv_caches: list[KVCache] = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self._upload = StagedUpload(self.device)
        # fixed inputs of the decode passes (what the graphs read): up to two rows per sequence (the catch-up)
        rows, blocks = 2 * max_batch_size, -(-max_seq_len // block_size)
        self._ids = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._positions = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._slots = torch.full((rows,), -1, dtype=torch.int64, device=self.device)
        self._context = torch.zeros(rows, dtype=torch.int32, device=self.device)
        self._tables = torch.zeros(rows, blocks, dtype=torch.int32, device=self.device)
        self._cu = torch.arange(rows + 1, dtype=torch.int32, device=self.device)
        self.graphs: Graphs | None = None
        if graph_sizes:
            self.graphs = decode_graphs(self._decode_logits, graph_sizes, self.device, self.model)

    def _decode_logits(self, rows: int, max_context_len: int | None = None) -> torch.Tensor:
        """A decode pass over the fixed inputs' first `rows` rows (what a graph captures, at full capacity)."""
        batch = ForwardBatch(
            is_prefill=False, positions=self._positions[:rows], cu_seqlens_q=self._cu[: rows + 1],
            cu_seqlens_q_host=list(range(rows + 1)), max_seqlen_q=1, context_lens=self._context[:rows],
            max_context_len=self.max_seq_len if max_context_len is None else max_context_len,
            block_tables=self._tables[:rows], slot_mapping=self._slots[:rows], kv_caches=self.kv_caches,
        )
        return self.model.compute_logits(self.model(self._ids[:rows], batch))

    def _decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, context: torch.Tensor,
                tables: torch.Tensor, max_context_len: int) -> torch.Tensor:
        """Logits of one decode pass: its inputs copied into the fixed buffers (device to device), then the graph
        of its bucket replayed (padding rows past it store nothing), else the same forward eagerly."""
        rows = ids.shape[0]
        bucket = self.graphs.bucket(rows) if self.graphs is not None else None
        self._ids[:rows].copy_(ids)
        self._positions[:rows].copy_(positions)
        self._slots[:rows].copy_(slots)
        self._context[:rows].copy_(context)
        self._tables[:rows, : tables.shape[1]].copy_(tables)
        if bucket is None:
            return self._decode_logits(rows, max_context_len)
        self._slots[rows:bucket].fill_(-1)
        self._context[rows:bucket].fill_(0)
        return self.graphs.replay(bucket)[:rows]  # type: ignore[union-attr]

    def propose(self, step: StepInput, sampling: SamplingSlots) -> Drafts:
        """The drafts of every row with drafts in `step`, on the device."""
        p = plan(step, self.block_size)
        r = len(p.rows)
        catch_tables = np.repeat(p.tables, 2, axis=0) if p.short else p.tables
        up = self._upload(*p.catch_up, catch_tables, p.tables, *p.passes, p.rows, p.sampling_slots)
        catch, (catch_tables_dev, tables, pass_pos, pass_slots, pass_ctx, row_index, slots) = up[: len(p.catch_up)], up[len(p.catch_up):]
        t = sampling.gather(slots, p.sampling_slots.tolist())
        if p.short:
            logits = self._decode(*catch, catch_tables_dev, int(p.starts.max()) + 1).view(r, 2, -1)[:, 1]
        else:
            ids, positions, slot_mapping, context, cu = catch
            lengths = np.diff(p.catch_up[4])
            batch = ForwardBatch(
                is_prefill=True, positions=positions, cu_seqlens_q=cu, cu_seqlens_q_host=p.catch_up[4].tolist(),
                max_seqlen_q=int(lengths.max()), context_lens=context, context_lens_host=(p.starts + 1).tolist(),
                max_context_len=int(p.starts.max()) + 1, block_tables=catch_tables_dev, slot_mapping=slot_mapping,
                kv_caches=self.kv_caches,
            )
            logits = self.model.compute_logits(self.model(ids, batch)[batch.last_token_indices])
        token, q = draft_sample(logits, t, 0)
        tokens, probs = [token], [q]
        for j in range(pass_pos.shape[0]):
            logits = self._decode(token, pass_pos[j], pass_slots[j], pass_ctx[j], tables, int(p.passes[2][j].max()))
            token, q = draft_sample(logits, t, j + 1)
            tokens.append(token)
            probs.append(q)
        full = torch.zeros(step.num_seqs, len(tokens), dtype=torch.int64, device=self.device)
        full.index_copy_(0, row_index, torch.stack(tokens, dim=1))
        if probs[0] is None:
            return Drafts(full, None)
        dist = torch.zeros(step.num_seqs, len(probs), probs[0].shape[-1], dtype=probs[0].dtype, device=self.device)
        dist.index_copy_(0, row_index, torch.stack(probs, dim=1))  # type: ignore[arg-type]
        return Drafts(full, dist)
