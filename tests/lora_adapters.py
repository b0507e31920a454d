"""PEFT LoRA adapters for tests and benchmarks: random ones written by peft itself over a tiny checkpoint
(`save_adapter`, with the transformers + peft `reference` model), and random ones written directly in PEFT's layout for
any model shape (`write_random_adapter`: no peft needed, as on the GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_adapter(base: Path, path: Path, rank: int = 8, targets: tuple[str, ...] = ALL_TARGETS, seed: int = 1,
                 alpha: int = 16, use_rslora: bool = False, **extra: object) -> Path:
    """A LoRA adapter for the checkpoint at `base`, written by peft, with random A and B (large enough that its effect
    shows in the logits)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=use_rslora,
                        init_lora_weights=False, **extra)
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    peft_model.save_pretrained(path)
    return path


def reference(base: Path, adapter: Path | None):
    """transformers' model of `base` with the adapter applied by peft (None: the base alone), float32, eval mode."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def module_shapes(hidden: int, inner: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, tuple[int, int]]:
    """(out, in) of a dense layer's seven projections."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
            "gate_proj": (inner, hidden), "up_proj": (inner, hidden), "down_proj": (hidden, inner)}


def write_random_adapter(path: Path, layers: int, shapes: dict[str, tuple[int, int]], rank: int = 16, seed: int = 0,
                         alpha: int = 32, dtype: torch.dtype = torch.bfloat16, scale: float = 0.02) -> Path:
    """A PEFT adapter directory with random rank-`rank` matrices on every module of `shapes` in every layer."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module, (n_out, n_in) in shapes.items():
            parent = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, n_in, generator=gen) * scale).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(n_out, rank, generator=gen) * scale).to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(shapes), "bias": "none",
        "use_rslora": False, "use_dora": False, "task_type": "CAUSAL_LM"}))
    return path
