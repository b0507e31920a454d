"""The explicit step descriptor the engine hands a runner, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from infer.sampling.params import SamplingParams


class StepKind(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class StepInput:
    """Host-side description of one step; tokens of all sequences packed in order."""

    step_kind: StepKind
    token_ids: list[int]
    positions: list[int]
    query_lens: list[int]  # new tokens per sequence
    context_lens: list[int]  # tokens in cache per sequence after this step
    slot_mapping: list[int]
    block_tables: list[list[int]]
    sampling: list[SamplingParams]
    seeds: list[int]
    output_steps: list[int]  # tokens each sequence has generated so far (selects fresh noise)
    history: list[list[int]] | None = None  # prompt + output ids, only when a repetition penalty is set
    return_logits: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class StepResult:
    token_ids: list[int]
    logits: torch.Tensor | None = None  # [num_seqs, vocab] float32 when asked for
