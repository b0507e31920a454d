"""Top-k and top-p sampling references: filter the logits, then draw one token per row by Gumbel-max.

Signatures (the canonical kernel signatures of the `sample_topk` / `sample_topp` ops):

    sample_topk(logits[..., V], k: int, *, temperature: float = 1.0,
                generator: torch.Generator | None = None, noise: Tensor[..., V] | None = None) -> int64 [...]
    sample_topp(logits[..., V], p: float, *, temperature: float = 1.0,
                generator: torch.Generator | None = None, noise: Tensor[..., V] | None = None) -> int64 [...]

The draw is argmax(logits / temperature - log(-log U)) over the kept tokens, with U uniform in (0, 1):
`noise` gives U directly (same shape as logits, values in (0, 1)); otherwise U comes from
`torch.rand(..., generator=generator)`. Either way the result is a pure function of the logits and the
noise, so a seeded generator or a given noise tensor makes the call deterministic.

Ties: top-k keeps every token whose logit equals the k-th largest (more than k may survive). Top-p sorts
ascending, drops tokens whose cumulative softmax mass is <= 1 - p, always keeps the most likely token,
and keeps every token equal to the cut value.
"""

from __future__ import annotations

import torch


def _uniform(logits: torch.Tensor, generator: torch.Generator | None, noise: torch.Tensor | None) -> torch.Tensor:
    if noise is None:
        return torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    if noise.shape != logits.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} must equal logits shape {tuple(logits.shape)}")
    return noise.to(torch.float32)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits.float() / temperature


def _gumbel_argmax(filtered: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    # argmax(x - log E) with E = -log U ~ Exp(1) draws from softmax(x) (the exponential race).
    return (filtered - uniform.log().neg().log()).argmax(dim=-1)


def sample_topk(
    logits: torch.Tensor,
    k: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row drawn from softmax(logits / temperature) restricted to the top-k logits."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    scaled = _scaled(logits, temperature)
    k = min(k, scaled.shape[-1])
    kth_largest = scaled.topk(k, dim=-1).values[..., -1:]
    filtered = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    return _gumbel_argmax(filtered, _uniform(logits, generator, noise))


def sample_topp(
    logits: torch.Tensor,
    p: float,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row drawn from the smallest set of most likely tokens whose mass reaches p."""
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    scaled = _scaled(logits, temperature)
    ascending = scaled.sort(dim=-1).values
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    n_dropped = (cumulative <= 1 - p).sum(dim=-1, keepdim=True).clamp(max=scaled.shape[-1] - 1)
    cut = ascending.gather(-1, n_dropped)
    filtered = scaled.masked_fill(scaled < cut, float("-inf"))
    return _gumbel_argmax(filtered, _uniform(logits, generator, noise))
