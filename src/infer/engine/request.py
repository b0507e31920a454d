"""A request's state machine in the engine core."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from infer.sampling.logprobs import TokenLogprob
from infer.sampling.params import SamplingParams

if TYPE_CHECKING:
    from infer.lora.registry import AdapterRef
    from infer.structured.masks import Grammar


class RequestState(str, Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False)  # identity: queue membership tests must not compare token lists field by field
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    state: RequestState = RequestState.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    arrival_index: int = 0  # position in arrival order
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    last_step: int = 0  # scheduler step that last served this request (the fairness rule)
    num_preemptions: int = 0
    outputs_sent: bool = False
    pending_tokens: int = 0  # sampled on the device by launched steps, not read back yet
    num_computed_tokens: int = 0  # positions whose KV is in the cache or written by a launched step
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    grammar: Grammar | None = None  # a structured request's matcher, advanced by every accepted token
    sampling_slot: int = -1  # while running: the runner's slot holding its sampling state (scheduler-assigned)
    lora: AdapterRef | None = None  # its LoRA adapter (None: the base model)
    lora_slot: int = -1  # while running: the device slot holding its adapter (scheduler-assigned)
    probe_names: tuple[str, ...] = ()  # probes whose scores its outputs carry (checked against the loaded set)
    prompt_probes: dict[str, list[float | None]] = field(default_factory=dict)  # with probe_prompt: collected so far
    prompt_probe_positions: int = 0  # prompt positions whose scores are collected (a recomputation skips them)
    # with prompt_logprobs: the prompt's logprobs collected so far, chunk by chunk (the first token has none)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])
    num_drafted: int = 0  # speculation: draft tokens verified for this request
    num_accepted: int = 0  # of which accepted
    num_drafter_tokens: int = 0  # draft model: leading positions whose KV the drafter holds (runners/drafter.py)
    # with pooling: the prompt positions pooled so far and their pooled hidden state (a sum for "mean")
    pooled_positions: int = 0
    pooled: np.ndarray | None = None
    token_ids: list[int] = field(init=False)  # prompt and output ids known on the host (pending ones excluded)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

    @property
    def may_speculate(self) -> bool:
        """Whether drafts may be verified for it: not with features that need each token's own step (logprobs,
        a repetition, presence or frequency penalty, probe scores or probe_stop, an output grammar)."""
        p = self.sampling_params
        return (p.logprobs is None and not p.needs_history and not p.counts_output and not self.probe_names
                and p.probe_stop is None and self.grammar is None)

    @property
    def plain_outputs(self) -> bool:
        """Whether a token's output needs nothing but the EOS and length checks and, when asked, its probe scores:
        no grammar, logprobs or probe_stop (the core checks such requests' decode rows as arrays,
        infer/engine/outputs.py)."""
        p = self.sampling_params
        return self.grammar is None and p.logprobs is None and p.probe_stop is None and p.max_tokens > 0

    @property
    def needs_prompt_logprobs(self) -> bool:
        """It asked for prompt logprobs and some prompt positions have none yet (so none may come from the prefix
        cache)."""
        return self.sampling_params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def needs_prompt_probes(self) -> bool:
        """It asked for prompt scores and some prompt positions have none yet (so none may come from the prefix cache)."""
        return self.sampling_params.probe_prompt and self.prompt_probe_positions < len(self.prompt_token_ids)

    @property
    def pools_every_position(self) -> bool:
        """Its embedding pools positions before the last (mean, cls), so none may come from the prefix cache."""
        return self.sampling_params.pooling in ("mean", "cls")

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens counting the pending ones: a decode step feeds the last at position this - 1."""
        return self.num_tokens + self.pending_tokens

    def budget_reached(self, max_seq_len: int) -> bool:
        """The pending tokens will end the request (max_tokens or max_seq_len): another step would be wasted."""
        if not self.pending_tokens:
            return False
        outputs = len(self.output_token_ids) + self.pending_tokens
        return outputs >= self.sampling_params.max_tokens or self.num_scheduled_tokens >= max_seq_len

    @property
    def num_uncomputed(self) -> int:
        """Positions still to run through the model: the prompt's rest while prefilling, 1 while decoding."""
        return self.num_scheduled_tokens - self.num_computed_tokens

    def tokens_at(self, start: int, count: int) -> list[int]:
        """Ids of positions [start, start + count); 0 stands in for a pending one (still on the device)."""
        out = self.token_ids[start : start + count]
        return out if len(out) == count else out + [0] * (count - len(out))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.FAILED)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.sampling_params.max_tokens
