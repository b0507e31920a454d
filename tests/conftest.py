"""Shared pytest fixtures: paths of the bundled GGUF checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer.loader.gguf_loader import bundled_gemma3_270m, bundled_smollm2


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
