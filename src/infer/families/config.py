"""Typed model configuration, read from an HF `config.json` dict (v4 or v5 rope keys) or GGUF metadata."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from infer.families.catalog import SUPPORTED_MODEL_TYPES, Family, family

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ROPE_TYPE_ALIASES = {"su": "longrope"}  # Phi-3's early name for LongRoPE


class ConfigError(ValueError):
    """A model config that infer cannot run; the message names the offending field."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters for one attention kind (Gemma 3 has a local and a global one)."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0  # the share of each head's dims rope rotates (the first ones)
    short_factor: tuple[float, ...] = ()  # LongRoPE: a divisor per frequency while a sequence fits the original context
    long_factor: tuple[float, ...] = ()  # ... and once it is longer
    attention_factor: float = 1.0  # LongRoPE: scales cos and sin, so each rotated q and k dim

    def rotary_dim(self, head_dim: int) -> int:
        """How many of each head's leading dims rope rotates (all of them unless the rope is partial)."""
        return int(head_dim * self.partial_rotary_factor)


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs; family-specific fields have neutral defaults."""

    model_type: str  # a family declared in families/catalog.py
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None  # Gemma 3
    sliding_window: int | None = None  # Gemma 3, Mistral, Phi-3
    layer_types: tuple[str, ...] = ()
    rope_local: RopeConfig | None = None
    final_logit_softcapping: float | None = None
    # a mixture of experts (0 experts: none): which layers are sparse, each token's k experts of num_experts, their
    # intermediate size, and whether the k weights are divided by their sum
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim
        return float(base) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.is_sliding(layer) else None

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]


def _require(d: dict[str, Any], key: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigError(f"config.json: missing required field '{key}'")
    return d[key]


def _rope_from_params(params: dict[str, Any] | None, theta: float, where: str, d: dict[str, Any]) -> RopeConfig:
    """Parse a v4 `rope_scaling` or v5 `rope_parameters` dict into a RopeConfig; `d`, the whole config, holds what v4
    keeps beside it (partial_rotary_factor, Phi-3's original_max_position_embeddings)."""
    params = params or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"config.json: {where}.rope_type={rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 1.0
    base = RopeConfig(theta=float(params.get("rope_theta", theta)), partial_rotary_factor=float(partial))
    if rope_type == "default":
        return base
    if rope_type == "longrope":
        return _longrope(base, params, d)
    factor = float(_require(params, "factor"))
    if rope_type == "linear":
        return replace(base, rope_type="linear", factor=factor)
    return replace(
        base,
        rope_type="llama3",
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _longrope(base: RopeConfig, params: dict[str, Any], d: dict[str, Any]) -> RopeConfig:
    """LongRoPE as transformers reads it: a top-level original_max_position_embeddings wins, the factor defaults to
    max_position_embeddings over it and the attention factor to sqrt(1 + ln(factor) / ln(original))."""
    original = int(d.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or _require(d, "max_position_embeddings"))
    factor = float(params.get("factor") or int(_require(d, "max_position_embeddings")) / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return replace(
        base, rope_type="longrope", factor=factor, original_max_position_embeddings=original,
        short_factor=tuple(float(f) for f in _require(params, "short_factor")),
        long_factor=tuple(float(f) for f in _require(params, "long_factor")), attention_factor=float(attention),
    )


def _parse_ropes(d: dict[str, Any], fam: Family) -> tuple[RopeConfig, RopeConfig | None]:
    """Global (and, for a family with a local rope, local) rope configs from either key style."""
    theta = float(d.get("rope_theta", 10000.0))
    params = d.get("rope_parameters")
    if fam.local_rope:
        local_theta = float(d.get("rope_local_base_freq", 10000.0))
        if params and "full_attention" in params:
            glob = _rope_from_params(params["full_attention"], theta, "rope_parameters.full_attention", d)
            local = _rope_from_params(
                params.get("sliding_attention"), local_theta, "rope_parameters.sliding_attention", d
            )
            return glob, local
        return _rope_from_params(params or d.get("rope_scaling"), theta, "rope_scaling", d), RopeConfig(local_theta)
    return _rope_from_params(params or d.get("rope_scaling"), theta, "rope_scaling", d), None


def _layer_types(d: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    """Which layers slide: the config's layer_types, else every sliding_window_pattern-th layer is full."""
    if d.get("layer_types"):
        types = tuple(d["layer_types"])
        if len(types) != n_layers:
            raise ConfigError(f"config.json: layer_types has {len(types)} entries for {n_layers} layers")
        return types
    pattern = int(d.get("sliding_window_pattern", 6))
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
    )


def _moe_fields(d: dict[str, Any], fam: Family, n_layers: int) -> dict[str, Any]:
    """A mixture of experts' fields, read under the family's config keys."""
    assert fam.moe is not None
    moe = fam.moe
    key = next((key for key in moe.experts_keys if d.get(key)), moe.experts_keys[0])
    experts, k = int(_require(d, key)), int(_require(d, "num_experts_per_tok"))
    if not 0 < k <= experts:
        raise ConfigError(f"config.json: num_experts_per_tok={k} must be between 1 and {key}={experts}")
    step = int(d.get("decoder_sparse_step") or 1)
    dense = set(d.get("mlp_only_layers") or ())
    return dict(num_experts=experts, num_experts_per_tok=k, moe_intermediate_size=int(_require(d, moe.inner_key)),
                norm_topk_prob=True if moe.renormalize_key is None else bool(d.get(moe.renormalize_key, False)),
                moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers)))


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from an HF config.json dict; errors name the field."""
    model_type = _require(d, "model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"config.json: model_type={model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if d.get("use_sliding_window"):
        raise ConfigError("config.json: use_sliding_window=true is not supported for this model type")
    if d.get("attn_logit_softcapping") is not None:
        raise ConfigError("config.json: attn_logit_softcapping is not supported")
    hidden = int(_require(d, "hidden_size"))
    heads = int(_require(d, "num_attention_heads"))
    n_layers = int(_require(d, "num_hidden_layers"))
    fam = family(model_type)
    rope, rope_local = _parse_ropes(d, fam)
    local = fam.local_rope
    window = int(d["sliding_window"]) if (local or fam.sliding_every_layer) and d.get("sliding_window") else None
    act = d.get("hidden_activation") or d.get("hidden_act") or fam.activation
    cfg = ModelConfig(
        model_type=model_type,
        vocab_size=int(_require(d, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_require(d, "intermediate_size")),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or hidden // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope=rope,
        max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", fam.tied_embeddings)),
        attention_bias=bool(d.get("attention_bias", False)),
        hidden_act=act,
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)) if local else None,
        sliding_window=window,
        layer_types=_layer_types(d, n_layers) if local else ("sliding_attention",) * n_layers if window else (),
        rope_local=rope_local,
        final_logit_softcapping=d.get("final_logit_softcapping"),
        **(_moe_fields(d, fam, n_layers) if fam.moe is not None else {}),
    )
    _validate(cfg)
    return cfg


def _validate(cfg: ModelConfig) -> None:
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(
            f"config.json: num_attention_heads={cfg.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={cfg.num_key_value_heads}"
        )
    if cfg.head_dim % 2:
        raise ConfigError(f"config.json: head_dim={cfg.head_dim} must be even for rotary embeddings")
    rotary = cfg.rope.rotary_dim(cfg.head_dim)
    if rotary % 2 or not 0 < rotary <= cfg.head_dim:
        raise ConfigError(f"config.json: partial_rotary_factor={cfg.rope.partial_rotary_factor} rotates {rotary} of "
                          f"head_dim={cfg.head_dim} dims; it must be an even number, at least 2")
    short, long = len(cfg.rope.short_factor), len(cfg.rope.long_factor)
    if cfg.rope.rope_type == "longrope" and {short, long} != {rotary // 2}:
        raise ConfigError(f"config.json: rope_scaling.short_factor and long_factor need {rotary // 2} entries each "
                          f"(one per rotated frequency), got {short} and {long}")
    if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
        raise ConfigError(f"config.json: hidden_act={cfg.hidden_act!r} is not supported")
