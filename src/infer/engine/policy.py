"""Scheduling policies: when prompts and decodes both wait, which runs next. One class per policy.

The scheduler (scheduler.py) asks a policy two things: whether this step may carry prompt work (`prefills`), and
whether an admission may pass over the head of the waiting queue that does not fit (`overtakes`). Everything else
(the token budget, KV blocks, preemption, the fairness rule that every decode gets a token within
`fairness_steps` steps) is the same under every policy. A new policy is one subclass added to POLICIES.
"""

from __future__ import annotations


class Policy:
    """First come, first served: prompts are admitted in arrival order as they fit; the head is never passed over."""

    def __init__(self, fairness_steps: int) -> None:
        self.fairness_steps = fairness_steps

    def prefills(self, last_had_prefill: bool) -> bool:
        """Whether the next step may run prompt work (admissions, prefill chunks) beside or instead of decodes."""
        return True

    def overtakes(self, head_skips: int) -> bool:
        """Whether admission may go on past a waiting request that does not fit, the head having been passed over
        `head_skips` times in a row."""
        return False


class PrefillFirst(Policy):
    """Admit whatever waiting request fits, passing over a head that does not, at most `fairness_steps` times in a
    row (then the head waits for room like under first come, first served)."""

    def overtakes(self, head_skips: int) -> bool:
        return head_skips < self.fairness_steps


class DecodeRoundRobin(Policy):
    """While requests decode, prompt work runs every other step: a step after one with prefill is decodes only."""

    def prefills(self, last_had_prefill: bool) -> bool:
        return not last_had_prefill


POLICIES: dict[str, type[Policy]] = {"fcfs": Policy, "prefill_first": PrefillFirst,
                                     "decode_round_robin": DecodeRoundRobin}
