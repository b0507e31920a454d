"""Prefill and mixed steps as CUDA graphs: one graph per (token bucket, sequence slots) shape over the fixed inputs
of PrefillBuffers, captured at startup; a step replays the smallest shape holding its tokens and sequences.

Each token bucket (powers of two from 16 to the step's token budget, at most 8192) has two tiers of sequence slots: up to SMALL_SLOTS,
for the steps of a few prompts, and up to max_batch_size, for mixed steps with many decode rows. A padding slot
costs attention a few programs per head, so a prompt alone should not pay for 256 of them (measured: a 1k prefill
with the server's 256 slots spent 5.5 ms in padding before those programs exited early, 1.9 ms after; docs/gpu.md).
A graph runs the input-id fix-up and the model to the final hidden states; the LM head runs after the replay on
the sequences' last rows. docs/gpu.md ("Prefill graphs").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infer.runners.cuda_graphs import CudaGraphs, GraphStats
from infer.runners.prefill_buffers import PrefillBuffers, PrefillInputs, PrefillShape

SMALL_SLOTS = 16
MIN_PREFILL_GRAPH_TOKENS = 16
# above this a prefill's host launch time is small next to its GEMMs, and a bucket's activations only cost memory
MAX_PREFILL_GRAPH_TOKENS = 8192

PrefillForward = Callable[[PrefillInputs], tuple[torch.Tensor, torch.Tensor]]


def prefill_bucket_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token buckets of prefill and mixed steps: powers of two from 16 up to max_tokens (at most
    MAX_PREFILL_GRAPH_TOKENS), and that cap itself."""
    top = min(max_tokens, MAX_PREFILL_GRAPH_TOKENS)
    sizes = [1 << i for i in range(top.bit_length()) if MIN_PREFILL_GRAPH_TOKENS <= 1 << i <= top]
    return tuple(sorted({*sizes, top}))


def prefill_shapes(token_sizes: tuple[int, ...], max_batch_size: int) -> tuple[PrefillShape, ...]:
    """Every token bucket with its tiers of sequence slots (a step of T tokens has at most min(T, max_batch_size))."""
    shapes = {PrefillShape(t, min(t, slots, max_batch_size)) for t in token_sizes for slots in (SMALL_SLOTS, t)}
    return tuple(sorted(shapes))


class PrefillGraphs:
    """Captured prefill forwards by shape; `shape` picks a step's, `replay` runs it."""

    def __init__(self, forward: PrefillForward, buffers: PrefillBuffers, shapes: tuple[PrefillShape, ...],
                 device: torch.device, pool: tuple[int, int] | None = None) -> None:
        self.shapes = tuple(sorted(shapes))
        views: dict[PrefillShape, PrefillInputs] = {}

        def pad(shape: PrefillShape) -> None:  # before each capture: the inputs (addresses) the graph reads
            views[shape] = buffers.padding(shape)

        with torch.inference_mode():
            self._graphs = CudaGraphs(lambda shape: forward(views[shape]), self.shapes, device, pool, pad)

    @property
    def stats(self) -> GraphStats:
        return self._graphs.stats

    def shape(self, tokens: int, seqs: int) -> PrefillShape | None:
        """The smallest captured shape holding `tokens` tokens in `seqs` sequences, or None (run eagerly)."""
        return next((s for s in self.shapes if s.tokens >= tokens and s.seqs >= seqs), None)

    def replay(self, shape: PrefillShape) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states [tokens, hidden], input ids [tokens]) of the shape's graph, overwritten by its next
        replay."""
        return self._graphs.replay(shape)
