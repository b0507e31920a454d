"""Serving metrics each API server records: latency histograms and token/request counters, summed over servers."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from infer.frontend.outputs import StepOutput

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

    def add(self, snapshot: list[Any]) -> None:
        """Add another histogram's `snapshot()` (same buckets) to this one."""
        counts, total, count = snapshot
        self.counts = [a + b for a, b in zip(self.counts, counts)]
        self.total += total
        self.count += count

    def snapshot(self) -> list[Any]:
        return [list(self.counts), self.total, self.count]

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

    def snapshot(self) -> dict[str, Any]:
        """Plain data (msgpack-able) for another process to add up: see `merged`."""
        return {"ttft": self.ttft.snapshot(), "itl": self.itl.snapshot(), "e2e": self.e2e.snapshot(),
                "queue": self.queue.snapshot(), "prompt_tokens": self.prompt_tokens,
                "generation_tokens": self.generation_tokens, "finished": dict(self.finished)}

    @classmethod
    def merged(cls, snapshots: list[dict[str, Any]]) -> ServingMetrics:
        """The sum of several API servers' snapshots."""
        total = cls()
        for snap in snapshots:
            if not snap:
                continue
            for name in ("ttft", "itl", "e2e", "queue"):
                getattr(total, name).add(snap[name])
            total.prompt_tokens += snap["prompt_tokens"]
            total.generation_tokens += snap["generation_tokens"]
            for reason, n in snap["finished"].items():
                total.finished[reason] = total.finished.get(reason, 0) + n
        return total
