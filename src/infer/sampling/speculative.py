"""Verifying drafted tokens against the target model on the device: the longest accepted run, then one token of
the target's own, with the output distribution exactly that of plain sampling (docs/speculative.md).

A row with k drafts x_1..x_k has target logits at k+1 positions. Greedy rows accept x_j while it equals the
target's argmax. Sampled rows use the standard rejection rule: accept x_j with probability min(1, p(x_j)/q(x_j))
(p the target's filtered distribution, q the drafter's; one-hot for n-gram drafts), compared with a float64
draw; the first rejected position takes a sample of normalize(max(p - q, 0)), and a row that accepts all k takes
a sample of p at position k+1. Every draw comes from the counter-based noise of the token index it decides, so a
seeded request is reproducible whatever shares its batch, and a row with no drafts samples exactly as `sample`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from infer.sampling.random import uniform64
from infer.sampling.sampler import SamplingTensors, argmax_rows, gumbel_log_e, penalized, scaled_logits


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(p - q, 0), unnormalized: what a rejected position samples from (the Gumbel draw needs no normalizing)."""
    return (p - q).clamp_(min=0)


def verify(
    logits: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor, t: SamplingTensors,
    draft_probs: torch.Tensor | None = None, seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B, K+1], counts [B]): row b emits tokens[b, :counts[b]] (accepted drafts, then the target's token).

    logits [B, K+1, V] float32: position j scores the token after the row's j-th input. drafts [B, K] int64
    (entries past num_drafts[b] are ignored); draft_probs [B, K, V] the drafter's distributions (None: one-hot
    drafts, as n-gram lookup proposes them). `seen` [B, V]: repetition-penalty masks (rows with a penalty draft
    nothing). No host sync.
    """
    rows, width, vocab = logits.shape
    k = width - 1
    at = t.per_position(width)  # row b * width + j: the parameters and noise of the token position j decides
    flat = penalized(logits.reshape(rows * width, vocab), at, None if seen is None else seen.repeat_interleave(width, 0))
    target = argmax_rows(flat).view(rows, width)  # greedy rows: the target's token at every position
    accept = drafts == target[:, :k]
    positions = torch.arange(k, device=logits.device)[None, :]
    if not t.all_greedy:
        greedy = (t.temperature == 0)[:, None]
        scaled = scaled_logits(flat, at)
        log_e = gumbel_log_e(at, vocab)  # the same draw as plain sampling of that token
        plain = argmax_rows(scaled - log_e).view(rows, width)
        if k:
            p = scaled.view(rows, width, vocab)[:, :k].to(torch.float64).softmax(dim=-1)
            q = (torch.nn.functional.one_hot(drafts, vocab).to(torch.float64) if draft_probs is None
                 else draft_probs.to(torch.float64))
            ratio = p.gather(-1, drafts[..., None]).squeeze(-1) / q.gather(-1, drafts[..., None]).squeeze(-1)
            u = uniform64(at.seeds, at.steps).view(rows, width)[:, :k]
            rest = residual(p, q).log_().view(rows * k, vocab) - log_e.view(rows, width, vocab)[:, :k].reshape(rows * k, vocab)
            corrected = argmax_rows(rest).view(rows, k)
            # a sampled row's token where its run stops: the residual's sample at a rejected draft, p's past its drafts
            plain[:, :k] = torch.where(positions < num_drafts[:, None], corrected, plain[:, :k])
            accept = torch.where(greedy, accept, u < ratio)
        target = torch.where(greedy, target, plain)
    accepted = (accept & (positions < num_drafts[:, None])).to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # leading run
    last = target.gather(1, accepted[:, None])
    tokens = torch.cat([drafts, drafts.new_zeros(rows, 1)], dim=1) if k else drafts.new_zeros(rows, 1)
    tokens.scatter_(1, accepted[:, None], last)
    return tokens, accepted + 1


_DRAFT_SEED_SALT = 0x2C1B3C6D5E4F7A89  # the drafter's noise: a stream apart from the target's for the same token index


def draft_sample(logits: torch.Tensor, t: SamplingTensors, offset: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(draft tokens [R], the drafter's distributions q [R, V] or None when every row is greedy) from the drafter's
    logits [R, V] for the token index `offset` past each row's counter. Greedy rows take the argmax; sampled rows
    draw from softmax of their tempered logits filtered by min-p, top-k and top-p, which is the q that `verify`
    divides by."""
    if t.all_greedy:
        return argmax_rows(logits), None
    at = replace(t, seeds=t.seeds ^ _DRAFT_SEED_SALT, steps=t.steps + offset)
    scaled = scaled_logits(logits, at)
    sampled = argmax_rows(scaled - gumbel_log_e(at, logits.shape[-1]))
    return torch.where(t.temperature == 0, argmax_rows(logits), sampled), scaled.softmax(dim=-1)
