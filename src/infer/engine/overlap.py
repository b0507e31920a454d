"""The overlap of steps: launch step N+1 before reading step N's tokens, so the host prepares the next
step while the device runs this one.

Invariant: at most one launched step is unread (`InFlight.step`). A row of N+1 whose input token was
sampled by N (still on the device) names N's row in `prev_rows`, and the runner takes the token from
N's device output; every other input is known on the host. The tokens are exactly those of running
without overlap: a request that N ends (EOS, stop string, grammar) wastes its N+1 row, whose token is
dropped when N+1 is read. The engine launches ahead only when nothing needs N's tokens on the host
first (`may_launch_ahead`); structured output reads N between N+1's forward and its sampling
instead (docs/engine.md).
"""

from __future__ import annotations

import numpy as np

from infer.engine.scheduler import ScheduledBatch
from infer.runners.base import LaunchedStep


class InFlight:
    """The launched step whose tokens have not been read yet, if any."""

    def __init__(self) -> None:
        self.step: tuple[ScheduledBatch, LaunchedStep] | None = None

    @staticmethod
    def may_launch_ahead(aborts_queued: bool, needs_history: bool, pooling: bool, speculating: bool) -> bool:
        """Whether the next step may launch before the in-flight one is read: not with an abort to apply
        first, nor while a running request's repetition penalty needs every one of its tokens on the host, nor
        while an embedding request runs (a chunk recomputed after a preemption must know which positions are
        pooled), nor with speculation (drafts are looked up in every known token, and rejected ones are rolled
        back)."""
        return not aborts_queued and not needs_history and not pooling and not speculating

    def prev_rows(self, batch: ScheduledBatch) -> list[int] | None:
        """Per row of `batch`: the in-flight row whose sampled token is this row's last input, or -1."""
        if self.step is None:
            return None
        before = self.step[0]
        d, b = batch.decode, before.decode
        if (d is not None and b is not None and not batch.rows and not before.rows and d.version == b.version
                and len(d.index) and np.array_equal(d.index, b.index)):
            # the same table rows in the same order, each with its in-flight token pending: row i continues row i
            return list(range(len(d.requests)))
        rows = {id(r): i for i, r in enumerate(before.requests)}
        out = [rows[id(r)] if r.pending_tokens else -1 for r in batch.requests]
        return out if any(i >= 0 for i in out) else None

    def take(self) -> tuple[ScheduledBatch, LaunchedStep] | None:
        step, self.step = self.step, None
        return step
