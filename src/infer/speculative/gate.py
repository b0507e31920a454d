"""Speculation only while the batch is small enough for it to pay (vLLM's `speculative_disable_by_batch_size`).

Verifying drafts makes each request's step K + 1 rows wide; a lone request has compute to spare for them, a full
batch does not. On 2 CPU cores with the bundled model, n-gram drafting (K=4) on a copy task cut throughput from
2 requests on: 151 -> 89 tok/s at 2, 221 -> 120 at 4, 317 -> 168 at 8 (docs/speculative.md), so by default it
stops while 2 or more requests run there; on an H100 batch 32 still gained 1.22-1.37x at full acceptance, so on
CUDA it drafts at every batch size unless told otherwise.
"""

from __future__ import annotations

from typing import Protocol


class Proposer(Protocol):
    def propose(self, tokens: list[int], limit: int) -> list[int]: ...


class BatchGatedProposer:
    """`inner`'s drafts while fewer than `disable_at` requests run (`running` is the scheduler's own list)."""

    def __init__(self, inner: Proposer, running: list, disable_at: int) -> None:
        self.inner = inner
        self.running = running
        self.disable_at = disable_at

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        if len(self.running) >= self.disable_at:
            return []  # the request decodes one token, as after a lookup miss
        return self.inner.propose(tokens, limit)


def gate_speculation(scheduler, disable_at: int) -> None:  # scheduler: infer.engine.scheduler.Scheduler
    """Wrap an n-gram scheduler's proposer so it drafts only below `disable_at` running requests (0: always)."""
    from infer.speculative.ngram import NgramProposer

    if disable_at > 0 and isinstance(scheduler.proposer, NgramProposer):
        scheduler.proposer = BatchGatedProposer(scheduler.proposer, scheduler.running, disable_at)
