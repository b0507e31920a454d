"""EngineConfig: the seed's compatibility rules and field-named errors."""

from __future__ import annotations

import pytest

from infer.engine.config import EngineConfig, EngineConfigError


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"batching_mode": "dynamic"}, "batching_mode"),
        ({"scheduler_policy": "lifo"}, "scheduler_policy"),
        ({"fairness_steps": 1}, "fairness_steps"),
        ({"max_waiting_requests": 0}, "max_waiting_requests"),
        ({"quantization": "int4"}, "quantization"),
        ({"use_chunked_prefill": True, "batching_mode": "static"}, "use_chunked_prefill"),
        ({"use_prefix_caching": True, "kv_cache_backend": "contiguous"}, "use_prefix_caching"),
        ({"use_prefix_caching": True, "use_chunked_prefill": False}, "use_prefix_caching"),
        ({"prefill_chunk_size": 0}, "prefill_chunk_size"),
        ({"max_prefill_chunks_per_step": 0}, "max_prefill_chunks_per_step"),
        ({"use_cuda_graphs": True, "kv_cache_backend": "contiguous"}, "use_cuda_graphs"),
        ({"use_speculative_decoding": True}, "use_speculative_decoding"),
    ],
)
def test_invalid_or_incompatible_options_name_the_field(options: dict, field: str):
    with pytest.raises(EngineConfigError, match=f"^{field}="):
        EngineConfig(**options)


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"use_cuda_graphs": True, "device": "cpu"}, "use_cuda_graphs", "requires a CUDA device"),
        ({"quantization": "fp8"}, "quantization", "not implemented yet"),
    ],
)
def test_compatible_but_unbuilt_features_are_refused_clearly(options: dict, field: str, message: str):
    with pytest.raises(EngineConfigError, match=f"^{field}=.*{message}"):
        EngineConfig(**options)


def test_defaults_are_valid_and_continuous():
    config = EngineConfig()
    assert config.batching_mode == "continuous" and config.scheduler_policy == "fcfs"
    assert config.use_chunked_prefill and not config.use_prefix_caching
    assert not EngineConfig(batching_mode="static").use_chunked_prefill
    assert config.max_num_batched_tokens == max(8192, config.max_seq_len)
