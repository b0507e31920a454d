"""Per-slot sampling state of the MLX runner (what sampling/slots.py keeps for torch).

The parameters and each slot's step counter live on the host: a step's rows advance their counters when they
sample, whatever token they draw, so the host knows every counter without reading the device, and the noise key of
(seed, step) is hashed there. What does depend on the drawn tokens, the generated-token counts behind presence and
frequency penalties and the offsets they feed, stays in MLX arrays updated lazily with the step's sampled ids.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np

from infer.runners.mlx.sampler import MxSamplingRows, row_keys
from infer.sampling.adjust import MAX_HELD_IDS, bias_row, held_row
from infer.sampling.sampler import filters_vocabulary
from infer.sampling.slots import SlotState


class MxSamplingSlots:
    def __init__(self, num_slots: int, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        n = num_slots
        self.temperature, self.top_p, self.penalty = np.zeros(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32)
        self.min_p = np.zeros(n, np.float32)  # 0 where off, and on greedy rows (min-p never cuts their argmax)
        self.presence, self.frequency = np.zeros(n, np.float32), np.zeros(n, np.float32)
        self.top_k, self.min_tokens = np.full(n, vocab_size, np.int32), np.zeros(n, np.int64)
        self.seeds, self.steps = np.zeros(n, np.uint64), np.zeros(n, np.int64)
        self.filters, self.offsetting, self.counting = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        self.held = np.zeros((n, MAX_HELD_IDS), np.int32)
        self.holds = np.zeros(n, bool)
        self.offset: mx.array | None = None  # [slots, vocab]: logit_bias minus the penalties so far
        self.counts: mx.array | None = None  # [slots, vocab]: generated tokens, with a presence / frequency penalty

    def join(self, joined: list[SlotState]) -> None:
        """Write the joining requests' parameters into their slots (offsets and counts lazily)."""
        for s in joined:
            p, i = s.params, s.slot
            self.temperature[i] = 0.0 if p.greedy else p.temperature
            self.top_p[i], self.penalty[i] = p.top_p, p.repetition_penalty
            self.min_p[i] = p.min_p if p.cuts_min_p else 0.0
            self.presence[i], self.frequency[i] = p.presence_penalty, p.frequency_penalty
            self.top_k[i] = self.vocab_size if p.top_k is None else min(p.top_k, self.vocab_size)
            self.seeds[i], self.steps[i], self.min_tokens[i] = s.seed, s.steps, p.min_tokens
            self.filters[i] = filters_vocabulary(p, self.vocab_size)
            self.offsetting[i], self.counting[i] = bool(p.logit_bias) or p.counts_output, p.counts_output
            held = held_row(s.held_ids, self.vocab_size) if p.min_tokens > 0 else None
            self.holds[i] = held is not None
            if held is not None:
                self.held[i] = held
        if self.offset is not None or any(self.offsetting[s.slot] for s in joined):
            self._join_offsets(joined)

    def _join_offsets(self, joined: list[SlotState]) -> None:
        """Reset the joining slots' rows, then write their bias and, for a request rejoining, its counts so far."""
        n, v = self.temperature.shape[0], self.vocab_size
        offset = np.zeros((len(joined), v), np.float32)
        counts = np.zeros((len(joined), v), np.float32)
        for row, s in enumerate(joined):
            ids, values = bias_row(s.params.logit_bias, v) if s.params.logit_bias else ([], [])
            offset[row, ids] = values
            if s.params.counts_output:
                for t, c in Counter(s.generated).items():
                    if 0 <= t < v:
                        counts[row, t] = c
                        offset[row, t] -= c * s.params.frequency_penalty + s.params.presence_penalty
        slots = mx.array(np.array([s.slot for s in joined], np.int32))
        if self.offset is None:
            self.offset = mx.zeros((n, v), mx.float32)
        self.offset[slots] = mx.array(offset)
        if self.counts is not None or any(s.params.counts_output for s in joined):
            if self.counts is None:
                self.counts = mx.zeros((n, v), mx.float32)
            self.counts[slots] = mx.array(counts)

    def rows(self, slots: list[int] | np.ndarray) -> MxSamplingRows:
        """The sampling parameters of a step whose rows hold `slots`."""
        s = np.asarray(slots, dtype=np.int64)
        temperature, min_p = self.temperature[s], self.min_p[s]
        holding = self.holds[s] & (self.steps[s] < self.min_tokens[s])
        index = mx.array(s.astype(np.int32))
        return MxSamplingRows(
            temperature=mx.array(temperature), top_k=mx.array(self.top_k[s]), top_p=mx.array(self.top_p[s]),
            repetition_penalty=mx.array(self.penalty[s]), keys=mx.array(row_keys(self.seeds[s], self.steps[s])),
            all_greedy=not bool((temperature > 0).any()), any_top_k_or_p=bool(self.filters[s].any()),
            any_penalty=bool((self.penalty[s] != 1).any()),
            offset=self.offset[index] if self.offset is not None and self.offsetting[s].any() else None,
            held=mx.array(self.held[s]) if holding.any() else None,
            holding=mx.array(holding) if holding.any() else None,
            min_p=mx.array(min_p) if min_p.any() else None,
        )

    def record(self, slots: list[int] | np.ndarray, tokens: mx.array, samples: list[bool] | None) -> None:
        """Count the step's sampled tokens into their slots' counts and offsets (lazily; only rows that keep counts)."""
        s = np.asarray(slots, dtype=np.int64)
        if self.counts is None or self.offset is None or not self.counting[s].any():
            return
        kept = self.counting[s] & (np.ones(len(s), bool) if samples is None else np.asarray(samples, bool))
        index, weight = mx.array(s.astype(np.int32)), mx.array(kept.astype(np.float32))
        seen = self.counts[index, tokens]
        penalty = mx.array(self.frequency[s]) + mx.array(self.presence[s]) * (seen == 0)
        self.counts[index, tokens] = seen + weight
        self.offset[index, tokens] = self.offset[index, tokens] - weight * penalty

    def advance(self, slots: list[int] | np.ndarray, samples: list[bool] | None) -> None:
        """The rows whose token counts move on to the next draw's noise."""
        s = np.asarray(slots, dtype=np.int64)
        if samples is not None:
            s = s[np.asarray(samples, bool)]
        np.add.at(self.steps, s, 1)
