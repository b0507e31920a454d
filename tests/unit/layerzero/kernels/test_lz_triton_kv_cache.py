"""Triton KV-cache store (interpreted) against the PyTorch reference, including skipped padding slots."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import kv_cache as ref


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("kv_cache")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_store_matches_reference_and_skips_negative_slots(kernels, rng, dtype):
    blocks, block_size, kv_heads, d = 6, 4, 2, 24
    k_cache = torch.randn(blocks, block_size, kv_heads, d, generator=rng).to(dtype)
    v_cache = torch.randn(blocks, block_size, kv_heads, d, generator=rng).to(dtype)
    # key/value sliced out of a fused projection: strided token dimension
    kv = torch.randn(6, 2 * kv_heads * d, generator=rng).to(dtype)
    key, value = kv[:, : kv_heads * d].view(6, kv_heads, d), kv[:, kv_heads * d :].view(6, kv_heads, d)
    slots = torch.tensor([3, -1, 17, 0, -1, 23])
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    kernels.store_kv_cache(key, value, k_cache, v_cache, slots)
    ref.store_kv_cache(key, value, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    flat = k_cache.view(-1, kv_heads, d)
    assert torch.equal(flat[17], key[2]) and torch.equal(flat[23], key[5])


def test_reference_skips_negative_slots(rng):
    k_cache, v_cache = torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4)
    key, value = torch.randn(3, 1, 4, generator=rng), torch.randn(3, 1, 4, generator=rng)
    ref.store_kv_cache(key, value, k_cache, v_cache, torch.tensor([-1, 2, -1]))
    assert torch.equal(k_cache.view(-1, 1, 4)[2], key[1]) and torch.equal(v_cache.view(-1, 1, 4)[2], value[1])
    assert k_cache.count_nonzero() == 4 and v_cache.count_nonzero() == 4


def test_cast_to_cache_dtype(kernels, rng):
    k_cache = torch.zeros(2, 2, 1, 8, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key, value = torch.randn(2, 1, 8, generator=rng), torch.randn(2, 1, 8, generator=rng)
    kernels.store_kv_cache(key, value, k_cache, v_cache, torch.tensor([1, 2]))
    assert torch.equal(k_cache.view(-1, 1, 8)[1:3], key.to(torch.bfloat16))
    assert torch.equal(v_cache.view(-1, 1, 8)[1:3], value.to(torch.bfloat16))
