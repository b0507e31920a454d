"""One info line per start-up phase with its seconds (`infer serve` and `LLM` alike), so a slow start says where
its time went: the core process's interpreter and imports, the weights, the KV cache, each kind of CUDA graph with
its count, the warm-up, the API servers."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer.runners.torch_runner import TorchRunner

log = logging.getLogger("infer.startup")


def phase(name: str, seconds: float, detail: str = "") -> None:
    log.info("start-up: %s in %.2fs%s", name, seconds, f" ({detail})" if detail else "")


class Clock:
    """Seconds since the last `lap` (or since it was made)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        return seconds


def runner_phases(runner: TorchRunner, seconds: float) -> None:
    """The runner's construction as its phases: the KV cache and buffers, then each kind of graph it captured."""
    kinds = [("prefill", runner.prefill_graph_stats), ("decode", runner.graph_stats),
             *((f"{bound}-key decode", stats) for bound, stats in runner.short_graph_stats.items())]
    graphs = [(kind, stats) for kind, stats in kinds if stats is not None and stats.batch_sizes]
    captured = sum(stats.capture_seconds for _, stats in graphs)
    kv_bytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in runner.kv_caches)
    phase("KV cache allocated", seconds - captured,
          f"{runner.num_blocks} blocks of {runner.block_size} tokens, {kv_bytes / 2**30:.2f} GiB")
    for kind, stats in graphs:
        phase(f"{kind} graphs captured", stats.capture_seconds, f"{len(stats.batch_sizes)} graphs")
