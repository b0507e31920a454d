"""KV-cache store: scatter new keys/values into a paged cache at flat slot indices."""

import torch


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]; slot = block * block_size + offset.

    Tokens with a negative slot (padding) are skipped. Selecting them is a boolean index, which
    synchronizes with a CUDA device: the Triton store is the graph-safe implementation.
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    flat_k.index_copy_(0, slots, key[keep].to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value[keep].to(value_cache.dtype))
