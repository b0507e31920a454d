"""The explicit step descriptor the engine hands a runner, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from infer.lora.registry import LoRALoad
from infer.sampling.logprobs import TokenLogprob
from infer.sampling.slots import SlotState
from omniscience import ProbeLayout


Ints = list[int] | np.ndarray  # one int per row or token


class StepKind(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class StepInput:
    """Host-side description of one step; tokens of all sequences packed in order. A decode step read off the
    engine's decode table carries numpy arrays where the lists are typed `Ints` (block tables: [seqs, width],
    zero-padded), so the runner copies them whole."""

    step_kind: StepKind
    token_ids: list[int] = field(default_factory=list)
    positions: Ints = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)  # new tokens per sequence (a prompt chunk, or 1)
    context_lens: Ints = field(default_factory=list)  # tokens in cache per sequence after this step
    slot_mapping: Ints = field(default_factory=list)
    block_tables: list[list[int]] | np.ndarray = field(default_factory=list)
    sampling_slots: Ints = field(default_factory=list)  # per sequence: its slot of sampling state
    joined: list[SlotState] = field(default_factory=list)  # slots taken since the step before (written first)
    lora_loads: list[LoRALoad] = field(default_factory=list)  # adapters put into device slots before the step runs
    samples: list[bool] | None = None  # per sequence: whether its sampled token counts (None: every row's)
    prev_rows: list[int] | None = None  # per sequence: the previous step's row whose sampled id is its last input, or -1
    history: list[list[int]] | None = None  # prompt + output ids, only when a repetition penalty is set
    logprobs: list[int | None] | None = None  # per sequence: top-k count for the sampled token (None: nobody asks)
    # per sequence (prefill): the same for the prompt tokens after each of its positions, the last position's
    # target being `prompt_next` (the prompt's next token past this chunk; -1 where the chunk ends the prompt)
    prompt_logprobs: list[int | None] | None = None
    prompt_next: list[int] | None = None
    probes: bool = False  # read back each sequence's probe scores at the row that samples its token
    probe_prompt: list[int] | None = None  # per sequence (prefill): how many of its first new rows' scores to read
    drafts: list[tuple[int, ...]] | None = None  # per sequence: draft tokens, its last inputs, to verify (None: no drafts)
    # draft model: per sequence with drafts, the tokens its drafter has no KV for, ending with its input token (the
    # drafts above are then placeholders the drafter overwrites on the device); None with n-gram drafts
    drafter_tokens: list[list[int]] | None = None
    # per sequence (prefill): an embedding's pooling of this chunk, (kind, the first row to pool), or None
    pool: list[tuple[str, int] | None] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.token_ids)


def block_table_array(tables: list[list[int]] | np.ndarray) -> np.ndarray:
    """A step's block tables as one zero-padded int32 array [seqs, the longest table] (an array already is one)."""
    if isinstance(tables, np.ndarray):
        return tables
    out = np.zeros((len(tables), max((len(t) for t in tables), default=0)), dtype=np.int32)
    for i, table in enumerate(tables):
        out[i, : len(table)] = table
    return out


@dataclass
class StepResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per sequence, when asked
    # per sequence that asked: the logprobs of its prompt tokens after each position of its chunk (StepInput)
    prompt_logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
    probe_layout: ProbeLayout | None = None  # the probe set the scores below were computed with
    probe_scores: np.ndarray | None = None  # [num_seqs, columns]: the scores of the row each token was sampled at
    prompt_probe_scores: list[np.ndarray] | None = None  # per sequence: [probe_prompt[i], columns]
    extra_tokens: list[list[int]] | None = None  # speculation: per sequence, the tokens emitted after token_ids[i]
    # per sequence that pools (StepInput.pool): its chunk's pooled final hidden state, float32 [hidden] ("mean": the
    # sum of the pooled rows)
    pooled: list[np.ndarray | None] | None = None
