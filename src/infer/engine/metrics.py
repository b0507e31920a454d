"""Serving metrics the engine thread records: latency histograms and token/request counters."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from infer.engine.request import StepOutput

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram in the Prometheus sense (le = upper bound)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*map(str, self.buckets), "+Inf"), self.counts):
            running += n
            out.append((bound, running))
        return out


@dataclass
class ServingMetrics:
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue: Histogram = field(default_factory=Histogram)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason

    def observe(self, out: StepOutput, now: float, submitted: float, last_token: float | None) -> None:
        """Record one output of a request submitted at `submitted` whose previous token came at `last_token`."""
        if out.queue_seconds is not None:
            self.queue.observe(out.queue_seconds)
        if out.token_id is not None:
            self.generation_tokens += 1
            if last_token is None:
                self.ttft.observe(now - submitted)
            else:
                self.itl.observe(now - last_token)
        if out.finished:
            self.prompt_tokens += out.prompt_tokens
            self.e2e.observe(now - submitted)
            reason = out.finish_reason or "unknown"
            self.finished[reason] = self.finished.get(reason, 0) + 1
