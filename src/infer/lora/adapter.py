"""A PEFT LoRA adapter read from its directory (`adapter_config.json` + `adapter_model.safetensors`) and checked
against the base model: every refusal is a `LoRAError` whose message names the file, tensor or field at fault."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from infer.families.catalog import family
from infer.families.config import ModelConfig

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# PEFT's key of one LoRA matrix: base_model.model.model.layers.3.self_attn.q_proj.lora_A(.adapter name).weight
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
SPLIT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # families whose checkpoints fuse q/k/v, gate/up


class LoRAError(ValueError):
    """An adapter that cannot be served with this model; the message says why."""


def supported_targets(cfg: ModelConfig) -> tuple[str, ...]:
    return FUSED_TARGETS if family(cfg.model_type).fused_projections else SPLIT_TARGETS


def module_shape(cfg: ModelConfig, module: str) -> tuple[int, int]:
    """(out_features, in_features) of one of a layer's projections in the whole (unsharded) model."""
    q, kv, hidden, inner = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, \
        cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "qkv_proj": (q + 2 * kv, hidden),
            "o_proj": (hidden, q), "gate_proj": (inner, hidden), "up_proj": (inner, hidden),
            "gate_up_proj": (2 * inner, hidden), "down_proj": (hidden, inner)}[module]


@dataclass
class LoRAAdapter:
    """An adapter's float32 host weights: (layer, module) -> (A [r, in], B [out, r] with its scaling folded in)."""

    name: str
    path: str
    rank: int  # the largest rank of its modules
    targets: tuple[str, ...]  # the modules it adapts
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)


def read_config(path: Path) -> dict:
    """The adapter's config, checked for what we serve: a plain LoRA (no DoRA, no trained biases or extra modules)."""
    config_file = path / CONFIG
    if not path.is_dir():
        raise LoRAError(f"LoRA adapter path {str(path)!r} is not a directory (expected a PEFT adapter: {CONFIG} + "
                        f"{WEIGHTS})")
    if not config_file.is_file():
        raise LoRAError(f"{path} is not a PEFT adapter: {CONFIG} is missing")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise LoRAError(f"{config_file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise LoRAError(f"{config_file} does not hold a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise LoRAError(f"{config_file}: peft_type {kind!r} is not supported (only LORA adapters are)")
    if config.get("use_dora"):
        raise LoRAError(f"{config_file}: use_dora is not supported (DoRA adapters are refused)")
    if config.get("bias", "none") != "none":
        raise LoRAError(f"{config_file}: bias={config.get('bias')!r} is not supported (adapters that train biases)")
    if config.get("modules_to_save"):
        raise LoRAError(f"{config_file}: modules_to_save={config['modules_to_save']!r} is not supported (only the "
                        "LoRA matrices of the attention and MLP projections are)")
    for name in ("r", "lora_alpha"):
        if not isinstance(config.get(name, 8), (int, float)) or config.get(name, 8) <= 0:
            raise LoRAError(f"{config_file}: {name}={config.get(name)!r} must be a positive number")
    return config


def config_rank(path: Path) -> int:
    """The largest rank an adapter's config declares (r and its rank_pattern)."""
    config = read_config(path)
    return int(max([config.get("r", 8), *(config.get("rank_pattern") or {}).values()]))


def _pattern_value(patterns: dict, module_name: str, default: float) -> float:
    """PEFT's rank_pattern / alpha_pattern: the value of the first key that ends the module's name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


def scaling(config: dict, module_name: str, rank: int) -> float:
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module_name, config.get("lora_alpha", 8))
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def read_adapter(name: str, path: str | Path, cfg: ModelConfig, max_rank: int, load: bool = True) -> LoRAAdapter:
    """Read and check the adapter at `path` for the model `cfg`: its modules among the ones we adapt, its shapes
    the model's (an adapter trained on another base fails here), its ranks at most `max_rank`. Without `load` only
    the file's header is read (the check at registration) and the weights stay empty."""
    path = Path(path)
    config = read_config(path)
    weights_file = path / WEIGHTS
    if not weights_file.is_file():
        raise LoRAError(f"{path} is not a PEFT adapter: {WEIGHTS} is missing (.bin adapters are not read)")
    try:
        with safe_open(str(weights_file), framework="pt") as f:
            tensors = {key: f.get_tensor(key) if load else torch.empty(f.get_slice(key).get_shape(), device="meta")
                       for key in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a truncated or corrupt file
        raise LoRAError(f"{weights_file} cannot be read as safetensors: {exc}") from exc
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    targets = supported_targets(cfg)
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise LoRAError(f"{weights_file}: tensor {key!r} is not a LoRA matrix of a layer's projection (embedding, "
                            f"LM-head and other adapters are not supported; we adapt {', '.join(targets)})")
        layer, module, side = int(m[1]), m[3], m[4]
        if module not in targets:
            raise LoRAError(f"{weights_file}: target module {module!r} is not supported for {cfg.model_type} (we "
                            f"adapt {', '.join(targets)})")
        if layer >= cfg.num_hidden_layers:
            raise LoRAError(f"{weights_file}: {key!r} adapts layer {layer}; the base model has "
                            f"{cfg.num_hidden_layers} layers (an adapter for another base model?)")
        if module in ("gate_proj", "up_proj", "down_proj", "gate_up_proj") and cfg.is_moe(layer):
            raise LoRAError(f"{weights_file}: {key!r} adapts the MLP of layer {layer}, a mixture-of-experts layer "
                            "(adapters on experts are not supported)")
        pairs.setdefault((layer, module), {})[side] = tensor
    if not pairs:
        raise LoRAError(f"{weights_file} holds no LoRA matrices")
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), sides in sorted(pairs.items()):
        where = f"{weights_file}: layer {layer} {module}"
        if set(sides) != {"A", "B"}:
            raise LoRAError(f"{where} has lora_{''.join(sides)} without its lora_{'B' if 'A' in sides else 'A'}")
        a, b = sides["A"], sides["B"]
        n_out, n_in = module_shape(cfg, module)
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != n_in or b.shape[0] != n_out or a.shape[0] != b.shape[1]:
            raise LoRAError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit the base model's "
                            f"projection [{n_out}, {n_in}] (an adapter for another base model?)")
        rank = a.shape[0]
        if rank > max_rank:
            raise LoRAError(f"{where} has rank {rank}, above --max-lora-rank {max_rank}")
        if load:
            scale = scaling(config, f"model.layers.{layer}.{parent_module(module)}.{module}", rank)
            out[(layer, module)] = (a.float(), b.float() * scale)
        else:
            out[(layer, module)] = (a, b)
    rank = max(a.shape[0] for a, _ in out.values())
    targets = tuple(sorted({module for _, module in out}))
    return LoRAAdapter(name, str(path), rank, targets, out if load else {})


def parent_module(module: str) -> str:
    """The submodule of a layer that holds `module` (self_attn or mlp)."""
    return "self_attn" if module in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj") else "mlp"
