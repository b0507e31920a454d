"""The step message rank 0 sends its tensor-parallel workers: what a step's forward needs, block tables as changes.

A worker runs the same forward as rank 0 (runners/torch_runner.py `_forward`), so it needs the step's token ids,
positions, lengths, KV slots, drafts and which rows continue from the previous step on the device; it does not
sample, so nothing of sampling travels, but the LoRA adapters to load and the joining requests' adapter slots do. Block tables are sent as the entries that differ from what the worker holds:
both sides keep a mirror indexed by sampling slot (a running request's slot is its own for its lifetime), and the
worker reads a step's tables off its mirror, so a decode step sends a few new block ids, not its [seqs, blocks] table.
Invariant: after decoding a message, the worker's tables for the step equal rank 0's (tests/unit/distributed).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from infer.runners.step import StepInput, StepKind, block_table_array
from infer.sampling.params import SamplingParams
from infer.sampling.slots import SlotState

STOP = b""  # the message that ends a worker's loop
NO_SAMPLING = SamplingParams()


class TableMirror:
    """Block tables by sampling slot, as the workers hold them."""

    def __init__(self, slots: int, max_blocks: int) -> None:
        self.tables = np.zeros((slots, max_blocks), dtype=np.int32)

    def diff(self, slots: np.ndarray, tables: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, column, block) of every entry of `tables` (rows by `slots`) that differs from the mirror, which
        takes them."""
        width = tables.shape[1]
        rows, cols = np.nonzero(self.tables[slots, :width] != tables)
        changed = (slots[rows], cols, tables[rows, cols])
        self.apply(*changed)
        return changed

    def apply(self, slots: np.ndarray, cols: np.ndarray, blocks: np.ndarray) -> None:
        self.tables[slots, cols] = blocks

    def read(self, slots: np.ndarray, width: int) -> np.ndarray:
        return self.tables[slots, :width]


class StepEncoder:
    """Rank 0's side: a StepInput to bytes."""

    def __init__(self, mirror: TableMirror) -> None:
        self.mirror = mirror

    def encode(self, step: StepInput) -> bytes:
        if step.drafter_tokens is not None:
            raise ValueError("a draft model's steps cannot run tensor-parallel")
        slots = np.asarray(step.sampling_slots, dtype=np.int64)
        tables = block_table_array(step.block_tables)
        fields: tuple[Any, ...] = (
            step.step_kind is StepKind.DECODE, step.token_ids, step.positions, step.query_lens, step.context_lens,
            step.slot_mapping, slots, step.prev_rows, step.drafts, step.prompt_logprobs, step.prompt_next, step.samples,
            step.lora_loads, [(s.slot, s.lora_slot) for s in step.joined if s.lora_slot >= 0],
            tables.shape[1], *self.mirror.diff(slots, tables),
        )
        return pickle.dumps(fields, protocol=5)


class StepDecoder:
    """A worker's side: bytes to the StepInput its forward runs."""

    def __init__(self, mirror: TableMirror) -> None:
        self.mirror = mirror

    def decode(self, data: bytes) -> StepInput:
        (decode, token_ids, positions, query_lens, context_lens, slot_mapping, slots, prev_rows, drafts,
         prompt_logprobs, prompt_next, samples, lora_loads, lora_joined, width, *changed) = pickle.loads(data)
        self.mirror.apply(*changed)
        # joining requests matter to a worker only for their LoRA adapter slots (it samples nothing)
        joined = [SlotState(slot, NO_SAMPLING, 0, 0, lora_slot=adapter) for slot, adapter in lora_joined]
        return StepInput(
            step_kind=StepKind.DECODE if decode else StepKind.PREFILL, token_ids=token_ids, positions=positions,
            query_lens=query_lens, context_lens=context_lens, slot_mapping=slot_mapping,
            block_tables=self.mirror.read(slots, width), sampling_slots=slots, prev_rows=prev_rows, drafts=drafts,
            prompt_logprobs=prompt_logprobs, prompt_next=prompt_next, samples=samples, joined=joined,
            lora_loads=lora_loads,
        )
