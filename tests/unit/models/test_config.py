"""config_from_hf for Mistral: a sliding window on every layer (and only for the families that have one)."""

from __future__ import annotations

import pytest

from infer.models.config import config_from_hf

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}


@pytest.mark.parametrize("model_type", ["mistral"])
def test_a_sliding_window_covers_every_layer(model_type: str) -> None:
    cfg = config_from_hf(BASE | {"model_type": model_type, "sliding_window": 5})
    assert [cfg.window(i) for i in range(3)] == [5, 5, 5]
    assert [config_from_hf(BASE | {"model_type": model_type, "sliding_window": None}).window(i) for i in range(3)] == [
        None, None, None]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_families_without_a_window_ignore_the_field(model_type: str) -> None:
    cfg = config_from_hf(BASE | {"model_type": model_type, "sliding_window": 4096, "use_sliding_window": False})
    assert cfg.sliding_window is None and cfg.window(0) is None
