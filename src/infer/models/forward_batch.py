"""The plain attention-metadata object a model receives: no engine, scheduler or server types."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

KVCache = tuple[torch.Tensor, torch.Tensor]


def cu_seqlens(lengths: list[int]) -> list[int]:
    """Sequence boundaries of packed tokens: [0, l0, l0 + l1, ...]."""
    return [0, *itertools.accumulate(lengths)]


@dataclass
class ForwardBatch:
    """Packed tokens of one step.

    Prefill: each sequence's new tokens (cu_seqlens_q delimits them) are the last of its context_lens
    cached positions and attend to all of them through the block tables: a whole prompt, a chunk after
    earlier chunks or a cached prefix, or a decode row in a mixed step. Decode: one token per sequence
    attends over the paged cache from fixed buffers. With kv_caches=None the forward is a pure
    recomputation of whole prompts from position 0 (no cache read or write).
    """

    is_prefill: bool
    positions: torch.Tensor  # [T] int64
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    cu_seqlens_q_host: list[int]  # the same boundaries on the host (no device read-back needed)
    max_seqlen_q: int
    context_lens: torch.Tensor  # [B] int32: tokens in cache after this step
    max_context_len: int
    context_lens_host: list[int] | None = None  # the same on the host (prefill over the paged cache)
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32
    slot_mapping: torch.Tensor | None = None  # [T] int64
    kv_caches: list[KVCache] | None = None
    lora_ids: torch.Tensor | None = None  # [T] int64: each token's LoRA adapter slot, -1 for none (None: no adapters)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    def signature(self, input_ids: torch.Tensor) -> tuple:
        """Every fact of a forward's inputs that shapes the model's calls: equal signatures mean equal shapes,
        strides, dtypes and host values at every layerzero call site (what `lz.plan` is promised)."""
        def meta(t: torch.Tensor | None) -> tuple | None:
            return None if t is None else (t.shape, t.stride(), t.dtype, t.device)

        caches = None if self.kv_caches is None else (len(self.kv_caches), meta(self.kv_caches[0][0]))
        return (meta(input_ids), self.is_prefill, meta(self.positions), meta(self.cu_seqlens_q), self.max_seqlen_q,
                meta(self.context_lens), self.max_context_len, self.context_lens_host is None, meta(self.block_tables),
                meta(self.slot_mapping), caches, meta(self.lora_ids))

    @property
    def last_token_indices(self) -> torch.Tensor:
        """Row of each sequence's last new token in the packed batch (where logits are read)."""
        return self.cu_seqlens_q[1:].long() - 1

    @classmethod
    def for_prompts(cls, lengths: list[int], device: torch.device | str = "cpu") -> "ForwardBatch":
        """A cache-free prefill batch of whole prompts (tests, debugging, full recomputation)."""
        bounds = cu_seqlens(lengths)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(device)
        return cls(
            is_prefill=True,
            positions=positions,
            cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32, device=device),
            cu_seqlens_q_host=bounds,
            max_seqlen_q=max(lengths),
            context_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
            max_context_len=max(lengths),
        )
