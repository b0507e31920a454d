"""Sampling state kept on the device per slot: written once when a request joins, gathered by each step.

Every running request holds one slot (the scheduler hands them out, at most `max_batch_size`). A step
names its rows' slots; their parameters come from the slot tensors with two gathers instead of being
packed from Python objects for every row of every step. A slot's step counter (tokens generated so
far, which picks the sampling noise) advances on the device when its row samples, so a seeded row
draws the same noise as it would alone, with no per-step host work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from infer.sampling.params import SamplingParams
from infer.sampling.sampler import SamplingTensors, filters_vocabulary
from infer.transfer import upload


class SlotState(NamedTuple):
    """A request's sampling state when it takes a slot (joins the running batch, or rejoins after preemption)."""

    slot: int
    params: SamplingParams
    seed: int
    steps: int  # tokens the request has generated so far


class SamplingSlots:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size, self.device = vocab_size, device
        self._floats = torch.zeros(3, num_slots, dtype=torch.float32, device=device)  # temperature, top_p, penalty
        self._ints = torch.zeros(3, num_slots, dtype=torch.int64, device=device)  # top_k, seed, steps
        self._ones = torch.ones(num_slots, dtype=torch.int64, device=device)
        # host copies of what decides which sampling work a step needs (SamplingTensors' flags)
        self._sampled = np.zeros(num_slots, dtype=bool)
        self._filters = np.zeros(num_slots, dtype=bool)
        self._penalty = np.zeros(num_slots, dtype=bool)

    def join(self, joined: list[SlotState]) -> None:
        """Write the joining requests' parameters into their slots (asynchronous copies, no sync)."""
        if not joined:
            return
        packed = SamplingTensors.from_params(
            [s.params for s in joined], [s.seed for s in joined], [s.steps for s in joined], self.vocab_size, self.device
        )
        index = upload([s.slot for s in joined], torch.int64, self.device)
        self._floats.index_copy_(1, index, torch.stack([packed.temperature, packed.top_p, packed.repetition_penalty]))
        self._ints.index_copy_(1, index, torch.stack([packed.top_k, packed.seeds, packed.steps]))
        for s in joined:
            p = s.params
            self._sampled[s.slot] = not p.greedy
            self._filters[s.slot] = filters_vocabulary(p, self.vocab_size)
            self._penalty[s.slot] = p.repetition_penalty != 1

    def gather(self, slots: torch.Tensor, slots_host: list[int]) -> SamplingTensors:
        """The sampling tensors of a step whose rows hold `slots` (the same ids on the device and the host)."""
        floats, ints = self._floats[:, slots], self._ints[:, slots]
        sampled = self._sampled[slots_host]
        return SamplingTensors(
            temperature=floats[0], top_p=floats[1], repetition_penalty=floats[2],
            top_k=ints[0], seeds=ints[1], steps=ints[2],
            all_greedy=not sampled.any(),
            any_top_k_or_p=bool(self._filters[slots_host].any()),
            any_penalty=bool(self._penalty[slots_host].any()),
        )

    def advance(self, slots: torch.Tensor, by: torch.Tensor | None = None) -> None:
        """The rows holding `slots` sampled tokens that count (one each, or `by` [rows] int64 with speculation):
        their next draw uses the noise of the token index after them."""
        self._ints[2].index_add_(0, slots, self._ones[: slots.shape[0]] if by is None else by)
