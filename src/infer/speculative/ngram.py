"""Prompt lookup: propose the tokens that followed the most recent earlier occurrence of the sequence's last n tokens.

Summaries, edits and extractions copy long runs from their prompt; where the last n tokens (n from
`prompt_lookup_max` down to `prompt_lookup_min`, longest first) occurred before, what came after them then
is a cheap guess of what comes next. A miss proposes nothing, and the request decodes one token as usual.
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, num_tokens: int, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min ({min_n}) <= max ({max_n})")
        self.num_tokens, self.min_n, self.max_n = num_tokens, min_n, max_n

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to min(num_tokens, limit) draft tokens to follow `tokens` (the prompt and the output so far)."""
        k = min(self.num_tokens, limit)
        if k <= 0 or len(tokens) <= self.min_n:
            return []
        ids = np.asarray(tokens, dtype=np.int64)
        last = len(ids)
        # candidate starts: positions whose token equals the sequence's last token, before the last one
        ends = np.flatnonzero(ids[:-1] == ids[-1])  # an earlier occurrence ends at `end`; its continuation follows
        if not len(ends):
            return []
        for n in range(min(self.max_n, last - 1), self.min_n - 1, -1):
            suffix = ids[last - n :]
            starts = ends - (n - 1)
            starts = starts[starts >= 0]
            if not len(starts):
                continue
            window = ids[starts[:, None] + np.arange(n)]
            found = starts[(window == suffix).all(axis=1)]
            if len(found):
                follow = int(found[-1]) + n  # the most recent match
                return ids[follow : follow + k].tolist()
        return []
