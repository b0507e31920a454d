"""A scheduled batch as the runner's StepInput: the one place the core packs a step's rows.

The decode table's rows come first, read off its arrays (no Python loop over the requests but for their last token
ids); then the scheduler's other rows (prefill chunks, or decodes with drafts), their per-token positions and slots
as whole arrays; then what only some steps need (joining requests' sampling state, logprobs, probes, history).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from infer.engine.request import Request
from infer.engine.scheduler import ScheduledBatch, ScheduledRow, Scheduler
from infer.runners.step import StepInput, StepKind
from infer.sampling.slots import SlotState


def step_input(batch: ScheduledBatch, scheduler: Scheduler, prev_rows: list[int] | None,
               eos_token_ids: Collection[int], drafter: bool) -> StepInput:
    """The runner's step for `batch`; `prev_rows` from the overlap (InFlight.prev_rows), `drafter`: the drafts come
    from a draft model, which is fed the tokens it has not seen."""
    rows, requests, d = batch.rows, batch.requests, batch.decode
    step = StepInput(StepKind.DECODE if batch.is_decode else StepKind.PREFILL)
    step.prev_rows = prev_rows
    if d is not None:
        step.token_ids = [r.token_ids[-1] for r in d.requests]  # a pending token's row takes it on the device
        step.positions, step.slot_mapping, step.context_lens = d.positions, d.slot_mapping, d.context_lens
        step.block_tables, step.sampling_slots = d.block_tables, d.sampling_slots
        step.query_lens = [1] * len(d.requests)
    if rows:
        _add_rows(step, batch, scheduler.wants_probes, drafter)
    step.joined = [slot_state(r, eos_token_ids) for r in batch.joined]
    step.lora_loads = batch.lora_loads
    step.probes = scheduler.wants_probes
    if scheduler.wants_logprobs:
        step.logprobs = [r.sampling_params.logprobs for r in requests[: batch.num_decode]]
        step.logprobs += [r.request.sampling_params.logprobs if r.samples else None for r in rows]
    if scheduler.needs_history:
        step.history = [r.token_ids for r in requests]
    return step


def slot_state(request: Request, eos_token_ids: Collection[int]) -> SlotState:
    """What the runner writes into a joining request's sampling slot (its generated tokens only when a penalty counts
    them, the end-of-sequence ids only while min_tokens holds them back)."""
    p = request.sampling_params
    return SlotState(request.sampling_slot, p, request.seed, len(request.output_token_ids),
                     tuple(request.output_token_ids) if p.counts_output else (),
                     tuple(sorted(eos_token_ids)) if p.min_tokens and not p.ignore_eos else (), request.lora_slot)


def _add_rows(step: StepInput, batch: ScheduledBatch, probes: bool, drafter: bool) -> None:
    """Pack the batch's rows (prefill chunks, or decodes with drafts) after the decode table's rows."""
    rows, n = batch.rows, batch.num_decode
    if batch.is_decode and not batch.has_drafts:
        token_ids = [r.request.tokens_at(r.start, 1)[0] for r in rows]
    else:
        token_ids = []
        for r in rows:  # whole slices: no loop over a chunk's tokens
            token_ids += r.request.tokens_at(r.start, r.num_new - len(r.drafts))
            token_ids += r.drafts
        if batch.has_drafts:
            step.drafts = [r.drafts for r in rows]
            if drafter:
                step.drafter_tokens = [r.request.token_ids[r.request.num_drafter_tokens : r.start + 1] if r.drafts
                                       else [] for r in rows]
    if not batch.is_decode:
        step.prompt_logprobs = [None] * n + [r.prompt_logprobs for r in rows]
        if any(r.prompt_logprobs is not None for r in rows):
            step.prompt_next = [-1] * n + [_prompt_next(r) for r in rows]
        if probes:
            step.probe_prompt = [0] * n + [_prompt_rows(r) for r in rows]
        if any(r.pooling for r in rows):
            step.pool = [None] * n + [_pool(r) for r in rows]
    samples = [r.samples for r in rows]  # a chunk short of its prompt's end samples a token nobody keeps
    step.samples = None if all(samples) else [True] * n + samples
    step.token_ids = step.token_ids + token_ids
    # per token, as arrays: a prompt chunk's thousand positions cost no Python loop
    step.positions = np.concatenate([np.asarray(step.positions, dtype=np.int64),
                                     *(np.arange(r.start, r.start + r.num_new) for r in rows)])
    step.slot_mapping = np.concatenate([np.asarray(step.slot_mapping, dtype=np.int64), *(r.slots for r in rows)])
    step.query_lens = step.query_lens + [r.num_new for r in rows]
    step.context_lens = _listed(step.context_lens) + [r.start + r.num_new for r in rows]
    step.sampling_slots = _listed(step.sampling_slots) + [r.request.sampling_slot for r in rows]
    tables = [r.block_table for r in rows]
    if n:  # one padded array: the table's rows, then these
        assert isinstance(step.block_tables, np.ndarray)
        width = max(step.block_tables.shape[1], max(map(len, tables)))
        padded = np.zeros((n + len(rows), width), dtype=np.int32)
        padded[:n, : step.block_tables.shape[1]] = step.block_tables
        for i, table in enumerate(tables):
            padded[n + i, : len(table)] = table
        step.block_tables = padded
    else:
        step.block_tables = tables


def _listed(values: list[int] | np.ndarray) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else values


def _prompt_next(row: ScheduledRow) -> int:
    """The prompt token after a row's chunk, the target of its last position's prompt logprob; -1 at the prompt's end."""
    end, prompt = row.start + row.num_new, row.request.prompt_token_ids
    return prompt[end] if row.prompt_logprobs is not None and end < len(prompt) else -1


def _pool(row: ScheduledRow) -> tuple[str, int] | None:
    """What of the row's chunk its embedding pools: (kind, the first chunk row not pooled yet), None for nothing
    (a "last" pooling's chunks before the prompt's end, a "cls" pooling's after its start)."""
    if row.pooling is None:
        return None
    request, end = row.request, row.start + row.num_new
    skip = max(0, request.pooled_positions - row.start)
    if skip >= row.num_new or (row.pooling == "last" and end < len(request.prompt_token_ids)):
        return None
    if row.pooling == "cls" and row.start + skip > 0:
        return None
    return row.pooling, skip


def _prompt_rows(row: ScheduledRow) -> int:
    """How many of the row's new positions are prompt positions whose scores its request still needs."""
    request = row.request
    if not request.needs_prompt_probes:
        return 0
    return max(0, min(row.start + row.num_new, len(request.prompt_token_ids)) - row.start)
