"""OpenAI's logit_bias, presence and frequency penalties and vLLM's min_tokens, applied to a step's logits.

For row b and token j: mu[j] + bias[j] - c[j] * frequency - (c[j] > 0) * presence, where c[j] counts j among
the tokens the row has generated (OpenAI's definitions; the prompt does not count). A bias of -100 bans the
token (-inf). While a row has generated fewer than min_tokens tokens, its held ids (the end-of-sequence
tokens) are at -inf. The slots keep the sum of the first three terms as one offset per row and token, updated
where a token is sampled (sampling/slots.py), so a step adds it with one gather and one add; everything stays
on the device: no host sync, no per-step upload.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infer.sampling.params import LOGIT_BIAS_LIMIT, SamplingParams

MAX_HELD_IDS = 8  # end-of-sequence ids min_tokens can hold back per row


@dataclass
class LogitAdjustments:
    """A step's per-row adjustments; a part is None when no row of the step needs it."""

    min_tokens: torch.Tensor  # [B] int64
    offset: torch.Tensor | None = None  # [B, V] float32: bias minus the penalties so far (-inf where banned)
    held: torch.Tensor | None = None  # [B, MAX_HELD_IDS] int64: ids at -inf while steps < min_tokens

    def per_position(self, width: int) -> LogitAdjustments:
        """Each row repeated for `width` consecutive positions (a speculative step's rows)."""
        def rows(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.repeat_interleave(width, dim=0)

        return LogitAdjustments(rows(self.min_tokens), rows(self.offset), rows(self.held))  # type: ignore[arg-type]

    def apply(self, logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The adjusted logits [B, V] (a new tensor); `steps` [B]: tokens each row has generated."""
        out = logits + self.offset if self.offset is not None else logits.clone()
        if self.held is not None:
            holding = (steps < self.min_tokens)[:, None].expand_as(self.held)
            out.scatter_(1, self.held, torch.where(holding, float("-inf"), out.gather(1, self.held)))
        return out


def bias_row(logit_bias: dict[int, float], vocab_size: int) -> tuple[list[int], list[float]]:
    """(ids, values) of a request's bias inside the vocabulary, -100 (the floor) as -inf."""
    items = [(t, -float("inf") if v <= -LOGIT_BIAS_LIMIT else v) for t, v in sorted(logit_bias.items()) if t < vocab_size]
    return [t for t, _ in items], [v for _, v in items]


def held_row(held_ids: tuple[int, ...], vocab_size: int) -> list[int] | None:
    """A row of MAX_HELD_IDS ids (the first repeated as padding), or None when nothing is held."""
    ids = [t for t in held_ids if 0 <= t < vocab_size]
    if len(ids) > MAX_HELD_IDS:
        raise ValueError(f"min_tokens can hold back at most {MAX_HELD_IDS} end-of-sequence ids, got {len(ids)}")
    return ids + [ids[0]] * (MAX_HELD_IDS - len(ids)) if ids else None


def reference_logits(logits: torch.Tensor, params: SamplingParams, generated: list[int],
                     held_ids: tuple[int, ...] = ()) -> torch.Tensor:
    """One row's adjusted logits [V] in float64, straight from the definitions (the tests' reference)."""
    out = logits.to(torch.float64).clone()
    for token, value in (params.logit_bias or {}).items():
        out[token] = -float("inf") if value <= -LOGIT_BIAS_LIMIT else out[token] + value
    for token in set(generated):
        out[token] -= generated.count(token) * params.frequency_penalty + params.presence_penalty
    if len(generated) < params.min_tokens:
        for token in held_ids:
            out[token] = -float("inf")
    return out
