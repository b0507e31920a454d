"""Reading PEFT adapters: what is served (ranks, scaling with and without rsLoRA, rank and alpha patterns, fused
projections) and what is refused, each refusal naming the file and the reason."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from infer.families.config import ModelConfig, RopeConfig
from infer.lora.adapter import LoRAError, config_rank, read_adapter
from lora_adapters import module_shapes, write_random_adapter

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope=RopeConfig(theta=10000.0))
SHAPES = module_shapes(32, 48, 4, 2, 8)


def _adapter(tmp_path, **config):
    path = write_random_adapter(tmp_path / "ad", 2, SHAPES, rank=4, dtype=torch.float32)
    if config:
        cfg = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    return path


def test_a_valid_adapter_is_read_with_its_scaling_folded_into_b(tmp_path):
    path = _adapter(tmp_path)
    adapter = read_adapter("x", path, CFG, max_rank=16)
    assert adapter.rank == 4 and set(adapter.targets) == set(SHAPES) and len(adapter.weights) == 14
    from safetensors.torch import load_file

    raw = load_file(str(path / "adapter_model.safetensors"))
    a, b = adapter.weights[(1, "down_proj")]
    torch.testing.assert_close(a, raw["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"])
    torch.testing.assert_close(b, raw["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"] * 32 / 4)
    rs = read_adapter("x", _adapter(tmp_path / "rs", use_rslora=True), CFG, 16)
    torch.testing.assert_close(rs.weights[(0, "q_proj")][1], adapter.weights[(0, "q_proj")][1] * 4 / 32 * 32 / 2)
    patterned = read_adapter("x", _adapter(tmp_path / "p", alpha_pattern={"q_proj": 8}), CFG, 16)
    torch.testing.assert_close(patterned.weights[(0, "q_proj")][1], adapter.weights[(0, "q_proj")][1] / 4)
    assert config_rank(_adapter(tmp_path / "r", rank_pattern={"q_proj": 12})) == 12


def _corrupt(path):
    data = (path / "adapter_model.safetensors").read_bytes()
    (path / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "adapter_config.json").unlink(), "adapter_config.json is missing"),
    (lambda p: (p / "adapter_model.safetensors").unlink(), "adapter_model.safetensors is missing"),
    (lambda p: (p / "adapter_config.json").write_text("{not json"), "not valid JSON"),
    (_corrupt, "cannot be read as safetensors"),
    (lambda p: _config(p, use_dora=True), "use_dora"),
    (lambda p: _config(p, bias="all"), "bias"),
    (lambda p: _config(p, modules_to_save=["lm_head"]), "modules_to_save"),
    (lambda p: _config(p, peft_type="PREFIX_TUNING"), "peft_type"),
    (lambda p: _tensors(p, {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)}), "embedding, LM-head"),
    (lambda p: _tensors(p, {"base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32),
                            "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4)}),
     "layer 5; the base model has 2 layers"),
    (lambda p: _tensors(p, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 33),
                            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4)}),
     "do not fit the base model"),
    (lambda p: _tensors(p, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)}),
     "without its lora_B"),
    (lambda p: _tensors(p, {"base_model.model.model.layers.0.mlp.fc1.lora_A.weight": torch.zeros(4, 32)}),
     "target module 'fc1' is not supported"),
])
def test_bad_adapters_are_refused_naming_the_problem(tmp_path, damage, message):
    path = _adapter(tmp_path)
    damage(path)
    with pytest.raises(LoRAError, match=message.replace("(", r"\(").replace(".", r"\.")):
        read_adapter("x", path, CFG, max_rank=16)


def test_a_rank_above_the_limit_and_a_missing_directory_are_refused(tmp_path):
    with pytest.raises(LoRAError, match="rank 4, above --max-lora-rank 2"):
        read_adapter("x", _adapter(tmp_path), CFG, max_rank=2)
    with pytest.raises(LoRAError, match="is not a directory"):
        read_adapter("x", tmp_path / "nowhere", CFG, max_rank=16)


def _config(path, **fields):
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, **fields}))


def _tensors(path, tensors):
    save_file(tensors, str(path / "adapter_model.safetensors"))


def test_scaling_helpers_follow_peft():
    from infer.lora.adapter import scaling

    assert scaling({"lora_alpha": 16}, "model.layers.0.self_attn.q_proj", 8) == 2
    assert math.isclose(scaling({"lora_alpha": 16, "use_rslora": True}, "m.q_proj", 16), 4)
    assert scaling({"lora_alpha": 16, "alpha_pattern": {"v_proj": 4}}, "model.layers.0.self_attn.v_proj", 4) == 1
