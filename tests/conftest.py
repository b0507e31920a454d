"""Shared pytest fixtures: paths of the bundled GGUF checkpoints; on CUDA, a fixed KV cache per engine; NaN-filled
fresh tensors, for kernels that must not read what they did not write."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.loader.gguf_file import bundled_gemma3_270m, bundled_smollm2


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Llama architecture, byte-level BPE tokenizer), Q4_1."""
    return bundled_smollm2()


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M (SentencePiece BPE tokenizer), Q4_K_M; assembled from its package's chunks on first use."""
    return bundled_gemma3_270m()


def _hf_gguf_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf: Path):
    """transformers' float32 model from the bundled SmolLM2 GGUF: the reference, loaded once per session."""
    return _hf_gguf_model(smollm2_gguf)


@pytest.fixture(scope="session")
def hf_gemma3(gemma3_gguf: Path):
    """transformers' float32 model from the bundled Gemma 3 270M GGUF (slow to parse: loaded once per session)."""
    return _hf_gguf_model(gemma3_gguf)


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_gguf: Path):
    """One LLM on the bundled SmolLM2 for every test that drives the engine end to end."""
    from infer import LLM

    return LLM(str(smollm2_gguf), max_seq_len=1024)


@pytest.fixture(autouse=True)
def _fixed_cuda_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test process holds several engines at once. On CUDA an engine without kv_cache_memory_gb sizes its cache
    from what gpu_memory_utilization leaves of the device, so the first would leave the next none: here each takes
    1 GiB instead (engine-core processes the tests start are alone on the device and size it as served)."""
    import infer.build.rank_runner as rank_runner

    sized = rank_runner.kv_cache_bytes

    def fixed(config, model):  # type: ignore[no-untyped-def]
        cuda = config.resolved_device.startswith("cuda")
        return float(2**30) if cuda and config.kv_cache_memory_gb is None else sized(config, model)

    monkeypatch.setattr(rank_runner, "kv_cache_bytes", fixed)


@pytest.fixture
def nan_fresh_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """`torch.empty` returns floating tensors filled with NaN (others as they come), so a kernel's read of a slot no
    kernel wrote shows in its output."""
    real_empty = torch.empty

    def nan_empty(*shape, **kw):  # type: ignore[no-untyped-def]
        out = real_empty(*shape, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", nan_empty)
