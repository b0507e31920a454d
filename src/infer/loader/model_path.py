"""Where a model is read from: the path the user named, or the bundled SmolLM2 GGUF. Imports no torch: `infer
serve` asks before it starts the engine."""

from __future__ import annotations

from pathlib import Path

from infer.loader.gguf_file import bundled_smollm2


def resolve_model_path(model: str | None) -> Path:
    """None means the bundled SmolLM2-135M-Instruct GGUF."""
    return bundled_smollm2() if model is None else Path(model).expanduser()
