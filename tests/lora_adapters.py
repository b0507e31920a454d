"""Random PEFT LoRA adapters over the tiny checkpoints (tests/checkpoints.py), written by peft itself, and the
transformers + peft model that serves as their reference."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_adapter(base: Path, path: Path, rank: int = 8, targets: tuple[str, ...] = ALL_TARGETS, seed: int = 1,
                 alpha: int = 16, use_rslora: bool = False, **extra: object) -> Path:
    """A LoRA adapter for the checkpoint at `base` with random A and B (scaled so its effect is visible)."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=use_rslora,
                        init_lora_weights=False, **extra)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    peft_model.save_pretrained(path)
    return path


def reference(base: Path, adapter: Path | None):
    """transformers' model of `base` with the adapter applied by peft (None: the base alone), float32, eval."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()
