"""The draft-model method's side of scheduling: it reserves room for k drafts per row; the tokens themselves are
made on the device inside the step by the runner's drafter (infer/runners/drafter.py), so they never wait for the host."""

from __future__ import annotations


class DraftModelProposer:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """min(num_tokens, limit) placeholder drafts (zeros): the drafter writes the real ones in the step."""
        return [0] * max(0, min(self.num_tokens, limit))
