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
        ({"quantization": "awq"}, "quantization"),
        ({"use_chunked_prefill": True, "batching_mode": "static"}, "use_chunked_prefill"),
        ({"use_prefix_caching": True, "kv_cache_backend": "contiguous"}, "use_prefix_caching"),
        ({"use_prefix_caching": True, "use_chunked_prefill": False}, "use_prefix_caching"),
        ({"prefill_chunk_size": 0}, "prefill_chunk_size"),
        ({"max_prefill_chunks_per_step": 0}, "max_prefill_chunks_per_step"),
        ({"use_cuda_graphs": True, "kv_cache_backend": "contiguous"}, "use_cuda_graphs"),
        ({"speculative_method": "eagle"}, "speculative_method"),
        ({"num_speculative_tokens": 4}, "num_speculative_tokens"),
        ({"speculative_method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"speculative_method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"speculative_method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
        ({"speculative_method": "ngram", "draft_model": "/x"}, "draft_model"),
        ({"speculative_method": "draft"}, "speculative_method"),
        ({"chat_template": "/no/such/template.jinja"}, "chat_template"),
        ({"generation_config": "/no/such/folder"}, "generation_config"),
        ({"speculative_method": "draft", "draft_model": "/no/such/drafter"}, "draft_model"),
        ({"speculative_method": "ngram", "kv_cache_backend": "contiguous"}, "speculative_method"),
    ],
)
def test_invalid_or_incompatible_options_name_the_field(options: dict, field: str):
    with pytest.raises(EngineConfigError, match=f"^{field}="):
        EngineConfig(**options)


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"use_cuda_graphs": True, "device": "cpu"}, "use_cuda_graphs", "requires a CUDA device"),
    ],
)
def test_compatible_but_unbuilt_features_are_refused_clearly(options: dict, field: str, message: str):
    with pytest.raises(EngineConfigError, match=f"^{field}=.*{message}"):
        EngineConfig(**options)


def test_defaults_are_valid_and_continuous():
    config = EngineConfig()
    assert config.batching_mode == "continuous" and config.scheduler_policy == "fcfs"
    assert config.use_chunked_prefill and config.use_prefix_caching
    assert config.max_batch_size == (256 if config.resolved_device.startswith("cuda") else 32)
    static = EngineConfig(batching_mode="static")
    assert not static.use_chunked_prefill and not static.use_prefix_caching
    assert not EngineConfig(kv_cache_backend="contiguous").use_prefix_caching
    assert EngineConfig(device="cuda").max_batch_size == 256 and EngineConfig(device="cuda", max_batch_size=8).max_batch_size == 8
    assert config.max_num_batched_tokens == max(8192, config.max_seq_len)


def test_speculation_defaults_to_four_drafts_with_a_method():
    assert EngineConfig().speculative_tokens == 0
    assert EngineConfig(speculative_method="ngram").speculative_tokens == 4
    assert EngineConfig(speculative_method="ngram", num_speculative_tokens=7).speculative_tokens == 7


def test_a_chat_template_file_that_does_not_compile_is_refused_naming_the_field_and_line(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[0].content }\n")
    with pytest.raises(EngineConfigError, match=r"chat_template=.*bad\.jinja, line 1"):
        EngineConfig(chat_template=str(bad))


def test_device_auto_without_a_gpu_driver_is_the_cpu_without_importing_torch(monkeypatch) -> None:
    """No GPU driver node: "auto" is the CPU, decided without torch (the launcher, which hosts API server 0, then
    never loads it); where the devices module cannot be certain, torch is asked."""
    import subprocess
    import sys

    from infer.engine import devices

    code = ("import sys; from infer.engine import config, devices; "
            "devices.GPU_DRIVER_NODES = ('/nonexistent/nvidiactl',); "
            "print(config.EngineConfig().resolved_device, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["cpu", "False"]
    import torch

    monkeypatch.setattr(devices, "certain_cuda_devices", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert EngineConfig().resolved_device == "cuda"
