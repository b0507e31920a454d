"""KV-cache sizing: bytes per token and the block layout for paged or contiguous mode."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from infer.kv.kv_manager import blocks_needed
from infer.families.config import ModelConfig


class DType(Protocol):
    """An element type as sizing reads it (a torch.dtype): bytes per element, so block accounting needs no torch."""

    @property
    def itemsize(self) -> int: ...


class KVLayout(NamedTuple):
    num_blocks: int
    block_size: int


def kv_bytes_per_token(cfg: ModelConfig, dtype: DType) -> int:
    """2 (K and V) * layers * kv_heads * head_dim * bytes per element."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize


def kv_layout(
    cfg: ModelConfig,
    dtype: DType,
    backend: str,
    block_size: int,
    max_seq_len: int,
    max_batch_size: int,
    num_blocks: int | None,
    memory_bytes: float,
    draft: ModelConfig | None = None,
) -> KVLayout:
    """Contiguous = one max_seq_len block per slot; paged = as many blocks as the memory budget holds (with a
    draft model, each block holds its KV too: the drafter's cache uses the target's blocks)."""
    if backend == "contiguous":
        block_size = max_seq_len
        if num_blocks is None:
            num_blocks = min(max_batch_size, int(memory_bytes // (kv_bytes_per_token(cfg, dtype) * max_seq_len)))
    elif num_blocks is None:
        per_token = kv_bytes_per_token(cfg, dtype) + (kv_bytes_per_token(draft, dtype) if draft is not None else 0)
        num_blocks = int(memory_bytes // (per_token * block_size))
    minimum = blocks_needed(max_seq_len, block_size)
    if num_blocks < minimum:
        raise ValueError(
            f"KV cache of {num_blocks} blocks cannot hold one max_seq_len={max_seq_len} sequence "
            f"({minimum} blocks of {block_size}); raise kv_cache_memory_gb or lower max_seq_len"
        )
    return KVLayout(num_blocks, block_size)
