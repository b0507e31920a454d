"""Typed model configuration, read from an HF `config.json` dict (v4 or v5 rope keys) or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SLIDING_EVERY_LAYER = ("mistral",)  # families whose config's sliding_window, when set, covers every layer


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


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs; family-specific fields have neutral defaults."""

    model_type: str  # "llama" | "mistral" | "qwen3" | "gemma3_text"
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
    sliding_window: int | None = None  # Gemma 3, Mistral
    layer_types: tuple[str, ...] = ()
    rope_local: RopeConfig | None = None
    final_logit_softcapping: float | None = None

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim
        return float(base) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.is_sliding(layer) else None


def _require(d: dict[str, Any], key: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigError(f"config.json: missing required field '{key}'")
    return d[key]


def _rope_from_params(params: dict[str, Any] | None, theta: float, where: str) -> RopeConfig:
    """Parse a v4 `rope_scaling` or v5 `rope_parameters` dict into a RopeConfig."""
    if not params:
        return RopeConfig(theta=theta)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"config.json: {where}.rope_type={rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    theta = float(params.get("rope_theta", theta))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    factor = float(_require(params, "factor"))
    if rope_type == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=factor)
    return RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _parse_ropes(d: dict[str, Any], model_type: str) -> tuple[RopeConfig, RopeConfig | None]:
    """Global (and, for Gemma 3, local) rope configs from either key style."""
    theta = float(d.get("rope_theta", 10000.0))
    params = d.get("rope_parameters")
    if model_type == "gemma3_text":
        local_theta = float(d.get("rope_local_base_freq", 10000.0))
        if params and "full_attention" in params:
            glob = _rope_from_params(params["full_attention"], theta, "rope_parameters.full_attention")
            local = _rope_from_params(
                params.get("sliding_attention"), local_theta, "rope_parameters.sliding_attention"
            )
            return glob, local
        return _rope_from_params(params or d.get("rope_scaling"), theta, "rope_scaling"), RopeConfig(local_theta)
    return _rope_from_params(params or d.get("rope_scaling"), theta, "rope_scaling"), None


def _gemma_layer_types(d: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    if d.get("layer_types"):
        types = tuple(d["layer_types"])
        if len(types) != n_layers:
            raise ConfigError(f"config.json: layer_types has {len(types)} entries for {n_layers} layers")
        return types
    pattern = int(d.get("sliding_window_pattern", 6))
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
    )


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from an HF config.json dict; errors name the field."""
    from infer.models.registry import supported_model_types  # late: registry imports model modules

    model_type = _require(d, "model_type")
    if model_type not in supported_model_types():
        raise ConfigError(
            f"config.json: model_type={model_type!r} is not supported "
            f"(supported: {', '.join(supported_model_types())})"
        )
    if d.get("use_sliding_window"):
        raise ConfigError("config.json: use_sliding_window=true is not supported for this model type")
    if d.get("attn_logit_softcapping") is not None:
        raise ConfigError("config.json: attn_logit_softcapping is not supported")
    hidden = int(_require(d, "hidden_size"))
    heads = int(_require(d, "num_attention_heads"))
    n_layers = int(_require(d, "num_hidden_layers"))
    rope, rope_local = _parse_ropes(d, model_type)
    gemma = model_type == "gemma3_text"
    slides = gemma or model_type in SLIDING_EVERY_LAYER
    window = int(d["sliding_window"]) if slides and d.get("sliding_window") else None
    act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
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
        tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
        attention_bias=bool(d.get("attention_bias", False)),
        hidden_act=act,
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)) if gemma else None,
        sliding_window=window,
        layer_types=_gemma_layer_types(d, n_layers) if gemma else ("sliding_attention",) * n_layers if window else (),
        rope_local=rope_local,
        final_logit_softcapping=d.get("final_logit_softcapping"),
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
    if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
        raise ConfigError(f"config.json: hidden_act={cfg.hidden_act!r} is not supported")
