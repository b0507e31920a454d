"""Sampling state kept on the device per slot: written once when a request joins, gathered by each step.

Every running request holds one slot (the scheduler hands them out, at most `max_batch_size`). A step
names its rows' slots; their parameters come from the slot tensors with two gathers instead of being
packed from Python objects for every row of every step. A slot's step counter (tokens generated so
far, which picks the sampling noise and counts toward min_tokens) advances on the device when its row samples,
so a seeded row draws the same noise as it would alone, with no per-step host work. A step whose rows are all
plain greedy reads neither, so it skips both the gathers and the advance (a greedy slot's counter then lags; it
is rewritten whenever a request takes the slot).

logit_bias, presence / frequency penalties and min_tokens (sampling/adjust.py) keep their state here too:
an additive offset per slot and token (the bias minus the penalties so far) and the generated-token counts,
[slots, vocab] tensors made the first time a request needs them, both updated on the device by `record`
where a token is sampled (a few ops over the step's rows, none over the vocabulary).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
import torch

from infer.sampling.adjust import MAX_HELD_IDS, LogitAdjustments, bias_row, held_row
from infer.sampling.params import SamplingParams
from infer.sampling.sampler import SamplingTensors, filters_vocabulary
from infer.transfer import upload


class SlotState(NamedTuple):
    """A request's sampling state when it takes a slot (joins the running batch, or rejoins after preemption)."""

    slot: int
    params: SamplingParams
    seed: int
    steps: int  # tokens the request has generated so far
    generated: tuple[int, ...] = ()  # those tokens, when a presence / frequency penalty counts them
    held_ids: tuple[int, ...] = ()  # the ids min_tokens holds back (end of sequence), when min_tokens > 0
    lora_slot: int = -1  # the device slot of its LoRA adapter (-1: the base model)


class SamplingSlots:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size, self.device = vocab_size, device
        # temperature, top_p, repetition penalty, presence penalty, frequency penalty, min_p
        self._floats = torch.zeros(6, num_slots, dtype=torch.float32, device=device)
        self._ints = torch.zeros(4, num_slots, dtype=torch.int64, device=device)  # top_k, seed, steps, min_tokens
        self._offset: torch.Tensor | None = None  # [slots, vocab] float32: bias minus penalties, made on first use
        self._counts: torch.Tensor | None = None  # [slots, vocab] float32, made with the first presence/frequency penalty
        self._held = torch.zeros(num_slots, MAX_HELD_IDS, dtype=torch.int64, device=device)
        self._ones = torch.ones(num_slots, dtype=torch.int64, device=device)
        # a plain greedy step's parameters, the same for every row (see `gather`)
        self._greedy_floats = torch.tensor([[0.0], [1.0], [1.0]]).repeat(1, num_slots).to(device)
        self._greedy_ints = torch.tensor([[vocab_size], [0], [0]]).repeat(1, num_slots).to(device)
        # host copies of what decides which sampling work a step needs (SamplingTensors' flags)
        self._sampled = np.zeros(num_slots, dtype=bool)
        self._filters = np.zeros(num_slots, dtype=bool)
        self._min_p = np.zeros(num_slots, dtype=bool)
        self._penalty = np.zeros(num_slots, dtype=bool)
        self._offsetting = np.zeros(num_slots, dtype=bool)  # a logit_bias or a presence / frequency penalty
        self._counting = np.zeros(num_slots, dtype=bool)
        self._holding = np.zeros(num_slots, dtype=bool)

    def join(self, joined: list[SlotState]) -> None:
        """Write the joining requests' parameters into their slots (asynchronous copies, no sync)."""
        if not joined:
            return
        packed = SamplingTensors.from_params(
            [s.params for s in joined], [s.seed for s in joined], [s.steps for s in joined], self.vocab_size, self.device
        )
        index = upload([s.slot for s in joined], torch.int64, self.device)
        extra_floats = upload([[s.params.presence_penalty for s in joined], [s.params.frequency_penalty for s in joined],
                               [s.params.min_p for s in joined]], torch.float32, self.device)
        self._floats.index_copy_(1, index, torch.cat([torch.stack([packed.temperature, packed.top_p,
                                                                   packed.repetition_penalty]), extra_floats]))
        min_tokens = upload([[s.params.min_tokens for s in joined]], torch.int64, self.device)
        self._ints.index_copy_(1, index, torch.cat([torch.stack([packed.top_k, packed.seeds, packed.steps]), min_tokens]))
        for s in joined:
            p = s.params
            self._sampled[s.slot] = not p.greedy
            self._filters[s.slot] = filters_vocabulary(p, self.vocab_size)
            self._min_p[s.slot] = p.cuts_min_p
            self._penalty[s.slot] = p.repetition_penalty != 1
        self._join_adjustments(joined, index)

    def _join_adjustments(self, joined: list[SlotState], index: torch.Tensor) -> None:
        """The joining slots' offsets (bias, then the penalties of the tokens a rejoining request has), counts and
        held ids (each written only where needed)."""
        biased = [(s.slot, *bias_row(s.params.logit_bias, self.vocab_size)) for s in joined if s.params.logit_bias]
        counting = [s for s in joined if s.params.counts_output]
        held = [(s.slot, held_row(s.held_ids, self.vocab_size)) for s in joined if s.params.min_tokens > 0]
        held = [(slot, ids) for slot, ids in held if ids is not None]
        for s in joined:
            self._offsetting[s.slot] = bool(s.params.logit_bias) or s.params.counts_output
            self._counting[s.slot] = s.params.counts_output
            self._holding[s.slot] = False
        if (biased or counting) and self._offset is None:
            self._offset = torch.zeros(self._sampled.shape[0], self.vocab_size, dtype=torch.float32, device=self.device)
        if counting and self._counts is None:
            self._counts = torch.zeros(self._sampled.shape[0], self.vocab_size, dtype=torch.float32, device=self.device)
        for table in (self._offset, self._counts):
            if table is not None:
                table.index_fill_(0, index, 0.0)
        if self._offset is not None:
            self._scatter(self._offset, [(slot, t, v) for slot, ids, values in biased for t, v in zip(ids, values)])
        if self._counts is not None and self._offset is not None:  # a rejoining request's tokens so far
            seen = [(s, t, c) for s in counting for t, c in Counter(s.generated).items() if 0 <= t < self.vocab_size]
            self._scatter(self._counts, [(s.slot, t, float(c)) for s, t, c in seen])
            p = {s.slot: s.params for s, _, _ in seen}
            self._scatter(self._offset, [(s.slot, t, -(c * p[s.slot].frequency_penalty + p[s.slot].presence_penalty))
                                         for s, t, c in seen], accumulate=True)
        if held:
            rows = upload([slot for slot, _ in held], torch.int64, self.device)
            self._held.index_copy_(0, rows, upload([ids for _, ids in held], torch.int64, self.device))
            for slot, _ in held:
                self._holding[slot] = True

    def _scatter(self, table: torch.Tensor, entries: list[tuple[int, int, float]], accumulate: bool = False) -> None:
        if not entries:
            return
        where = upload([[e[0] for e in entries], [e[1] for e in entries]], torch.int64, self.device)
        values = upload([[e[2] for e in entries]], torch.float32, self.device)[0]
        table.index_put_((where[0], where[1]), values, accumulate=accumulate)

    def gather(self, slots: torch.Tensor, slots_host: list[int]) -> SamplingTensors:
        """The sampling tensors of a step whose rows hold `slots` (the same ids on the device and the host).
        When every row is plain greedy (`SamplingTensors.plain_greedy`) no slot is read: the rows get the neutral
        parameters of a greedy row, which is what their slots hold where it matters, and no device work."""
        all_greedy = not self._sampled[slots_host].any()
        any_penalty = bool(self._penalty[slots_host].any())
        offsetting, holding = bool(self._offsetting[slots_host].any()), bool(self._holding[slots_host].any())
        if all_greedy and not any_penalty and not (offsetting or holding):  # plain_greedy, from the host flags
            rows = len(slots_host)
            floats, ints = self._greedy_floats[:, :rows], self._greedy_ints[:, :rows]
        else:
            floats, ints = self._floats[:, slots], self._ints[:, slots]
        return SamplingTensors(
            temperature=floats[0], top_p=floats[1], repetition_penalty=floats[2],
            top_k=ints[0], seeds=ints[1], steps=ints[2],
            all_greedy=all_greedy,
            any_top_k_or_p=bool(self._filters[slots_host].any()),
            any_penalty=any_penalty,
            adjust=self._adjustments(slots, ints, offsetting, holding),
            min_p=floats[5] if self._min_p[slots_host].any() else None,
        )

    def _adjustments(self, slots: torch.Tensor, ints: torch.Tensor, offsetting: bool,
                     holding: bool) -> LogitAdjustments | None:
        if not (offsetting or holding):
            return None
        return LogitAdjustments(
            min_tokens=ints[3],
            offset=self._offset[slots] if offsetting and self._offset is not None else None,
            held=self._held[slots] if holding else None,
        )

    def record(self, slots: torch.Tensor, slots_host: list[int], tokens: torch.Tensor,
               counts: torch.Tensor | None = None, samples: list[int] | None = None) -> None:
        """Count sampled tokens into their slots (only while some row of the step keeps counts), and take each
        one's penalty off its slot's offset: the frequency penalty every time, the presence penalty the first.
        tokens [rows] (`samples` marks the rows whose token counts, None: all), or [rows, width] with `counts`
        [rows] emitted: a row that keeps counts drafts nothing, so its one token is tokens[b, 0]. The step's
        rows hold distinct slots, so each (slot, token) is written once: plain indexing, no accumulation."""
        if self._counts is None or self._offset is None or not self._counting[slots_host].any():
            return
        if tokens.dim() == 2:
            tokens, kept = tokens[:, 0], (counts > 0).to(torch.float32) if counts is not None else None
        else:
            kept = None if samples is None else upload([[float(bool(c)) for c in samples]], torch.float32, self.device)[0]
        where = (slots, tokens)
        seen = self._counts[where]
        penalty = self._floats[4, slots] + self._floats[3, slots] * (seen == 0)
        self._counts[where] = seen + (1.0 if kept is None else kept)
        self._offset[where] = self._offset[where] - (penalty if kept is None else kept * penalty)

    def advance(self, slots: torch.Tensor, by: torch.Tensor | None = None) -> None:
        """The rows holding `slots` sampled tokens that count (one each, or `by` [rows] int64 with speculation):
        their next draw uses the noise of the token index after them, and min_tokens counts them. A plain greedy
        step's rows read neither, so it need not advance (a slot's count is rewritten when a request takes it)."""
        self._ints[2].index_add_(0, slots, self._ones[: slots.shape[0]] if by is None else by)
