"""The MLX runner's KV cache on Metal: sized from unified memory like CUDA's from device memory (the recommended
working set times gpu_memory_utilization, less the weights and the activations), at most what max_batch_size
full-length sequences need; a budget short of one sequence fails at startup naming the field."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from infer.build.mlx_builder import mlx_kv_cache_bytes
from infer.engine.config import EngineConfig, EngineConfigError
from infer.kv.sizing import kv_bytes_per_token
from test_kv_cache_sizing import MODEL

GiB = 2**30


def _config(**fields) -> EngineConfig:
    return EngineConfig(device="cpu", dtype="float16", max_seq_len=4096, **{"max_batch_size": 8, **fields})


def test_the_budget_follows_the_working_set_and_gpu_memory_utilization():
    big = replace(MODEL, num_hidden_layers=64, num_key_value_heads=16, head_dim=128)
    info = {"memory_size": 64 * GiB, "max_recommended_working_set_size": 48 * GiB}
    at_90 = mlx_kv_cache_bytes(_config(max_batch_size=64), big, info, in_use=10 * GiB)
    at_50 = mlx_kv_cache_bytes(_config(max_batch_size=64, gpu_memory_utilization=0.5), big, info, in_use=10 * GiB)
    assert 0 < at_50 < at_90 < 0.9 * 48 * GiB - 10 * GiB
    assert at_90 - at_50 == pytest.approx(0.4 * 48 * GiB)
    need = kv_bytes_per_token(big, torch.float16) * 4096 * 64
    assert at_90 < need  # not capped: the whole budget goes to the cache


def test_at_most_what_the_batch_needs_and_an_explicit_size_wins():
    info = {"memory_size": 64 * GiB, "max_recommended_working_set_size": 48 * GiB}
    need = kv_bytes_per_token(MODEL, torch.float16) * 4096 * 8
    assert mlx_kv_cache_bytes(_config(), MODEL, info, in_use=GiB) == need
    assert mlx_kv_cache_bytes(_config(kv_cache_memory_gb=0.25), MODEL, info, in_use=GiB) == GiB / 4
    assert mlx_kv_cache_bytes(_config(), MODEL, {"memory_size": 16 * GiB}, in_use=GiB) == need  # older MLX


def test_a_budget_short_of_one_sequence_names_the_field():
    big = replace(MODEL, num_hidden_layers=64, num_key_value_heads=16, head_dim=128)
    with pytest.raises(EngineConfigError, match="gpu_memory_utilization=0.9: leaves .* less than one max_seq_len"):
        mlx_kv_cache_bytes(_config(), big, {"max_recommended_working_set_size": 8 * GiB}, in_use=7 * GiB)
