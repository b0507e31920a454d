"""config_from_hf for Mistral and Phi-3: a sliding window on every layer (and only for the families that have one),
LongRoPE from v4 (`rope_scaling`, "su") and v5 (`rope_parameters`) keys with transformers' defaults, partial rope; bad
values are refused naming the field."""

from __future__ import annotations

import math

import pytest

from infer.families.config import ConfigError, config_from_hf

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}


def phi3(**fields: object) -> dict:
    """A Phi-3-mini-128k-shaped config.json (v4 keys) at tiny sizes: head_dim 16, LongRoPE over 8 frequencies."""
    return BASE | {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                   "rope_theta": 10000.0, "sliding_window": 262144,
                   "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}} | fields


@pytest.mark.parametrize("model_type", ["mistral", "phi3"])
def test_a_sliding_window_covers_every_layer(model_type: str) -> None:
    cfg = config_from_hf(BASE | {"model_type": model_type, "sliding_window": 5})
    assert [cfg.window(i) for i in range(3)] == [5, 5, 5]
    assert [config_from_hf(BASE | {"model_type": model_type, "sliding_window": None}).window(i) for i in range(3)] == [
        None, None, None]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_families_without_a_window_ignore_the_field(model_type: str) -> None:
    cfg = config_from_hf(BASE | {"model_type": model_type, "sliding_window": 4096, "use_sliding_window": False})
    assert cfg.sliding_window is None and cfg.window(0) is None


def test_phi3_su_rope_is_longrope_with_transformers_defaults() -> None:
    rope = config_from_hf(phi3()).rope
    assert (rope.rope_type, rope.original_max_position_embeddings, rope.factor) == ("longrope", 4096, 32.0)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert rope.short_factor == (1.0,) * 8 and rope.long_factor == (2.0,) * 8 and rope.rotary_dim(16) == 16


def test_v5_rope_parameters_with_partial_rope_and_an_attention_factor() -> None:
    params = {"rope_type": "longrope", "rope_theta": 250000.0, "partial_rotary_factor": 0.75,
              "original_max_position_embeddings": 4096, "attention_factor": 1.5,
              "short_factor": [1.0] * 6, "long_factor": [3.0] * 6}
    cfg = config_from_hf(phi3(rope_scaling=None, rope_parameters=params, original_max_position_embeddings=None))
    assert (cfg.rope.theta, cfg.rope.attention_factor, cfg.rope.rotary_dim(cfg.head_dim)) == (250000.0, 1.5, 12)
    assert cfg.rope.original_max_position_embeddings == 4096


def test_a_top_level_partial_rotary_factor_applies_to_plain_rope() -> None:
    rope = config_from_hf(phi3(rope_scaling=None, partial_rotary_factor=0.5)).rope
    assert (rope.rope_type, rope.rotary_dim(16)) == ("default", 8)


@pytest.mark.parametrize(("fields", "match"), [
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 7, "long_factor": [2.0] * 8}}, "short_factor"),
    ({"rope_scaling": {"type": "longrope", "long_factor": [2.0] * 8}}, "short_factor"),
    ({"partial_rotary_factor": 0.1}, "partial_rotary_factor=0.1"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
])
def test_bad_rope_values_name_the_field(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_hf(phi3(**fields))
