"""PyTorch reference kernels: the always-correct fallback of every op, CPU and CUDA, lowest priority."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from layerzero.kernels.reference import activation, kv_cache, norm
from layerzero.kernels.reference import argmax as argmax_ref
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import rope as rope_ref
from layerzero.kernels.reference import rope_store_kv as rope_kv_ref
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import BACKEND_IMPORT_FAILED, Reason

PRIORITY = 10


def attention(q, k, v, *, causal: bool, scale: float, sliding_window: int | None, layout: str) -> torch.Tensor:
    if layout == "BSHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = attn_ref.attention_bhsd(q, k, v, causal, scale, sliding_window)
    return out.transpose(1, 2) if layout == "BSHD" else out


def varlen_attention(
    q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float,
    sliding_window: int | None, cu_seqlens_host: tuple[Sequence[int], Sequence[int]] | None,
) -> torch.Tensor:
    if cu_seqlens_host is None:
        cu_seqlens_host = (cu_seqlens_q.tolist(), cu_seqlens_k.tolist())
    return attn_ref.varlen_attention(q, k, v, cu_seqlens_host[0], cu_seqlens_host[1], causal, scale, sliding_window)


def paged_attention(
    q, key_cache, value_cache, *, block_tables, context_lens, scale: float, sliding_window: int | None,
    max_context_len: int,
) -> torch.Tensor:
    return attn_ref.paged_attention(q, key_cache, value_cache, block_tables, context_lens, scale, sliding_window,
                                    max_context_len)


def paged_prefill_attention(
    q, key_cache, value_cache, *, block_tables, cu_seqlens_q, context_lens, max_seqlen_q: int, max_context_len: int,
    scale: float, sliding_window: int | None, cu_seqlens_q_host: list[int] | None, context_lens_host: list[int] | None,
) -> torch.Tensor:
    bounds = cu_seqlens_q.tolist() if cu_seqlens_q_host is None else cu_seqlens_q_host
    lens = context_lens.tolist() if context_lens_host is None else context_lens_host
    return attn_ref.paged_prefill_attention(q, key_cache, value_cache, block_tables, bounds, lens, scale,
                                            sliding_window)


def rms_norm(x, weight, *, eps: float, weight_offset: float) -> torch.Tensor:
    return norm.rms_norm(x, weight, eps, weight_offset)


def fused_add_rms_norm(x, residual, weight, *, eps: float, weight_offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    return norm.fused_add_rms_norm(x, residual, weight, eps, weight_offset)


def layer_norm(x, normalized_shape, weight, bias, *, eps: float) -> torch.Tensor:
    weight = None if weight is None else weight.float()  # the reference computes in float32
    bias = None if bias is None else bias.float()
    return norm.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def rope(x, cos, sin, *, interleaved: bool) -> torch.Tensor:
    return rope_ref.rope(x, cos, sin, interleaved)


def gelu_and_mul(x, *, approximate: str) -> torch.Tensor:
    return activation.gelu_and_mul(x, approximate)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, a weight held in another dtype than x (bf16 weights of a float32 CPU model) first cast to x's."""
    if weight.dtype != x.dtype:
        weight, bias = weight.to(x.dtype), None if bias is None else bias.to(x.dtype)
    return F.linear(x, weight, bias)


# op -> (impl, graph_safe). Unsafe: varlen reads cu_seqlens back without host bounds, the KV store (and the
# fused prologue around it) selects its non-padding slots with a boolean index (both synchronize with the device).
_CORE = {
    "attention": (attention, True),
    "varlen_attention": (varlen_attention, False),
    "paged_attention": (paged_attention, True),
    "paged_prefill_attention": (paged_prefill_attention, False),
    "store_kv_cache": (kv_cache.store_kv_cache, False),
    "rope_store_kv": (rope_kv_ref.rope_store_kv, False),
    "rms_norm": (rms_norm, True),
    "fused_add_rms_norm": (fused_add_rms_norm, True),
    "layer_norm": (layer_norm, True),
    "rope": (rope, True),
    "silu_and_mul": (activation.silu_and_mul, True),
    "gelu_and_mul": (gelu_and_mul, True),
    "linear": (linear, True),
    "embedding": (F.embedding, True),
    "argmax": (argmax_ref.argmax, True),
}
# op -> (module under layerzero.kernels.reference, function); these reference modules come with the extra ops.
_EXTRA = {
    "sample_topk": ("sampling", "sample_topk"),
    "sample_topp": ("sampling", "sample_topp"),
    "quantize": ("quantize", "quantize"),
    "dequantize": ("quantize", "dequantize"),
    "linear_int4": ("quantize", "linear_int4"),
    "linear_w8": ("quantize", "linear_w8"),
    "tokenize": ("tokenize", "tokenize"),
    "detokenize": ("tokenize", "detokenize"),
    "all_reduce": ("collectives", "all_reduce"),
    "all_reduce_add_rms_norm": ("collectives", "all_reduce_add_rms_norm"),
    "all_gather": ("collectives", "all_gather"),
    "broadcast": ("collectives", "broadcast"),
    "moe_route": ("moe", "moe_route"),
    "moe_gate": ("moe", "moe_gate"),
    "fused_moe": ("moe", "fused_moe"),
    "fused_add_rms_norm_router": ("moe", "fused_add_rms_norm_router"),
    "fused_moe_routed": ("moe", "fused_moe_routed"),
    "fused_moe_int4": ("moe", "fused_moe_int4"),
    "fused_moe_w8": ("moe", "fused_moe_w8"),
    "lora_shrink": ("lora", "lora_shrink"),
    "lora_expand": ("lora", "lora_expand"),
}


# references with no host sync: a CUDA graph may capture them
_GRAPH_SAFE = frozenset({"sample_topk", "sample_topp", "quantize", "dequantize", "linear_int4", "linear_w8",
                         "all_reduce", "all_reduce_add_rms_norm", "all_gather", "broadcast", "moe_route", "moe_gate",
                         "fused_add_rms_norm_router", "lora_shrink", "lora_expand"})


def _spec(op: str, impl, graph_safe: bool) -> KernelSpec:
    return KernelSpec(kernel_id=f"reference.{op}", op=op, backend="reference", impl=impl, version=torch.__version__,
                      graph_safe=graph_safe, priority=PRIORITY, is_reference=True)


def _unimportable(op: str, module: str, exc: Exception) -> KernelSpec:
    """The op's reference when its module does not import: registered, rejected with the import error."""
    reason = Reason(BACKEND_IMPORT_FAILED, f"layerzero.kernels.reference.{module}: {exc!r}")

    def impl(*args, **kwargs):
        raise ImportError(reason.message)

    return replace(_spec(op, impl, graph_safe=False), available=lambda: reason)


def kernel_specs() -> list[KernelSpec]:
    """One reference spec per op (an op whose reference module fails to import gets a rejected spec)."""
    specs = [_spec(op, impl, safe) for op, (impl, safe) in _CORE.items()]
    for op, (module, name) in _EXTRA.items():
        try:
            impl = getattr(importlib.import_module(f"layerzero.kernels.reference.{module}"), name)
        except (ImportError, AttributeError) as exc:
            specs.append(_unimportable(op, module, exc))
            continue
        specs.append(_spec(op, impl, graph_safe=op in _GRAPH_SAFE))
    return specs
