"""GGUF loading: config and dequantized tensors equal transformers' GGUF loader on the bundled models; edge cases on tiny synthetic files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from transformers import PreTrainedModel

from infer.loader.gguf_loader import iter_gguf_tensors, read_gguf_config
from infer.loader.model_loader import build_model
from infer.families.config import config_from_hf

BUNDLED = ("smollm2_gguf", "gemma3_gguf")
REFERENCE = {"smollm2_gguf": "hf_smollm2", "gemma3_gguf": "hf_gemma3"}  # session fixtures in conftest
CONFIG_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
    "bos_token_id", "eos_token_id",
)
GEMMA3_FIELDS = ("query_pre_attn_scalar", "sliding_window", "layer_types", "hidden_activation")


@pytest.fixture(scope="module", params=BUNDLED)
def bundled(request: pytest.FixtureRequest) -> tuple[Path, PreTrainedModel]:
    """A bundled GGUF and transformers' float32 model loaded from it (once per module: it takes seconds)."""
    path: Path = request.getfixturevalue(request.param)
    return path, request.getfixturevalue(REFERENCE[request.param])


@pytest.mark.slow
def test_tensors_equal_transformers(bundled: tuple[Path, PreTrainedModel]) -> None:
    path, model = bundled
    reference = model.state_dict()
    ours = dict(iter_gguf_tensors(path))
    assert set(ours) <= set(reference)
    missing = set(reference) - set(ours)
    assert missing <= ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, reference[name]), name


@pytest.mark.slow
def test_config_equals_transformers(bundled: tuple[Path, PreTrainedModel]) -> None:
    path, model = bundled
    ours, theirs = read_gguf_config(path), model.config
    for field in CONFIG_FIELDS:
        assert ours[field] == getattr(theirs, field), field
    rope = theirs.rope_parameters
    if ours["model_type"] == "gemma3_text":
        for field in GEMMA3_FIELDS:
            assert ours[field] == getattr(theirs, field), field
        assert ours["rope_theta"] == rope["full_attention"]["rope_theta"]
        assert ours["rope_local_base_freq"] == rope["sliding_attention"]["rope_theta"]
    else:
        assert ours["rope_theta"] == rope["rope_theta"]
    assert "rope_scaling" not in ours


@pytest.mark.slow
def test_config_builds_model_config(smollm2_gguf: Path, gemma3_gguf: Path) -> None:
    smollm = config_from_hf(read_gguf_config(smollm2_gguf))
    assert (smollm.model_type, smollm.num_key_value_heads, smollm.head_dim) == ("llama", 3, 64)
    assert smollm.tie_word_embeddings and smollm.rope.theta == 100000.0
    gemma = config_from_hf(read_gguf_config(gemma3_gguf))
    assert gemma.model_type == "gemma3_text" and gemma.hidden_act == "gelu_pytorch_tanh"
    assert [gemma.window(i) for i in (0, 5, 6)] == [512, None, 512]
    assert gemma.rope_local.theta == 10000.0 and gemma.rope.theta == 1e6
    model = build_model(gemma, torch.float32, "meta", max_positions=64)
    assert [model.blocks[i].rope_kind for i in (0, 5, 6)] == ["local", "global", "local"]
    assert gemma.attn_scale == 256**-0.5


def _write_gguf(path: Path, arch: str, extra_tensors: dict[str, np.ndarray]) -> Path:
    """A one-layer GGUF with head_dim 128 (so llama3 rope scaling has ramp frequencies) and zero weights."""
    hidden, heads, vocab = 256, 2, 16
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(131072)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(512)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, hidden), np.float32))
    for name, data in extra_tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llamacpp_rope_factors(theta: float, dim: int, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py writes as rope_freqs.weight for a llama3-scaled model."""
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim):
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            factors.append(1.0)
        elif wavelen > orig / low:
            factors.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path: Path) -> None:
    factors = _llamacpp_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    path = _write_gguf(tmp_path / "llama3.gguf", "llama", {"rope_freqs.weight": factors})
    config = read_gguf_config(path)
    assert config["rope_scaling"] == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    rope = config_from_hf(config).rope
    assert (rope.rope_type, rope.factor, rope.low_freq_factor, rope.high_freq_factor) == ("llama3", 8.0, 1.0, 4.0)
    assert [name for name, _ in iter_gguf_tensors(path)] == ["model.embed_tokens.weight"]


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "falcon.gguf", "falcon", {})
    with pytest.raises(ValueError, match=r"'falcon'.*gemma3, llama, phi3, qwen3"):
        read_gguf_config(path)


def test_unknown_tensor_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "moe.gguf", "llama", {"blk.0.ffn_gate_exps.weight": np.zeros((2, 4), np.float32)})
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_exps\.weight'"):
        list(iter_gguf_tensors(path))
