"""layerzero: one explicit API for every kernel an inference model needs (`lz.attention`, `lz.rms_norm`, ...),
with kernel selection that says why (`lz.explain`), policy, a perf database and runtime fallback."""

from __future__ import annotations

import importlib
from typing import Any

from layerzero.api import (
    W8_DTYPES,
    all_gather,
    all_reduce,
    all_reduce_add_rms_norm,
    argmax,
    attention,
    broadcast,
    dequantize,
    detokenize,
    embedding,
    fused_add_rms_norm,
    fused_add_rms_norm_router,
    fused_moe,
    fused_moe_int4,
    fused_moe_routed,
    fused_moe_w8,
    gelu_and_mul,
    layer_norm,
    linear,
    linear_int4,
    linear_w8,
    lora_expand,
    lora_shrink,
    moe_gate,
    moe_route,
    paged_attention,
    paged_prefill_attention,
    quantize,
    rms_norm,
    rope,
    rope_store_kv,
    sample_topk,
    sample_topp,
    silu_and_mul,
    store_kv_cache,
    tokenize,
    varlen_attention,
)
from layerzero.select.context import SelectionContext
from layerzero.select.errors import (
    CudaGraphUnsafeError,
    KernelExecutionError,
    KernelLockError,
    LayerZeroError,
    LayoutError,
    NoKernelFoundError,
)
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import Reason

# name -> module that defines it, imported on first access (so `import layerzero` stays light and never
# depends on an optional part being importable)
_LAZY = {
    "which": "layerzero.tools.inspect",
    "explain": "layerzero.tools.inspect",
    "list_kernels": "layerzero.tools.inspect",
    "validate": "layerzero.tools.inspect",
    "readiness_check": "layerzero.tools.inspect",
    "doctor": "layerzero.tools.doctor",
    "configure": "layerzero.policy.state",
    "load_config": "layerzero.policy.state",
    "lock": "layerzero.policy.state",
    "unlock": "layerzero.policy.state",
    "prefer": "layerzero.policy.state",
    "disabled": "layerzero.policy.state",
    "bind": "layerzero.dispatch.bound",
    "BoundOp": "layerzero.dispatch.bound",
    "plan": "layerzero.dispatch.plan",
    "register_kernel": "layerzero.extend.plugins",
    "tune": "layerzero.perf.tune",
    "warmup": "layerzero.perf.tables",
    "solve": "layerzero.perf.tables",
    "DispatchTable": "layerzero.perf.tables",
    "SelectionReport": "layerzero.select.engine",
    "get_engine": "layerzero.select.engine",
    "get_registry": "layerzero.kernels",
    # for code that builds on the ops: the reference top-k / top-p cut, weight packing and scales, the record of
    # native kernel calls (CPU graphs), and what a kept selection compares (the policy object, the generation)
    "mask_top_k_top_p": "layerzero.kernels.reference.sampling",
    "pack_int4": "layerzero.kernels.reference.quantize",
    "dequantize_int4": "layerzero.kernels.reference.quantize",
    "dequantize_int4_rows": "layerzero.kernels.reference.moe",
    "dequantize_w8": "layerzero.kernels.reference.quantize",
    "expand_block_scales": "layerzero.kernels.reference.quantize",
    "calls_into": "layerzero.kernels.native.build",
    "BF16_GEMV_MAX_ROWS": "layerzero.kernels.native.linear",  # rows the exact bf16-weight GEMV takes on the CPU
    "cpu_bf16_gemm": "layerzero.kernels.onednn",  # whether this CPU multiplies bf16 (else bf16 weights run in float32)
    "KernelCall": "layerzero.kernels.native.build",
    "get_policy": "layerzero.policy.state",
    "GENERATION": "layerzero.select.generation",
}
_RENAMED = {"load_config": "load", "KernelCall": "Call", "BF16_GEMV_MAX_ROWS": "BF16_MAX_ROWS",
            "cpu_bf16_gemm": "bf16_gemm"}


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
    "BF16_GEMV_MAX_ROWS",
    "CudaGraphUnsafeError",
    "KernelExecutionError",
    "KernelLockError",
    "KernelSpec",
    "LayerZeroError",
    "LayoutError",
    "NoKernelFoundError",
    "Reason",
    "SelectionContext",
    "W8_DTYPES",
    "all_gather",
    "all_reduce",
    "all_reduce_add_rms_norm",
    "argmax",
    "attention",
    "broadcast",
    "dequantize",
    "detokenize",
    "embedding",
    "fused_add_rms_norm",
    "fused_add_rms_norm_router",
    "fused_moe",
    "fused_moe_int4",
    "fused_moe_routed",
    "fused_moe_w8",
    "gelu_and_mul",
    "layer_norm",
    "linear",
    "linear_int4",
    "linear_w8",
    "lora_expand",
    "lora_shrink",
    "moe_gate",
    "moe_route",
    "paged_attention",
    "paged_prefill_attention",
    "quantize",
    "rms_norm",
    "rope",
    "rope_store_kv",
    "sample_topk",
    "sample_topp",
    "silu_and_mul",
    "store_kv_cache",
    "tokenize",
    "varlen_attention",
    *_LAZY,
]
