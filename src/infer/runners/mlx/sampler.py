"""The seeded sampler of infer/sampling/sampler.py in MLX, built lazily inside the step and evaluated with it.

The same ordered logit transforms (sampling/transforms.py: repetition penalty, logit adjustments, then temperature,
min-p, top-k, top-p) and a Gumbel-max draw, the same min-p and top-k / top-p cuts (layerzero's `mask_top_k_top_p`, ties kept), and the same
counter-based noise (sampling/random.py): the row key is hashed on the host from (seed, step) with the torch code's
constants, the column words once per vocabulary, and the per-token mix runs in uint32 on the device (MLX's uint32
products wrap mod 2**32, which is the torch code's `& 0xFFFFFFFF`). A request's tokens under a seed are the torch
runner's whenever the logits agree to within the float noise of the two backends.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from infer.sampling.logprobs import LogprobTensors, TokenLogprob
from infer.sampling.transforms import BEFORE_GREEDY, SAMPLED_ONLY, check_table, run
from infer.sampling.random import _MUL_A, _MUL_B, _SALT_COL, _SALT_KEY, _SALT_STEP, _TWO_POW_M24, _TWO_POW_M25

_MASK32 = 0xFFFFFFFF
NEG_INF = float("-inf")


def mix32_host(x: np.ndarray) -> np.ndarray:
    """sampling/random.py's `_mix32_` on uint64 values holding 32-bit words."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(_MUL_A)) & np.uint64(_MASK32)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(_MUL_B)) & np.uint64(_MASK32)
    return x ^ (x >> np.uint64(15))


def row_keys(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """sampling/random.py's `_row_keys`: one 32-bit key per row from its 64-bit seed and step."""
    seeds, steps = seeds.astype(np.uint64), steps.astype(np.uint64)
    m = np.uint64(_MASK32)
    key = mix32_host((steps >> np.uint64(32)) ^ np.uint64(_SALT_STEP))
    key = mix32_host(key ^ (steps & m))
    key = mix32_host(key ^ (seeds >> np.uint64(32)) ^ np.uint64(_SALT_KEY))
    return mix32_host(key ^ (seeds & m)).astype(np.uint32)


def column_words(vocab: int) -> mx.array:
    return mx.array(mix32_host(np.arange(vocab, dtype=np.uint64) ^ np.uint64(_SALT_COL)).astype(np.uint32))


def _mix32(x: mx.array) -> mx.array:
    a, b = mx.array(_MUL_A, dtype=mx.uint32), mx.array(_MUL_B, dtype=mx.uint32)
    x = x ^ (x >> 16)
    x = x * a
    x = x ^ (x >> 15)
    x = x * b
    return x ^ (x >> 15)


def uniform(keys: mx.array, cols: mx.array) -> mx.array:
    """[B, V] float32 in (0, 1): sampling/random.py's `uniform` for row keys [B] and column words [V]."""
    cells = (_mix32(keys[:, None] ^ cols[None, :]) >> 8).astype(mx.float32)
    return mx.maximum(cells * _TWO_POW_M24, _TWO_POW_M25)


@dataclass
class MxSamplingRows:
    """A step's per-row sampling parameters (device arrays) and host flags, as SamplingTensors are for torch."""

    temperature: mx.array  # [B] float32, 0 for greedy rows
    top_k: mx.array  # [B] int32
    top_p: mx.array  # [B] float32
    repetition_penalty: mx.array  # [B] float32
    keys: mx.array  # [B] uint32 noise keys of (seed, step)
    all_greedy: bool
    any_top_k_or_p: bool
    any_penalty: bool
    offset: mx.array | None = None  # [B, V] logit_bias minus presence / frequency penalties so far
    held: mx.array | None = None  # [B, H] ids at -inf where `holding`
    holding: mx.array | None = None  # [B] bool: the row has generated fewer than its min_tokens
    min_p: mx.array | None = None  # [B] float32 (0: off); None when no sampled row has one


def mask_top_k_top_p(logits: mx.array, top_k: mx.array, top_p: mx.array) -> mx.array:
    """layerzero's reference `mask_top_k_top_p` (top-k, then top-p over the survivors; ties at a cut kept)."""
    vocab = logits.shape[-1]
    ascending = mx.sort(logits, axis=-1)
    kth = mx.take_along_axis(ascending, mx.maximum(vocab - top_k, 0)[:, None], axis=-1)
    ascending = mx.where(ascending < kth, NEG_INF, ascending)
    cumulative = mx.cumsum(mx.softmax(ascending, axis=-1), axis=-1)
    dropped = mx.sum(cumulative <= (1 - top_p)[:, None], axis=-1, keepdims=True)
    cut = mx.take_along_axis(ascending, mx.minimum(dropped, vocab - 1), axis=-1)
    return mx.where(logits < cut, NEG_INF, logits)


def mask_min_p(logits: mx.array, min_p: mx.array) -> mx.array:
    """sampling/sampler.py's `filter_min_p`: -inf where logit - row max < log(min_p), i.e. p < min_p * max p."""
    gap = logits - mx.max(logits, axis=-1, keepdims=True)
    return mx.where(gap < mx.log(min_p)[:, None], NEG_INF, logits)


def _repetition_penalty(logits: mx.array, t: MxSamplingRows, seen: mx.array | None) -> mx.array:
    if not t.any_penalty:
        return logits
    if seen is None:
        raise ValueError("a row has repetition_penalty != 1 but no seen-token mask was given")
    factor = t.repetition_penalty[:, None]
    return mx.where(seen, mx.where(logits < 0, logits * factor, logits / factor), logits)


def _adjustments(logits: mx.array, t: MxSamplingRows, seen: mx.array | None) -> mx.array:
    """logit_bias minus the presence / frequency penalties so far, then the ids min_tokens holds back at -inf."""
    if t.offset is not None:
        logits = logits + t.offset
    if t.held is not None and t.holding is not None:
        values = mx.where(t.holding[:, None], NEG_INF, mx.take_along_axis(logits, t.held, axis=-1))
        logits = mx.put_along_axis(logits, t.held, values, axis=-1)
    return logits


TRANSFORMS = check_table({  # sampling/transforms.py's list, in MLX
    "repetition_penalty": _repetition_penalty,
    "adjustments": _adjustments,
    "temperature": lambda x, t, seen: x / mx.where(t.temperature == 0, 1.0, t.temperature)[:, None],
    "min_p": lambda x, t, seen: x if t.min_p is None else mask_min_p(x, t.min_p),
    "top_k_top_p": lambda x, t, seen: mask_top_k_top_p(x, t.top_k, t.top_p) if t.any_top_k_or_p else x,
})


def sample(logits: mx.array, t: MxSamplingRows, cols: mx.array, seen: mx.array | None = None) -> mx.array:
    """Next token per row (int32 [B]) from float32 logits [B, V]; lazy, nothing is evaluated here."""
    logits = run(BEFORE_GREEDY, TRANSFORMS, logits, t, seen)
    greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
    if t.all_greedy:
        return greedy
    scaled = run(SAMPLED_ONLY, TRANSFORMS, logits, t)
    log_e = mx.log(-mx.log(uniform(t.keys, cols)))
    drawn = mx.argmax(scaled - log_e, axis=-1).astype(mx.int32)
    return mx.where(t.temperature == 0, greedy, drawn)


@dataclass
class MxLogprobs:
    """Logprobs of chosen tokens and each row's best alternatives, still lazy; `to_host` at the readback."""

    token_ids: mx.array
    chosen: mx.array
    top_values: mx.array
    top_ids: mx.array
    num_top: list[int]

    def to_host(self) -> list[TokenLogprob]:
        import torch

        return LogprobTensors(*(torch.from_numpy(np.array(a)) for a in
                                (self.token_ids, self.chosen, self.top_values, self.top_ids)), self.num_top).to_host()


def logprobs(logits: mx.array, token_ids: mx.array, num_top: list[int]) -> MxLogprobs:
    """sampling/logprobs.py's `logprob_tensors` in MLX."""
    logp = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logp, token_ids[:, None].astype(mx.int32), axis=-1)[:, 0]
    k = max(num_top, default=0)
    top_ids = mx.argsort(-logp, axis=-1)[:, :k]
    return MxLogprobs(token_ids, chosen, mx.take_along_axis(logp, top_ids, axis=-1), top_ids, num_top)
