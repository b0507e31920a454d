"""The CPU's default KV cache: 1 GiB, or what max_batch_size full-length sequences need when that is less."""

from __future__ import annotations

from dataclasses import replace

from infer.build.rank_runner import CPU_KV_CACHE_BYTES, kv_cache_bytes
from infer.engine.config import EngineConfig
from infer.kv.sizing import kv_bytes_per_token
from infer.families.config import ModelConfig, RopeConfig

MODEL = ModelConfig(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                    rope=RopeConfig(theta=10000.0), max_position_embeddings=4096)


def test_a_small_batch_and_context_get_only_what_they_need():
    config = EngineConfig(device="cpu", max_seq_len=256, max_batch_size=4)
    need = kv_bytes_per_token(MODEL, config.torch_dtype) * 256 * 4
    assert kv_cache_bytes(config, MODEL) == need < CPU_KV_CACHE_BYTES


def test_the_default_is_capped_at_1_gib_and_an_explicit_size_wins():
    big = replace(MODEL, num_hidden_layers=64, num_key_value_heads=16, head_dim=128)
    assert kv_cache_bytes(EngineConfig(device="cpu"), big) == CPU_KV_CACHE_BYTES
    assert kv_cache_bytes(EngineConfig(device="cpu", kv_cache_memory_gb=0.5, max_seq_len=256), MODEL) == 2**29
