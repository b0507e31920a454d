"""The MLX engine: the runner protocol of runners/base.py on Apple silicon (Metal) or, for tests, MLX's CPU backend.

A step is encoded whole as one lazy MLX graph (ENCODE: the forward over the paged cache, the LM head of the rows
that sample, the structured-output mask, the seeded sampler, logprobs), submitted with one `mx.async_eval` (SUBMIT),
and waited on once when the engine asks for its result (READBACK, the step boundary), where the sampled ids and
logprobs come back together. A row whose input is the previous step's sampled token takes it from that step's
(lazy) output, so the engine may launch step N+1 before reading step N. INFER_STRICT_SYNC=1 makes any other wait
raise (strict.py). The KV cache arrays exist only here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import numpy as np
import torch

from infer.runners.mlx import apple_metal
from infer.runners.mlx.attention import StepLayout, step_layout
from infer.runners.mlx.model import MlxModel, cache_arrays
from infer.runners.mlx.sampler import MxLogprobs, MxSamplingRows, column_words, logprobs, sample
from infer.runners.mlx.slots import MxSamplingSlots
from infer.runners.mlx.strict import Phase, phase
from infer.runners.step import StepInput, StepResult
from infer.sampling.logprobs import by_sequence
from omniscience import ProbeBank


class MlxDevice:
    """What the engine asks of a runner's device (its type); MLX picks Metal or the CPU itself."""

    type = "mlx"

    def __str__(self) -> str:
        return f"mlx:{mx.default_device()}"


@dataclass
class StepProfile:
    """Where the MLX runner's steps spent host time, summed since start (seconds): building the lazy graph (ENCODE),
    submitting it (SUBMIT), waiting for the device at the step boundary (the first read of the sampled ids) and
    converting the read-outs to host values (READBACK). `steps` counts submitted steps, `waits` the boundaries read."""

    steps: int = 0
    encode_s: float = 0.0
    submit_s: float = 0.0
    waits: int = 0
    wait_s: float = 0.0
    readback_s: float = 0.0

    def per_step_ms(self) -> dict[str, float]:
        """The mean milliseconds of each phase per step."""
        return {"encode": 1e3 * self.encode_s / max(self.steps, 1), "submit": 1e3 * self.submit_s / max(self.steps, 1),
                "wait": 1e3 * self.wait_s / max(self.waits, 1), "readback": 1e3 * self.readback_s / max(self.waits, 1)}


@dataclass
class MlxLaunchedStep:
    """A submitted step; result() waits for it once and reads everything back."""

    token_ids: mx.array
    num_seqs: int
    logprobs: tuple[list[int], MxLogprobs] | None = None
    prompt_logprobs: list[MxLogprobs | None] | None = None
    pooled: tuple[list[int], mx.array] | None = None  # (sequences, their pooled rows [n, hidden] float32)
    profile: StepProfile | None = None  # the runner's counters, which the wait and readback add to

    def result(self) -> StepResult:
        with phase(Phase.READBACK):
            started = time.perf_counter()
            out = StepResult(token_ids=self.token_ids.tolist())
            waited = time.perf_counter()
            if self.logprobs is not None:
                rows, lp = self.logprobs
                out.logprobs = by_sequence(self.num_seqs, rows, lp.to_host())
            if self.prompt_logprobs is not None:
                out.prompt_logprobs = [None if p is None else p.to_host() for p in self.prompt_logprobs]
            if self.pooled is not None:
                rows, values = self.pooled
                out.pooled = [None] * self.num_seqs
                for i, row in zip(rows, np.array(values)):
                    out.pooled[i] = row
            if self.profile is not None:
                self.profile.waits += 1
                self.profile.wait_s += waited - started
                self.profile.readback_s += time.perf_counter() - waited
        return out


class MlxForwarded(NamedTuple):
    """A step between `MlxRunner.forward` and `sample`: its layout, input ids, hidden states, logits, sampling rows."""

    step: StepInput
    layout: StepLayout
    ids: mx.array
    hidden: mx.array
    logits: mx.array
    rows: MxSamplingRows


class MlxRunner:
    """Owns the MLX weights, the paged KV cache and the sampling state; turns a StepInput into sampled tokens."""

    probes: ProbeBank | None = None  # declined at startup (build/mlx_builder.py)
    # on Metal a step's submit returns before the GPU has run it, so the engine encodes the next step meanwhile; MLX's
    # CPU backend evaluates inside the submit, so launching ahead overlaps nothing there and measured slower
    # (0.82-0.87x serial steps, benchmarks/reports/mlx_cpu.md)
    launches_ahead = apple_metal()

    def __init__(self, model: MlxModel, num_blocks: int, block_size: int, max_batch_size: int = 32) -> None:
        cfg = model.config
        self.model = model
        self.device = MlxDevice()
        self.vocab_size = cfg.vocab_size
        self.num_blocks, self.block_size, self.max_batch_size = num_blocks, block_size, max_batch_size
        self.kv_caches = cache_arrays(cfg, num_blocks, block_size, model.dtype)
        self.sampling_slots = MxSamplingSlots(max_batch_size, cfg.vocab_size)
        self.columns = column_words(cfg.vocab_size)
        self.last_tokens = mx.zeros(max(max_batch_size, 1), dtype=mx.int32)
        mx.eval(self.kv_caches, self.columns, self.last_tokens)  # allocated now, not inside the first step
        self.profile = StepProfile()

    def check(self) -> None:
        """Raise when the runner can no longer run steps; one device always can."""

    def close(self) -> None:
        """Release what outlives the runner's memory: nothing (the arrays go with it)."""

    def execute(self, step: StepInput) -> StepResult:
        """One step, synchronously and without a grammar mask (tests, benchmarks, warm-up)."""
        return self.sample(self.forward(step), None).result()

    def forward(self, step: StepInput) -> MlxForwarded:
        """Encode the step's forward and LM head (lazy: nothing runs or waits yet)."""
        if step.num_seqs > self.max_batch_size:
            raise ValueError(f"step has {step.num_seqs} sequences; the runner was built for {self.max_batch_size}")
        if step.drafts is not None or step.drafter_tokens is not None:
            raise ValueError("speculative decoding: the mlx runner does not verify drafts (docs/apple.md)")
        slots = step.sampling_slots
        started = time.perf_counter()
        with phase(Phase.ENCODE):
            self.sampling_slots.join(step.joined)
            layout = step_layout(step, self.num_blocks, self.block_size)
            ids = self._input_ids(step, layout)
            hidden = self.model(ids, layout, self.kv_caches)
            logits = self.model.logits(hidden[mx.array(np.asarray(layout.last_rows, dtype=np.int32))])
            rows = self.sampling_slots.rows(slots)
            self.sampling_slots.advance(slots, step.samples)
        self.profile.encode_s += time.perf_counter() - started
        return MlxForwarded(step, layout, ids, hidden, logits, rows)

    def sample(self, forwarded: MlxForwarded, masks: torch.Tensor | None) -> MlxLaunchedStep:
        """Encode the sampling of a forwarded step (`masks`: the grammar bitmask of allowed tokens) and submit the
        whole step with one async evaluation."""
        step, layout, ids, hidden, logits, rows = forwarded
        slots = step.sampling_slots
        started = time.perf_counter()
        with phase(Phase.ENCODE):
            if masks is not None:
                logits = apply_token_bitmask(logits, masks)
            tokens = sample(logits, rows, self.columns, self._seen(step))
            self.sampling_slots.record(slots, tokens, step.samples)
            self.last_tokens = tokens
            launched = MlxLaunchedStep(tokens, step.num_seqs, self._sampled_logprobs(step, logits, tokens),
                                       self._prompt_logprobs(step, layout, hidden, ids), _pooled(step, layout, hidden),
                                       self.profile)
        encoded = time.perf_counter()
        with phase(Phase.SUBMIT):
            mx.async_eval(self._outputs(launched))
        profile = self.profile
        profile.steps += 1
        profile.encode_s += encoded - started
        profile.submit_s += time.perf_counter() - encoded
        return launched

    def _outputs(self, launched: MlxLaunchedStep) -> list[mx.array]:
        """What the step's evaluation is asked for: its read-outs and the sampling state. Not the KV cache: every
        layer's cache write feeds the sampled ids, so it is evaluated anyway, and an array the pending evaluation holds
        cannot be written in place by the next step's scatter: with launch-ahead MLX copied whole layer caches."""
        out = [launched.token_ids]
        out += [launched.pooled[1]] if launched.pooled is not None else []
        for lp in ([launched.logprobs[1]] if launched.logprobs else []) + [p for p in launched.prompt_logprobs or [] if p]:
            out += [lp.chosen, lp.top_values, lp.top_ids]
        out += [a for a in (self.sampling_slots.offset, self.sampling_slots.counts) if a is not None]
        return out

    def _input_ids(self, step: StepInput, layout: StepLayout) -> mx.array:
        """The step's token ids; a sequence whose last input the previous step sampled takes it from that output."""
        ids = np.asarray(step.token_ids, dtype=np.int32)
        if not step.prev_rows or all(r < 0 for r in step.prev_rows):
            return mx.array(ids)
        where = np.zeros(len(ids), dtype=bool)
        source = np.zeros(len(ids), dtype=np.int32)
        for seq, row in enumerate(step.prev_rows):
            if row >= 0:
                where[layout.last_rows[seq]], source[layout.last_rows[seq]] = True, row
        return mx.where(mx.array(where), self.last_tokens[mx.array(source)], mx.array(ids))

    def _seen(self, step: StepInput) -> mx.array | None:
        """[B, V] bool: the tokens each row has seen (prompt and output), for a repetition penalty."""
        if step.history is None:
            return None
        seen = np.zeros((step.num_seqs, self.vocab_size), dtype=bool)
        for row, history in enumerate(step.history):
            seen[row, [t for t in history if 0 <= t < self.vocab_size]] = True
        return mx.array(seen)

    def _sampled_logprobs(self, step: StepInput, logits: mx.array, tokens: mx.array
                          ) -> tuple[list[int], MxLogprobs] | None:
        asked = step.logprobs or []
        rows = [i for i, k in enumerate(asked) if k is not None]
        if not rows:
            return None
        index = mx.array(np.asarray(rows, dtype=np.int32))
        return rows, logprobs(logits[index], tokens[index], [int(asked[i] or 0) for i in rows])

    def _prompt_logprobs(self, step: StepInput, layout: StepLayout, hidden: mx.array, ids: mx.array
                         ) -> list[MxLogprobs | None] | None:
        """Logprob of each prompt token given the ones before it, for the sequences that asked: the targets of a
        chunk's positions are its own next ids, then the prompt's next token past the chunk (StepInput.prompt_next)."""
        if step.prompt_logprobs is None or step.prompt_next is None:
            return None
        out: list[MxLogprobs | None] = [None] * step.num_seqs
        starts = [0, *(r + 1 for r in layout.last_rows)]
        for i, k in enumerate(step.prompt_logprobs):
            start, end = starts[i], starts[i + 1]
            targets = ids[start + 1 : end]
            if k is not None and step.prompt_next[i] >= 0:
                targets = mx.concatenate([targets, mx.array([step.prompt_next[i]], dtype=targets.dtype)])
            if k is not None and targets.size:
                out[i] = logprobs(self.model.logits(hidden[start : start + targets.size]), targets, [k] * targets.size)
        return out


def _pooled(step: StepInput, layout: StepLayout, hidden: mx.array) -> tuple[list[int], mx.array] | None:
    """The torch runner's `pooled_rows` in MLX: each embedding row's last, first or summed chunk rows, float32."""
    if step.pool is None:
        return None
    starts = [0, *(r + 1 for r in layout.last_rows)]
    rows, values = [], []
    for i, pool in enumerate(step.pool):
        if pool is not None:
            kind, skip = pool
            start, end = starts[i], starts[i + 1]
            rows.append(i)
            chunk = hidden[start + skip : end] if kind == "mean" else hidden[end - 1 : end] if kind == "last" \
                else hidden[start : start + 1]
            values.append(mx.sum(chunk.astype(mx.float32), axis=0))
    return (rows, mx.stack(values)) if rows else None


def apply_token_bitmask(logits: mx.array, bitmask: torch.Tensor) -> mx.array:
    """-inf where bit (id % 32) of word bitmask[row, id // 32] is 0 (llguidance's layout, as token_mask.py reads it);
    ids past the mask's 32 * W are never allowed."""
    words = mx.array(bitmask.numpy().view(np.uint32))
    bits = (words[:, :, None] >> mx.arange(32, dtype=mx.uint32)) & 1
    allowed = bits.reshape(words.shape[0], -1).astype(mx.bool_)
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:
        allowed = mx.concatenate([allowed, mx.zeros((allowed.shape[0], vocab - allowed.shape[1]), dtype=mx.bool_)], 1)
    return mx.where(allowed[:, :vocab], logits, float("-inf"))
