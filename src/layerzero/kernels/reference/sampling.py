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
and keeps every token equal to the cut value. Both cuts are `mask_top_k_top_p`, which infer's batched
sampler (infer.sampling.sampler) also uses with per-row k and p tensors.
"""

from __future__ import annotations

import torch


def mask_top_k_top_p(
    logits: torch.Tensor,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """`logits` [..., V] with every entry outside its row's top-k set, then top-p set, at -inf; one sort per row.

    k and p are scalars for every row or tensors of shape logits.shape[:-1] (per row); None skips that cut.
    Tensor-only (no host sync), so it runs inside CUDA graphs. With both cuts, top-p is taken over the
    top-k survivors renormalised (transformers' order).
    """
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    ascending = logits.sort(dim=-1).values
    if top_k is not None:
        if isinstance(top_k, torch.Tensor):
            kth_largest = ascending.gather(-1, (vocab - top_k).clamp(min=0).unsqueeze(-1))
        else:
            kth_largest = ascending[..., max(vocab - top_k, 0), None]
        if top_p is None:
            return logits.masked_fill(logits < kth_largest, float("-inf"))
        ascending = ascending.masked_fill(ascending < kth_largest, float("-inf"))
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    # A scalar p stays a Python float here: 1 - p rounded once, as float32(1 - p), not float32(1) - float32(p).
    dropped_mass = (1 - top_p).unsqueeze(-1) if isinstance(top_p, torch.Tensor) else 1 - top_p
    # Entries masked by top-k have zero mass, so they are counted here and the cut is never below kth_largest.
    n_dropped = (cumulative <= dropped_mass).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
    cut = ascending.gather(-1, n_dropped)
    return logits.masked_fill(logits < cut, float("-inf"))


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
    filtered = mask_top_k_top_p(_scaled(logits, temperature), top_k=k)
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
    filtered = mask_top_k_top_p(_scaled(logits, temperature), top_p=p)
    return _gumbel_argmax(filtered, _uniform(logits, generator, noise))
