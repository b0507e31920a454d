"""Log-probabilities of chosen tokens and the most likely alternatives, from the model's raw logits."""

from __future__ import annotations

from typing import NamedTuple

import torch

MAX_LOGPROBS = 20


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first; empty when 0 were asked for


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[TokenLogprob]:
    """One TokenLogprob per row of logits [N, V] for token_ids [N]; row i lists its num_top[i] best tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, token_ids.view(-1, 1)).squeeze(1).tolist()
    k = max(num_top, default=0)
    top_values, top_ids = (logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long()))
    values, ids = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprob(int(t), lp, list(zip(ids[i][: num_top[i]], values[i][: num_top[i]])))
        for i, (t, lp) in enumerate(zip(token_ids.tolist(), chosen))
    ]
