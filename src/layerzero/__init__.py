"""layerzero: one explicit API for every kernel an inference model needs (`lz.attention`, `lz.rms_norm`, ...),
with kernel selection that says why (`lz.explain`), policy, a perf database and runtime fallback."""

from __future__ import annotations

import importlib
from typing import Any

from layerzero.api import (
    attention,
    dequantize,
    detokenize,
    embedding,
    fused_add_rms_norm,
    gelu_and_mul,
    layer_norm,
    linear,
    linear_int4,
    paged_attention,
    paged_prefill_attention,
    quantize,
    rms_norm,
    rope,
    sample_topk,
    sample_topp,
    silu_and_mul,
    store_kv_cache,
    tokenize,
    varlen_attention,
)
from layerzero.context import SelectionContext
from layerzero.errors import (
    CudaGraphUnsafeError,
    KernelExecutionError,
    KernelLockError,
    LayerZeroError,
    LayoutError,
    NoKernelFoundError,
)
from layerzero.kernel_spec import KernelSpec
from layerzero.reasons import Reason
from layerzero.tune import tune  # eager: a lazy `tune` would be shadowed by the submodule of the same name

# name -> module that defines it, imported on first access (so `import layerzero` stays light and never
# depends on an optional part being importable)
_LAZY = {
    "which": "layerzero.inspect",
    "explain": "layerzero.inspect",
    "list_kernels": "layerzero.inspect",
    "validate": "layerzero.inspect",
    "readiness_check": "layerzero.inspect",
    "doctor": "layerzero.doctor",
    "configure": "layerzero.policy",
    "load_config": "layerzero.policy",
    "lock": "layerzero.policy",
    "unlock": "layerzero.policy",
    "prefer": "layerzero.policy",
    "disabled": "layerzero.policy",
    "register_kernel": "layerzero.plugins",
    "warmup": "layerzero.dispatch_table",
    "solve": "layerzero.dispatch_table",
    "DispatchTable": "layerzero.dispatch_table",
    "SelectionReport": "layerzero.selection",
    "get_engine": "layerzero.selection",
    "get_registry": "layerzero.registry",
}
_RENAMED = {"load_config": "load"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerzero' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CudaGraphUnsafeError",
    "KernelExecutionError",
    "KernelLockError",
    "KernelSpec",
    "LayerZeroError",
    "LayoutError",
    "NoKernelFoundError",
    "Reason",
    "SelectionContext",
    "attention",
    "dequantize",
    "detokenize",
    "embedding",
    "fused_add_rms_norm",
    "gelu_and_mul",
    "layer_norm",
    "linear",
    "linear_int4",
    "paged_attention",
    "paged_prefill_attention",
    "quantize",
    "rms_norm",
    "rope",
    "sample_topk",
    "sample_topp",
    "silu_and_mul",
    "store_kv_cache",
    "tokenize",
    "tune",
    "varlen_attention",
    *_LAZY,
]
