"""A model built for a checkpoint gets its parameters on the meta device; the loader allocates each as it fills it,
so a weight kept quantized is never allocated dense, a tied head stays its embedding, and nothing stays meta."""

from __future__ import annotations

import torch

from checkpoints import quantize_checkpoint, save_tiny
from infer.loader import weights
from infer.loader.model_loader import build_model, load_model, read_config
from infer.models.quant import W8Weight


def test_a_deferred_model_has_meta_parameters_and_real_buffers(tmp_path):
    cfg = read_config(save_tiny("llama", tmp_path / "m"))
    model = build_model(cfg, torch.float32, "cpu", 64, deferred=True)
    assert all(p.is_meta for p in model.parameters())
    assert all(not b.is_meta for b in model.buffers())  # rotary tables are computed at build
    assert not any(p.is_meta for p in build_model(cfg, torch.float32, "cpu", 64).parameters())


def test_weights_kept_8bit_are_never_allocated_dense(tmp_path, monkeypatch):
    path = quantize_checkpoint(save_tiny("qwen3", tmp_path / "m"), tmp_path / "q", "fp8_block", (32, 32))
    allocated: list[str] = []
    dense = weights._Params.dense

    def spy(self, name):
        if self[name].is_meta:
            allocated.append(name)
        return dense(self, name)

    monkeypatch.setattr(weights._Params, "dense", spy)
    model = load_model(path, quantization="auto").model
    kept = {name for name, m in model.named_modules() if isinstance(m, W8Weight)}
    assert len(kept) >= 12 and not kept & set(allocated)
    assert not any(p.is_meta for p in model.parameters())
    assert model.lm_head is model.embed  # Qwen 3 ties its head: one tensor under both names


def test_dequantized_weights_are_allocated_and_filled(tmp_path):
    path = quantize_checkpoint(save_tiny("llama", tmp_path / "m"), tmp_path / "q", "int8_channel")
    model = load_model(path, quantization="none").model
    assert not any(isinstance(m, W8Weight) for m in model.modules())
    assert all(not p.is_meta and torch.isfinite(p).all() for p in model.parameters())
