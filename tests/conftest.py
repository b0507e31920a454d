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
