"""Log-probabilities of chosen tokens and the most likely alternatives, from the model's raw logits. Imports torch
only to compute them: the API server reads TokenLogprob and MAX_LOGPROBS."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

MAX_LOGPROBS = 20


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first; empty when 0 were asked for


class LogprobTensors(NamedTuple):
    """Logprobs still on the device: computed inside a step, read back at its boundary."""

    token_ids: torch.Tensor  # [N]
    chosen: torch.Tensor  # [N] logprob of token_ids
    top_values: torch.Tensor  # [N, k]
    top_ids: torch.Tensor  # [N, k]
    num_top: list[int]

    def to_host(self) -> list[TokenLogprob]:
        """One TokenLogprob per row (reads the device: call it at the step boundary)."""
        values, ids = self.top_values.tolist(), self.top_ids.tolist()
        return [
            TokenLogprob(int(t), lp, list(zip(ids[i][: self.num_top[i]], values[i][: self.num_top[i]])))
            for i, (t, lp) in enumerate(zip(self.token_ids.tolist(), self.chosen.tolist()))
        ]


def by_sequence(num_seqs: int, rows: list[int], values: list[TokenLogprob]) -> list[TokenLogprob | None]:
    """The logprobs read back for `rows` (the sequences that asked), placed at their rows; None for the others."""
    found: list[TokenLogprob | None] = [None] * num_seqs
    for row, value in zip(rows, values):
        found[row] = value
    return found


def logprob_tensors(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> LogprobTensors:
    """Logprobs of token_ids [N] under logits [N, V], with each row's num_top[i] best tokens; no host sync."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, token_ids.view(-1, 1)).squeeze(1)
    k = max(num_top, default=0)
    top_values, top_ids = (logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long()))
    return LogprobTensors(token_ids, chosen, top_values, top_ids, num_top)

