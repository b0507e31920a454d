"""Batched token sampling with per-row parameters held as tensors: one pass serves greedy and sampled rows.

Order of operations follows transformers: repetition penalty, then OpenAI's logit_bias and presence /
frequency penalties and vLLM's min_tokens (sampling/adjust.py), then (sampled rows) temperature, min-p,
top-k, top-p (min-p before top-k/top-p, as vLLM does: top-p measures the mass min-p left), then a
Gumbel-max draw whose noise comes from `random.uniform`, indexed by vocabulary id, so a row's token
depends only on its logits, its parameters, its seed and its step.

Ties. Greedy takes the lowest token id among equal maxima (torch.argmax). Top-k keeps every token whose
logit equals the k-th largest, as transformers' TopKLogitsWarper does, so more than k may survive.
Top-p finds its cut exactly as TopPLogitsWarper does (ascending softmax cumsum, drop positions whose
cumulative mass is <= 1 - top_p, always keep the most likely token) and then keeps every token whose
logit equals the cut value; transformers instead splits such a tie by sort order, keeping an arbitrary
subset of it. Without a tie at the cut the kept sets are identical. Min-p keeps token i while
p_i >= min_p * max p, compared as logit_i - max logit >= log(min_p); ties with the top token always stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import layerzero as lz
from infer.sampling.adjust import LogitAdjustments
from infer.sampling.params import SamplingParams
from infer.sampling.random import uniform
from infer.transfer import upload
from infer.sampling.transforms import BEFORE_GREEDY, SAMPLED_ONLY, check_table, run
from layerzero import mask_top_k_top_p


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device, plus host flags that let common batches skip work."""

    temperature: torch.Tensor  # [B] float32; 0 marks a greedy row
    top_k: torch.Tensor  # [B] int64 in [1, vocab_size]; vocab_size where disabled
    top_p: torch.Tensor  # [B] float32 in (0, 1]
    repetition_penalty: torch.Tensor  # [B] float32 > 0
    seeds: torch.Tensor  # [B] int64 in [0, 2**63)
    steps: torch.Tensor  # [B] int64: tokens the row has generated so far
    all_greedy: bool
    any_top_k_or_p: bool  # some sampled row filters its vocabulary
    any_penalty: bool  # some row has repetition_penalty != 1
    adjust: LogitAdjustments | None = None  # logit_bias, presence / frequency penalties, min_tokens (if any row has one)
    min_p: torch.Tensor | None = None  # [B] float32 in [0, 1] (0: off); None when no sampled row has one

    @property
    def plain_greedy(self) -> bool:
        """Every row takes the logits' argmax as they are: greedy, no penalty, no adjustment (so no row reads its
        seed or step counter)."""
        return self.all_greedy and not self.any_penalty and self.adjust is None

    def per_position(self, width: int) -> SamplingTensors:
        """Each row repeated for `width` consecutive token positions (row-major), its step counter advanced by
        the position: the parameters and noise of the tokens a speculative step decides."""
        def rows(x: torch.Tensor) -> torch.Tensor:
            return x.repeat_interleave(width)

        steps = (self.steps[:, None] + torch.arange(width, device=self.steps.device)).reshape(-1)
        return SamplingTensors(rows(self.temperature), rows(self.top_k), rows(self.top_p), rows(self.repetition_penalty),
                               rows(self.seeds), steps, self.all_greedy, self.any_top_k_or_p, self.any_penalty,
                               None if self.adjust is None else self.adjust.per_position(width),
                               None if self.min_p is None else rows(self.min_p))

    @classmethod
    def from_params(
        cls,
        params: list[SamplingParams],
        seeds: list[int],
        steps: list[int],
        vocab_size: int,
        device: torch.device | str,
    ) -> SamplingTensors:
        """Pack a batch's parameters with two asynchronous host-to-device copies (one float, one int64 block)."""
        if not len(params) == len(seeds) == len(steps):
            raise ValueError(f"params, seeds and steps differ in length: {len(params)}, {len(seeds)}, {len(steps)}")
        top_ks = [vocab_size if p.top_k is None else min(p.top_k, vocab_size) for p in params]
        device = torch.device(device)
        floats = upload(
            [[0.0 if p.greedy else p.temperature for p in params], [p.top_p for p in params],
             [p.repetition_penalty for p in params], [p.min_p for p in params]],
            torch.float32, device,
        )
        ints = upload([top_ks, seeds, steps], torch.int64, device)
        return cls(
            temperature=floats[0],
            top_k=ints[0],
            top_p=floats[1],
            repetition_penalty=floats[2],
            seeds=ints[1],
            steps=ints[2],
            all_greedy=all(p.greedy for p in params),
            any_top_k_or_p=any(filters_vocabulary(p, vocab_size) for p in params),
            any_penalty=any(p.repetition_penalty != 1 for p in params),
            min_p=floats[3] if any(p.cuts_min_p for p in params) else None,
        )


def filters_vocabulary(params: SamplingParams, vocab_size: int) -> bool:
    """Whether a row's top-k or top-p cuts the vocabulary (only sampled rows are filtered)."""
    return not params.greedy and ((params.top_k is not None and params.top_k < vocab_size) or params.top_p < 1)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Penalise seen tokens as transformers does: positive logits divided by the penalty, negative multiplied."""
    factor = penalty[:, None]
    penalised = torch.where(logits < 0, logits * factor, logits / factor)
    return torch.where(seen, penalised, logits)


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit [B, V] outside the row's top-k and then top-p set ([B] tensors; one sort per row).

    The cut is layerzero's reference `mask_top_k_top_p`, shared with the lz.sample_topk / sample_topp ops.
    """
    return mask_top_k_top_p(logits, top_k, top_p)


def filter_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit [B, V] whose probability is below min_p [B] times its row's largest (vLLM's min-p),
    compared in logit space (p_i / p_max = exp(x_i - x_max)), so no softmax; a row with min_p 0 is unchanged."""
    gap = logits - logits.amax(dim=-1, keepdim=True)
    return logits.masked_fill(gap < min_p.log()[:, None], float("-inf"))


_ARGMAX = lz.bind("argmax")  # one call site: selection runs once per logits shape and dtype


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax over the last dim of [rows, V] (first index among equal maxima), as the layerzero argmax op:
    one read of the logits on CUDA, instead of torch's single-block-per-row reduction."""
    return _ARGMAX(logits)


def _repetition_penalty(logits: torch.Tensor, t: SamplingTensors, seen: torch.Tensor | None) -> torch.Tensor:
    if not t.any_penalty:
        return logits
    if seen is None:
        raise ValueError("a row has repetition_penalty != 1 but no seen-token mask was given")
    return apply_repetition_penalty(logits, seen, t.repetition_penalty)


def _temperature(logits: torch.Tensor, t: SamplingTensors, seen: torch.Tensor | None) -> torch.Tensor:
    return logits / t.temperature.masked_fill(t.temperature == 0, 1.0)[:, None]  # greedy rows / 1


TRANSFORMS = check_table({
    "repetition_penalty": _repetition_penalty,
    "adjustments": lambda x, t, seen: x if t.adjust is None else t.adjust.apply(x, t.steps),
    "temperature": _temperature,
    "min_p": lambda x, t, seen: x if t.min_p is None else filter_min_p(x, t.min_p),
    "top_k_top_p": lambda x, t, seen: filter_top_k_top_p(x, t.top_k, t.top_p) if t.any_top_k_or_p else x,
})


def penalized(logits: torch.Tensor, t: SamplingTensors, seen: torch.Tensor | None) -> torch.Tensor:
    """The logits every row reads, greedy ones included (sampling/transforms.py: BEFORE_GREEDY)."""
    return run(BEFORE_GREEDY, TRANSFORMS, logits, t, seen)


def scaled_logits(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """What sampled rows draw from (sampling/transforms.py: SAMPLED_ONLY)."""
    return run(SAMPLED_ONLY, TRANSFORMS, logits, t)


def gumbel_log_e(t: SamplingTensors, vocab: int) -> torch.Tensor:
    """log E per row and token, E = -log U ~ Exp(1) from the rows' counter-based noise: argmax(x - log E) draws
    from softmax(x) (Gumbel-max, the exponential race)."""
    return uniform(t.seeds, t.steps, vocab).log_().neg_().log_()


def sample(logits: torch.Tensor, t: SamplingTensors, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Next token id per row (int64 [B]) from logits [B, V] in any float dtype, in float32 math; no host sync,
    graph-capturable. Plain greedy rows read the logits as they are: widening them changes no argmax."""
    if t.plain_greedy:
        return argmax_rows(logits)
    logits = penalized(logits.float(), t, seen)
    greedy_tokens = argmax_rows(logits)
    if t.all_greedy:
        return greedy_tokens
    sampled_tokens = argmax_rows(scaled_logits(logits, t) - gumbel_log_e(t, logits.shape[-1]))
    return torch.where(t.temperature == 0, greedy_tokens, sampled_tokens)
