"""layerzero: one explicit API for every kernel an inference model needs (`lz.attention`, `lz.rms_norm`, ...)."""

from layerzero.api import (
    attention,
    embedding,
    fused_add_rms_norm,
    gelu_and_mul,
    layer_norm,
    linear,
    paged_attention,
    rms_norm,
    rope,
    silu_and_mul,
    store_kv_cache,
    varlen_attention,
)

__all__ = [
    "attention",
    "embedding",
    "fused_add_rms_norm",
    "gelu_and_mul",
    "layer_norm",
    "linear",
    "paged_attention",
    "rms_norm",
    "rope",
    "silu_and_mul",
    "store_kv_cache",
    "varlen_attention",
]
